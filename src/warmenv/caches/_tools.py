"""The tools `warmenv run --cache TOOL` knows: the public modules of warmenv.caches that can.

A tool module `warmenv run` can drive provides, beside its in-process `use()`:

- `async restore(env, cache_dir)` and `async capture(env, cache_dir)`, whose
  reports read as lines (`str()`) and are attrs classes (for `--json`);
- `settings(cache_dir) -> dict[str, str]`: the environment variables that
  point a process of the tool at `cache_dir` with its trap fixed;
- `CACHE_DIR_VARIABLE`: the tool's own variable naming its cache directory;
- optionally `notes(environ, uncached) -> list[str]`: what the user should
  know after a process of the tool ran under those variables and left
  `uncached` misses out of its cache, by its own counters (each said once,
  a line);
- optionally `REQUIRES`: the package the tool's facts are read from
  (installed by the extra of the tool's name). `warmenv run` refuses a tool whose
  package is missing beside warmenv, in one line with the hint: its facts
  would say "not installed" and its cache would be filed where nothing hits;
- optionally, how the command's hits are counted (`_children.py`):
  `trees()`, the tool's trees under this machine's facts (the parts its
  hook reports hits in), the part whose namespace counts its misses
  (`MISSES_PART`, `files` if not given), and the hook, as `ENTRY_POINTS`
  (`EntryPoint`s the tool loads from a distribution written for the
  command) or `COUNTING` (`Variable`s naming a class the tool loads, unless
  the user set them).

The modules are found by listing the package, so a new tool is one new
module; none of them imports its compiler at import time.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio.to_thread
import attrs

import warmenv.caches
from warmenv._facts import PREFIX, is_captured_tree
from warmenv._install import install_hint
from warmenv.caches._children import hook_variables
from warmenv.caches._hookdir import HookHome
from warmenv.caches._paths import UnsafeTargetError
from warmenv.caches._tree import record_hits
from warmenv.environment import Environment

__all__ = ["Counting", "Tool", "available_tools", "counting", "counts_lookups", "tool"]

_REQUIRED = ("restore", "capture", "settings", "CACHE_DIR_VARIABLE")


@attrs.frozen
class Tool:
    """One compiler as `warmenv run` drives it, from the outside of its process."""

    name: str
    module: ModuleType

    async def restore(self, env: Environment, cache_dir: Path) -> Any:
        return await self.module.restore(env, cache_dir)

    async def capture(self, env: Environment, cache_dir: Path) -> Any:
        return await self.module.capture(env, cache_dir)

    def settings(self, cache_dir: Path) -> dict[str, str]:
        return dict(self.module.settings(cache_dir))

    def counting(self, environ: Mapping[str, str], home: HookHome) -> dict[str, str]:
        """The variables under which the command's processes count this tool's hits
        (its hooks written in `home`)."""
        entry_points = getattr(self.module, "ENTRY_POINTS", ())
        variables = getattr(self.module, "COUNTING", ())
        return hook_variables(self.name, entry_points, variables, environ, home)

    async def record_served(
        self, env: Environment, served: Mapping[str, Mapping[str, int]], misses: int = 0
    ) -> int:
        """Count the command's hits per entry (by tree part) and its misses in `env`'s statistics.

        The misses go to the tree of the part the tool looks its entries up by
        (`MISSES_PART`, else `files`).
        """
        trees = getattr(self.module, "trees", None)
        chosen = () if trees is None else await anyio.to_thread.run_sync(trees)  # reads metadata
        known = {tree.part: tree for tree in chosen}
        looked_up = str(getattr(self.module, "MISSES_PART", "files"))
        counted = 0
        for part, hits in served.items():
            if part in known and hits:
                counted += await record_hits(env, known[part], hits)
        if misses and looked_up in known:
            await record_hits(env, known[looked_up], {}, misses)
        return counted

    def notes(self, environ: Mapping[str, str], uncached: int) -> list[str]:
        notes = getattr(self.module, "notes", None)
        return [] if notes is None else list(notes(environ, uncached))

    @property
    def cache_dir_variable(self) -> str:
        return str(self.module.CACHE_DIR_VARIABLE)

    def missing(self) -> str | None:
        """Why the tool cannot be driven from this Python (its package is absent), or `None`."""
        package = getattr(self.module, "REQUIRES", None)
        if package is None or importlib.util.find_spec(package) is not None:
            return None
        return (
            f"--cache {self.name} needs {package} installed beside warmenv (its version decides "
            f"which entries can hit): {install_hint(self.name)}"
        )


@attrs.frozen
class Counting:
    """The variables under which `warmenv run`'s command counts its hits, or why it cannot."""

    variables: dict[str, str]
    unable: UnsafeTargetError | OSError | None = None
    """Why the hooks could not be kept (`variables` is then empty): the command runs
    uncounted, rather than not at all."""


def counting(tools: Sequence[Tool], environ: Mapping[str, str], home: HookHome) -> Counting:
    """The variables that let the command's processes count the hits of `tools`, their
    hooks written in `home`.

    Counting is a report, not the job: where the hooks cannot be kept from
    other users (a directory above the user cache that others can write) or
    written at all (a read-only home), none is installed and `unable` says why.
    """
    found: dict[str, str] = {}
    try:
        for t in tools:
            found.update(t.counting({**environ, **found}, home))
    except (UnsafeTargetError, OSError) as error:
        return Counting({}, error)
    return Counting(found)


@functools.cache
def available_tools() -> tuple[str, ...]:
    """The tools `warmenv run` can drive, by name."""
    found = []
    for info in pkgutil.iter_modules(warmenv.caches.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"warmenv.caches.{info.name}")
        if all(hasattr(module, name) for name in _REQUIRED):
            found.append(info.name)
    return tuple(sorted(found))


def tool(name: str) -> Tool:
    """The tool named, or `LookupError` naming those there are."""
    if name not in available_tools():
        raise LookupError(f"unknown cache tool {name!r}: use one of {', '.join(available_tools())}")
    return Tool(name, importlib.import_module(f"warmenv.caches.{name}"))


@functools.cache
def _counting_tools() -> frozenset[str]:
    return frozenset(name for name in available_tools() if hasattr(tool(name).module, "hits"))


def counts_lookups(namespace: str) -> bool:
    """Whether the hits and misses of `namespace` are counted (`warmenv stats`).

    Every store counts its own; a compiler cache's are counted from its
    tool's own counters, so only for the tools warmenv reads them from
    (those with `hits()`): a tree captured with the generic directory form
    (`warmenv.caches.directory`, any other tool) has no counters.
    """
    if not is_captured_tree(namespace):
        return True
    return namespace.removeprefix(PREFIX).partition("/")[0] in _counting_tools()
