"""The tools `warmenv run --cache TOOL` knows: the public modules of warmenv.caches.

A tool module provides `tree()` (its `CacheTree` under this machine's
facts), `settings(cache_dir)` (the environment variables that point a
process of the tool at `cache_dir` with its trap fixed),
`CACHE_DIR_VARIABLE` (the tool's own variable naming its cache directory)
and `INSTALL_HINT`. The modules are found by listing the package, so a new
tool is one new module; none of them imports its compiler at import time.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import attrs

import warmenv.caches
from warmenv.caches._tree import CacheTree

__all__ = ["Tool", "available_tools", "tool"]

_NOT_TOOLS = frozenset({"directory"})


@attrs.frozen
class Tool:
    """One compiler as `warmenv run` drives it, from the outside of its process."""

    name: str
    module: ModuleType

    def tree(self) -> CacheTree:
        made = self.module.tree()
        assert isinstance(made, CacheTree)
        return made

    def settings(self, cache_dir: Path) -> dict[str, str]:
        return dict(self.module.settings(cache_dir))

    @property
    def cache_dir_variable(self) -> str:
        return str(self.module.CACHE_DIR_VARIABLE)


def available_tools() -> tuple[str, ...]:
    found = pkgutil.iter_modules(warmenv.caches.__path__)
    return tuple(
        sorted(m.name for m in found if not m.name.startswith("_") and m.name not in _NOT_TOOLS)
    )


def tool(name: str) -> Tool:
    """The tool named, or `LookupError` naming those there are."""
    if name not in available_tools():
        raise LookupError(f"unknown cache tool {name!r}: use one of {', '.join(available_tools())}")
    return Tool(name, importlib.import_module(f"warmenv.caches.{name}"))
