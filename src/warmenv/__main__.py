"""`python -m warmenv` runs the command line."""

from warmenv.cli import entry_point

entry_point()
