"""Numba's on-disk cache (`@njit(cache=True)`), carried so that it hits on another machine.

What is captured: the index (`.nbi`) and data (`.nbc`) files under
`NUMBA_CACHE_DIR`; on restore every index is written after the data files
it names, so a Numba process reading the cache as it fills never finds an
index whose entries are missing.

What decides a hit: Numba keys an entry by the function's source (a digest
of the file's content), its signature and the target (LLVM triple, CPU name
and features), with one file per Python version; the namespace's facts are
the `numba` and `llvmlite` versions, `python` and the `cpu`.

The trap fixed: Numba files a function's cache in the subdirectory
`<parent>_<sha1(absolute source directory)>`, so the same code at another
path (another checkout, container or CI runner) looks elsewhere and misses.
`use()` and `warmenv run --cache numba` install a locator
(`NUMBA_CACHE_LOCATOR_CLASSES`, see `_numba_plugin.Locator`) that files it
under the module's name instead.

    import warmenv.caches.numba
    warmenv.caches.numba.use()  # before importing the modules with cache=True functions

Numba decides where a function is cached when it is decorated, so `use()`
must run before the modules defining cached functions are imported.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Final

import anyio.to_thread

from warmenv._facts import Facts
from warmenv._fs import expand_home
from warmenv._install import install_hint
from warmenv.caches._home import default_cache_dir as _default_cache_dir
from warmenv.caches._inprocess import EnvironmentChoice, Tally, Warmed, restored
from warmenv.caches._restore import restore_made
from warmenv.caches._tree import CacheTree, CaptureReport, RestoreReport
from warmenv.caches._tree import capture as _capture
from warmenv.environment import Environment

__all__ = [
    "FACTS",
    "LOCATOR",
    "REQUIRES",
    "capture",
    "configure",
    "default_cache_dir",
    "hits",
    "restore",
    "served",
    "settings",
    "subdirectory",
    "tree",
    "trees",
    "use",
]

FACTS: Final = ("numba", "llvmlite", "python", "cpu")
LOCATOR: Final = "warmenv.caches._numba_plugin.Locator"
CACHE_DIR_VARIABLE: Final = "NUMBA_CACHE_DIR"
REQUIRES: Final = "numba"
"""The package this tool's facts are read from: `warmenv run --cache numba` needs it here."""


def tree() -> CacheTree:
    """The tree Numba's cache is captured as, under this machine's facts."""
    return CacheTree("numba", Facts.here(*FACTS), index=("*.nbi",))


def trees() -> tuple[CacheTree, ...]:
    """Every tree of Numba's cache (the one), for `warmenv run`'s counting of its command's hits."""
    return (tree(),)


async def restore(env: Environment, cache_dir: str | Path) -> RestoreReport:
    """Write the Numba cache captured under this machine's facts into `cache_dir`."""
    return await restore_made(env, tree, cache_dir)  # its facts read on a worker thread


async def capture(env: Environment, cache_dir: str | Path) -> CaptureReport:
    """Store Numba's cache directory `cache_dir` into `env`."""
    return await _capture(env, await anyio.to_thread.run_sync(tree), cache_dir)  # facts: files


def default_cache_dir(env: EnvironmentChoice = None, *, root: str | Path | None = None) -> Path:
    """`<root>/<environment>.caches/numba`: `env`'s own (the configured environment and
    root by default), beside its database file; never shared with another environment,
    whose capture would take this one's files (`caches/_home.py`)."""
    return _default_cache_dir("numba", env, root)


def settings(cache_dir: str | Path) -> dict[str, str]:
    """The environment variables that point a Numba process at `cache_dir`, the trap fixed."""
    return {"NUMBA_CACHE_DIR": str(cache_dir), "NUMBA_CACHE_LOCATOR_CLASSES": LOCATOR}


def configure(cache_dir: str | Path) -> None:
    """Point this process's Numba at `cache_dir` with the path-independent locator (imports Numba).

    Functions decorated before this call keep the locator they were given.
    """
    chosen = settings(cache_dir)
    os.environ.update(chosen)  # for child processes, and for a reload of Numba's config
    config = _import_numba()
    config.CACHE_DIR = chosen["NUMBA_CACHE_DIR"]
    config.CACHE_LOCATOR_CLASSES = chosen["NUMBA_CACHE_LOCATOR_CLASSES"]


def use(
    env: EnvironmentChoice = None,
    *,
    root: str | Path | None = None,
    cache_dir: str | Path | None = None,
    capture_at_exit: bool = True,
) -> Warmed:
    """Restore Numba's cache from `env` and point Numba at it, before cached functions exist.

    `env`: an environment's name (default: the configured one) or an open
    `warmenv.blocking` environment. `cache_dir` defaults to
    `<root>/<environment>.caches/numba`, the environment's own (`default_cache_dir`).
    With `capture_at_exit`, what this process compiled is captured into the
    environment when the interpreter exits.
    """
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir(env, root=root)
    directory = expand_home(directory, "cache_dir")
    _import_numba()
    warmed = restored("numba", tree(), directory, env, root, tally)
    configure(directory)
    if capture_at_exit:
        warmed.capture_at_exit()
    return warmed


def subdirectory(py_func: Any, py_file: str) -> str:
    """Where under the cache directory `Locator` files a function: its module's name."""
    module = getattr(py_func, "__module__", None) or "__main__"
    if module == "__main__":
        parent = os.path.basename(os.path.dirname(os.path.abspath(py_file)))
        module = f"__main__.{parent}"
    return module.replace(os.sep, "_")


def _index_key(py_func: Any) -> str:
    """The relative path of a function's index file, as Numba names it under `Locator`."""
    source = inspect.getfile(py_func)
    module = os.path.splitext(os.path.basename(source))[0]
    qualname = getattr(py_func, "__qualname__", py_func.__name__).replace("<", "").replace(">", "")
    line = py_func.__code__.co_firstlineno
    python = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    return f"{subdirectory(py_func, source)}/{module}.{qualname}-{line}.{python}.nbi"


def _dispatchers() -> list[Any]:
    """This process's Numba functions that cache (`cache=True`), the ones the cache serves.

    The rest (Numba's own internal functions among them) never look in the
    cache, yet Numba counts each of their compilations as a cache miss.
    """
    if "numba" not in sys.modules:
        return []
    dispatcher = importlib.import_module("numba.core.dispatcher").Dispatcher
    return [
        candidate
        for candidate in gc.get_objects()
        if isinstance(candidate, dispatcher) and candidate.stats.cache_path is not None
    ]


def served() -> dict[str, int]:
    """Hits per captured entry (each function's index file), by Numba's `dispatcher.stats`."""
    return dict(tally().served)


def hits() -> tuple[int, int, float]:
    """Cache hits and misses of every cached Numba function in this process (`dispatcher.stats`).

    Numba does not report the compile time a hit saved: the third value is 0.0.
    """
    counted = tally()
    return counted.hits, counted.misses, 0.0


def tally() -> Tally:
    """`hits()` and `served()` in one walk over the process's objects (for warmenv's hooks)."""
    found_hits = found_misses = 0
    found: dict[str, int] = {}
    for dispatcher in _dispatchers():
        stats = dispatcher.stats
        count = sum(stats.cache_hits.values())
        found_hits += count
        found_misses += sum(stats.cache_misses.values())
        if count:
            key = _index_key(dispatcher.py_func)
            found[key] = found.get(key, 0) + count
    return Tally(found_hits, found_misses, served=found)


def _import_numba() -> Any:
    try:
        return importlib.import_module("numba.core.config")
    except ImportError as error:
        raise ImportError(f"warmenv.caches.numba needs Numba: {install_hint('numba')}") from error
