"""The hits of `warmenv run`'s command: counted inside it, by hooks its compilers load.

`warmenv run --cache TOOL -- COMMAND` restores before COMMAND and captures
after, but the hits happen inside COMMAND, which has no warmenv in it. So
warmenv gives each compiler in COMMAND a hook that the compiler loads
itself, through its own plug-in mechanism, with no `sitecustomize` and no
`.pth` file:

- Numba: its cache locator (`NUMBA_CACHE_LOCATOR_CLASSES`, which `warmenv
  run` sets anyway to fix Numba's trap).
- Triton: its cache manager (`TRITON_CACHE_MANAGER`), a `FileCacheManager`
  that notes each kernel it finds, named through the distribution below.
- JAX and torch: entry points (`jax_plugins`, which JAX loads when it
  starts its backends; `torch.backends`, which `import torch` loads). They
  are declared by a distribution written for COMMAND (`warmenv_run_hooks_<tool>`:
  a `.dist-info` directory and a module that imports the hook from the
  warmenv `warmenv run` runs from, or is a no-op where COMMAND's Python
  has another or none) in a directory of this user's (`_hookdir`) that
  `warmenv run` puts first on COMMAND's `PYTHONPATH`, so only the processes
  `warmenv run` starts see it; an installed warmenv declares none. Triton's
  manager is a class of that module too, Triton's own `FileCacheManager`
  where warmenv's cannot be imported.

Every hook does nothing unless `COUNTS_VARIABLE` names a file; at exit it
appends the tool's own counts to it (one JSON line per process: hits,
misses, the misses left uncached, and the hits per captured entry, by
tree part), and `warmenv run`
adds them up after COMMAND ends (`read_counts`) and counts the hits of
each entry in the environment's statistics, as `use()` does in-process.
The hooks are warmenv's modules: a COMMAND whose Python has no warmenv is
not counted (Numba's locator, which fixes its trap, needs it anyway).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, TypeGuard

import attrs

from warmenv._fs import open_found, read_bounded
from warmenv.caches._hookdir import HookHome

__all__ = [
    "COUNTS_VARIABLE",
    "Counts",
    "EntryPoint",
    "Variable",
    "hook_variables",
    "new_counts",
    "read_counts",
    "write_counts",
]

log = logging.getLogger("warmenv.caches")

COUNTS_VARIABLE: Final = "WARMENV_CACHE_COUNTS"
"""Names the file where a tool's hook in a child process appends its hit counts at exit."""
_HOOKS: Final = "warmenv_run_hooks"
_COUNTS_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WARMENV: Final = Path(os.path.realpath(__file__)).parent.parent  # this warmenv's package
MAX_COUNTS_BYTES = 16 << 20
"""The most of the counts file `read_counts` reads: the command writes it, so it may make
it any size; one process's line is a few hundred bytes, a few per entry it served."""


def write_counts(
    tool: str,
    hits: int,
    misses: int,
    served: Mapping[str, Mapping[str, int]] | None = None,
    *,
    uncached: int = 0,
) -> None:
    """Append this process's counts for `tool` to the file `COUNTS_VARIABLE` names, if any.

    The file is `warmenv run`'s (`new_counts`): one that is not there, not a
    regular file or not this user's is left alone.

    `served`: hits per entry (relative path) per tree part (`files`, ...),
    where the tool says which entries it served. `uncached`: misses the tool
    compiled and did not write to its cache (where it says: JAX).
    """
    path = os.environ.get(COUNTS_VARIABLE)
    if not path:
        return
    by_part = {part: dict(hits) for part, hits in (served or {}).items()}
    record = {
        "tool": tool,
        "hits": hits,
        "misses": misses,
        "uncached": uncached,
        "served": by_part,
    }
    # A process that outlives `warmenv run` still names the file after it was removed, with
    # its directory: never create it, follow a symlink, block on a FIFO, or write a file
    # another user could have put there.
    try:
        fd = os.open(path, _COUNTS_FLAGS)
    except OSError:
        log.warning("could not write %s's cache counts to %s", tool, path)
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            log.warning("not writing %s's cache counts to %s: not this user's file", tool, path)
            return
        os.write(fd, (json.dumps(record) + "\n").encode())
    except OSError:
        log.warning("could not write %s's cache counts to %s", tool, path)
    finally:
        os.close(fd)


@attrs.define
class Counts:
    """One tool's counts from the processes `warmenv run` ran."""

    hits: int = 0
    misses: int = 0
    served: dict[str, dict[str, int]] = attrs.Factory(dict)
    """Hits per entry (relative path), per tree part."""
    uncached: int = 0
    """Misses compiled and not written to the tool's cache (JAX's below its minimum)."""


def new_counts(path: Path) -> None:
    """Create the (empty) file the command's hooks append their counts to (`write_counts`)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def read_counts(path: Path) -> dict[str, Counts]:
    """Each tool's hits, misses and hits per entry, summed over the processes that wrote `path`."""
    found: dict[str, Counts] = {}
    # The command may have put anything at the name (`new_counts` made it a file): what
    # is there now is read only if it is a regular file, and never waited on.
    try:
        fd = open_found(path)
        if isinstance(fd, str):
            log.warning("not reading the command's cache counts from %s: it is %s", path, fd)
            return found
        try:
            read = read_bounded(fd, MAX_COUNTS_BYTES, path)
        finally:
            os.close(fd)
    except OSError:
        return found
    data = read.data
    if read.over is not None:
        log.warning("%s; the command's cache counts are from the part read", read.over)
        data = data[: data.rfind(b"\n") + 1]  # a line cut short is no count
    bad = 0
    for line in data.decode("utf-8", "replace").splitlines():
        record = _record(line)
        if record is None:
            bad += 1
            continue
        tool, hits, misses, uncached, served = record
        counts = found.setdefault(tool, Counts())
        counts.hits += hits
        counts.misses += misses
        counts.uncached += uncached
        for part, entries in served.items():
            mine = counts.served.setdefault(part, {})
            for key, n in entries.items():
                mine[key] = mine.get(key, 0) + n
    if bad:
        log.warning(
            "%s: %d line(s) of the command's cache counts are not counts (each a JSON object "
            "of a tool's name and counts that are whole numbers >= 0); they are not counted",
            path,
            bad,
        )
    return found


def _record(line: str) -> tuple[str, int, int, int, dict[str, dict[str, int]]] | None:
    """One line's tool, hits, misses, uncached and served, or None if it is not counts.

    The line is the command's, so anything may be in it: a count is an `int >= 0`
    (never a bool, a float or `1e999`, which is infinity), every name a `str`.
    """
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON (a UnicodeError is a ValueError), too deep
        return None
    if not isinstance(record, dict) or not isinstance(tool := record.get("tool"), str):
        return None
    hits, misses = record.get("hits"), record.get("misses")
    uncached, served = record.get("uncached", 0), record.get("served", {})
    if not (_is_count(hits) and _is_count(misses) and _is_count(uncached)):
        return None
    if not isinstance(served, dict):
        return None
    for entries in served.values():  # JSON's keys are str
        if not isinstance(entries, dict) or not all(map(_is_count, entries.values())):
            return None
    return tool, hits, misses, uncached, served


def _is_count(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0


@attrs.frozen
class EntryPoint:
    """An entry point a tool loads by itself, naming one of warmenv's hooks for it."""

    group: str
    """The tool's entry-point group (`torch.backends`)."""
    hook: str
    """The hook, `module:function` (`warmenv.caches._torch_plugin:autoload`)."""
    names_a_module: bool = False
    """The tool takes a module and calls `function` in it (JAX's `jax_plugins`)."""


@attrs.frozen
class Variable:
    """A variable a tool reads naming a class it loads (`TRITON_CACHE_MANAGER`): warmenv's hook."""

    name: str
    hook: str
    """warmenv's class, `module:class` (`warmenv.caches._triton_plugin:CountingCacheManager`)."""
    fallback: str
    """The tool's own class, loaded where warmenv's cannot be (`...:FileCacheManager`)."""


def hook_variables(
    tool: str,
    entry_points: Iterable[EntryPoint],
    variables: Iterable[Variable],
    environ: Mapping[str, str],
    home: HookHome,
) -> dict[str, str]:
    """The variables that let a child's `tool` load the hooks named, as `environ` becomes.

    The hooks are declared by a distribution (`warmenv_run_hooks_<tool>`:
    importlib.metadata keeps one distribution of a name) in a directory of
    this user's that no other user can touch (in `home`), which goes first
    on `PYTHONPATH`, before what `environ` has there, kept exactly (an empty
    entry is the working directory). Each entry point or variable names an
    object of a module written there that imports warmenv's hook only from
    the warmenv this process runs (a `warmenv/` planted in the command's
    working directory is never imported), and otherwise is a no-op (torch
    would fail `import torch` on a hook it cannot load) or the tool's own
    class. A variable the user set is theirs to keep. Nothing to load: no
    variables.
    """
    points = list(entry_points)
    chosen = [v for v in variables if v.name not in environ]
    if not points and not chosen:
        return {}
    name = f"{_HOOKS}_{tool.replace('-', '_')}"
    declared = []
    shim = [
        f'"""`warmenv run`\'s hooks for {tool} (warmenv.caches._children)."""\n',
        _OURS.format(package=str(_WARMENV)),
    ]
    for entry in points:
        module, _, function = entry.hook.partition(":")
        value = name if entry.names_a_module else f"{name}:{function}"
        declared.append(f"[{entry.group}]\nwarmenv = {value}\n")
        fallback = f"    def {function}() -> None:\n        pass\n"
        shim.append(_SHIM.format(module=module, name=function, fallback=fallback))
    found = {}
    for variable in chosen:
        module, _, attribute = variable.hook.partition(":")
        own, _, own_name = variable.fallback.partition(":")
        fallback = f"    from {own} import {own_name} as {attribute}\n"
        shim.append(_SHIM.format(module=module, name=attribute, fallback=fallback))
        found[variable.name] = f"{name}:{attribute}"
    info = f"{name}-0.dist-info"
    directory = home.directory(
        {
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n",
            f"{info}/entry_points.txt": "\n".join(declared),
            f"{name}.py": "\n".join(shim),
        }
    )
    before = environ.get("PYTHONPATH")
    found["PYTHONPATH"] = str(directory) + (os.pathsep + before if before else "")
    return found


_OURS: Final = """import importlib.util as _util
import os as _os

_WARMENV = {package!r}  # the warmenv `warmenv run` runs from


def _ours() -> bool:
    try:
        spec = _util.find_spec("warmenv")  # finds, runs nothing
    except (ImportError, ValueError):
        return False
    origin = None if spec is None else spec.origin
    return origin is not None and _os.path.dirname(_os.path.realpath(origin)) == _WARMENV


_OURS = _ours()
"""

_SHIM: Final = """try:
    if not _OURS:
        raise ImportError("not the warmenv that warmenv run runs from")
    from {module} import {name}
except ImportError:  # this Python has no warmenv, or another one: nothing is counted
{fallback}"""
