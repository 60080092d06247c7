# PYTHON_ARGCOMPLETE_OK (`python -m` completion, as for the `warmenv` script)
"""`python -m warmenv` runs the command line."""

from warmenv.cli import entry_point

entry_point()
