"""The version of warmenv, written in this one place.

Read by hatchling when the package is built (`[tool.hatch.version]` in
pyproject.toml), re-exported as `warmenv.__version__`, and shown by
`warmenv --version`, which imports it from here rather than from the
package root it belongs under.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.2.0.dev0"
