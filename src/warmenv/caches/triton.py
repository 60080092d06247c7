"""Triton's kernel cache in the environment: a kernel compiled once is compiled for the fleet.

Triton keys a compiled kernel by a hash of its source, its options, its
target and the content of Triton's own files, never a path, so a kernel is
good wherever the same Triton runs. What does not travel is the index:
Triton's default cache writes, beside each kernel's files, a
`__grp__<kernel>.json` naming those files by absolute path, so a cache
directory copied to another path misses every kernel, silently, once the
original path is gone (another machine, another user, a fresh volume).

Two ways to carry it, over the same namespaces
(`caches.triton/<facts>/files`: each kernel file keyed `<key>/<file>` as
under Triton's cache directory; `caches.triton/<facts>/groups`: each index
as Triton's `RemoteCacheManager` writes it, the kernel's file names only,
path-independent):

- live, in-process: `use(env)` plugs `Backend` into Triton's cache-manager
  plug-in (`TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager`,
  `TRITON_REMOTE_CACHE_BACKEND=warmenv.caches.triton:Backend`), so every
  compile looks its kernel up in the environment (and through it the
  fleet's shared tier) and stores what it compiles there; `environ()`
  gives the variables that do the same for a child process, which opens the
  configured environment.
- directory: `capture(env)` stores a Triton cache directory's files and
  indexes, `restore(env)` writes them under another directory with each
  index rewritten to name the files where they now are, written after
  every file it names (a compile that finds the index finds its files).

What decides a hit is in the version segment: Triton's version and the
Python it runs on (its keys hash Triton's compiled library, one per Python
version). The GPU target is in each kernel's key; a kernel built for
another target is simply never asked for. The trust model is in
docs/caches.md: a compiled kernel is code.

Importing this module imports no Triton; `use()` and `Backend` do.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import json
import os
import re
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, final

import anyio.to_thread
import attrs

from warmenv import blocking
from warmenv._facts import Facts
from warmenv._fs import expand_home, read_bounded
from warmenv._install import install_hint
from warmenv.caches._children import Variable
from warmenv.caches._home import default_cache_dir
from warmenv.caches._paths import (
    DIRECTORY_FLAGS,
    Writer,
    open_owned,
    relative_parts,
    swappable,
)
from warmenv.caches._restore import restore_planned
from warmenv.caches._tree import (
    CacheTree,
    CaptureReport,
    LeftOut,
    RestoreReport,
    refused_lines,
)
from warmenv.caches._tree import capture as _capture
from warmenv.environment import Environment
from warmenv.persistence import BytesCodec, CacheMode

__all__ = [
    "CACHE_DIR_VARIABLE",
    "FACTS",
    "REQUIRES",
    "TritonCache",
    "TritonCaptureReport",
    "TritonRestoreReport",
    "capture",
    "cache_dir",
    "environ",
    "facts",
    "hits",
    "live_cache_dir",
    "restore",
    "settings",
    "trees",
    "use",
]

TOOL: Final = "triton"
FACTS: Final = ("triton", "python")
"""The facts that decide whether a captured kernel can hit (see `Facts`)."""
GROUP_PREFIX: Final = "__grp__"
CACHE_DIR_VARIABLE: Final = "TRITON_CACHE_DIR"
_MANAGER: Final = "triton.runtime.cache:RemoteCacheManager"
_BACKEND: Final = "warmenv.caches.triton:Backend"
_LIVE: Final = "triton-live"  # the live form's directory: never the directory form's
# What Triton leaves in its cache directory that is no kernel: its lock file
# and the temporary directories it writes through.
_NOT_KERNELS: Final = ("lock", "tmp.pid_*")
_MAX_GROUP_BYTES: Final = 1024 * 1024
_UNESCAPED: Final = re.compile(r"[A-Za-z0-9_.+-]*\Z")
"""Characters JSON writes as they are."""
REQUIRES: Final = "triton"
"""The package this tool's facts are read from: `warmenv run --cache triton` needs it here."""
COUNTING: Final = (
    Variable(
        "TRITON_CACHE_MANAGER",
        "warmenv.caches._triton_plugin:CountingCacheManager",
        fallback="triton.runtime.cache:FileCacheManager",
    ),
)
"""`warmenv run`'s hook in its command: Triton's file cache, noting what it finds."""


def facts() -> Facts:
    """This machine's values of `FACTS`."""
    return Facts.here(*FACTS)


def _trees(chosen: Facts | None = None) -> tuple[CacheTree, CacheTree]:
    chosen = facts() if chosen is None else chosen
    files = CacheTree(TOOL, chosen, part="files", exclude=(f"{GROUP_PREFIX}*", *_NOT_KERNELS))
    groups = CacheTree(TOOL, chosen, part="groups")
    return files, groups


MISSES_PART: Final = "groups"
"""Triton looks each kernel up by its index: its misses are counted in the indexes' namespace."""


def trees() -> tuple[CacheTree, ...]:
    """The kernels' files and indexes trees, for `warmenv run`'s counting of its command."""
    return _trees()


def cache_dir() -> Path:
    """Triton's cache directory as Triton reads it (`TRITON_CACHE_DIR`, else `~/.triton/cache`)."""
    configured = os.environ.get(CACHE_DIR_VARIABLE)
    if configured:
        return expand_home(configured, CACHE_DIR_VARIABLE)
    home = os.environ.get("TRITON_HOME")
    return expand_home(home or "~", "TRITON_HOME" if home else "") / ".triton" / "cache"


# --- live: Triton's cache-manager plug-in ----------------------------------------------


@final
@attrs.define(eq=False)
class TritonCache:
    """Triton's cache served from one environment in this process (what `use()` returns)."""

    env: blocking.BlockingEnvironment
    facts: Facts
    _files: blocking.BlockingStore[bytes, bytes]
    _groups: blocking.BlockingStore[bytes, bytes]

    @property
    def hits(self) -> int:
        """Kernels Triton found in its cache since `use()`, by its compilation listener."""
        return hits()[0]

    @property
    def misses(self) -> int:
        """Kernels Triton compiled since `use()`, by its compilation listener."""
        return hits()[1]

    def get(self, key: str, filenames: list[str]) -> dict[str, bytes]:
        found = {}
        for filename in filenames:
            data = self._store(filename).get(_entry(key, filename))
            if data is not None:
                found[filename] = data
        return found

    def put(self, key: str, filename: str, data: bytes) -> None:
        # A Failed insert (full disk, read-only environment) leaves the kernel
        # in Triton's own directory, where this process still finds it.
        self._store(filename).insert(_entry(key, filename), data)

    def _store(self, filename: str) -> blocking.BlockingStore[bytes, bytes]:
        return self._groups if filename.startswith(GROUP_PREFIX) else self._files


def _entry(key: str, filename: str) -> bytes:
    return f"{key}/{filename}".encode()


_serving: TritonCache | None = None
_serving_lock = threading.Lock()
_opened = contextlib.ExitStack()


def use(
    env: blocking.BlockingEnvironment | str | None = None,
    *,
    root: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> TritonCache:
    """Serve Triton's cache from `env` in this process, from the next compile on.

    `env`: an open `warmenv.blocking` environment (it must stay open while
    Triton compiles), or an environment's name (default: the configured
    one), opened now and closed at exit. Every kernel Triton looks up is
    read from the environment (a hit compiles nothing) and every kernel it
    compiles is stored there. Triton still writes the files it loads into a
    local directory, `cache_dir` (default: the environment's own,
    `<root>/<environment>.caches/triton-live`, `live_cache_dir`): one used by
    this form only, because Triton's remote manager writes its indexes there
    in a form Triton's own file cache cannot read (a plain
    Triton pointed at it fails with `AttributeError: 'list' object has no
    attribute 'items'`). Call it at start-up; calling it again serves
    another environment.
    """
    global _serving
    knobs, manager = _import_triton()
    if not isinstance(env, blocking.BlockingEnvironment):
        env = _opened.enter_context(blocking.open_environment(env, root=root))
        _close_at_exit()
    directory = Path(cache_dir) if cache_dir is not None else live_cache_dir(env)
    served = _serve(env)
    with _serving_lock:
        _serving = served
    knobs.cache.dir = str(expand_home(directory, "cache_dir"))
    knobs.cache.manager_class = manager
    knobs.cache.remote_manager_class = _backend_class()
    _listen(knobs)
    return served


def live_cache_dir(
    env: blocking.BlockingEnvironment | str | None = None, *, root: str | Path | None = None
) -> Path:
    """`<root>/<environment>.caches/triton-live`: where the live form's Triton writes the
    files it loads, `env`'s own (the configured environment and root by default)."""
    return default_cache_dir(_LIVE, env, root)


def settings(cache_dir: str | Path) -> dict[str, str]:
    """The environment variables that point a Triton process at the cache directory `cache_dir`.

    With them, Triton's own file cache reads what `restore` wrote there
    (`warmenv run --cache triton` restores before and captures after).
    """
    return {CACHE_DIR_VARIABLE: str(cache_dir)}


def environ() -> dict[str, str]:
    """The variables that make a child process's Triton use `Backend` (its configured environment).

    Add `WARMENV_ROOT` and `WARMENV_ENVIRONMENT` to choose the environment:
    the child opens it on its first compile and closes it at exit. Give the
    child a `TRITON_CACHE_DIR` of its own (see `use()` for why).
    """
    return {"TRITON_CACHE_MANAGER": _MANAGER, "TRITON_REMOTE_CACHE_BACKEND": _BACKEND}


def _serve(env: blocking.BlockingEnvironment) -> TritonCache:
    chosen = facts()
    files, groups = _trees(chosen)
    return TritonCache(
        env,
        chosen,
        env.store(files.namespace, BytesCodec(), CacheMode.LAZY),
        env.store(groups.namespace, BytesCodec(), CacheMode.LAZY),
    )


def _served() -> TritonCache:
    """The cache `use()` chose, or the configured environment's (a child told by `environ()`)."""
    global _serving
    with _serving_lock:
        if _serving is None:
            env = _opened.enter_context(blocking.open_environment())
            _close_at_exit()
            _serving = _serve(env)
            _listen(_import_triton()[0])
        return _serving


@functools.cache
def _close_at_exit() -> None:
    atexit.register(_opened.close)


# --- Triton's own counters --------------------------------------------------------------

_counts_lock = threading.Lock()
_counts = {"hits": 0, "misses": 0}
_compile_seconds = [0.0]
_listening = [False]


def hits() -> tuple[int, int, float]:
    """This process's kernel-cache hits, misses and seconds spent compiling the misses.

    Counted by Triton's compilation listener (`knobs.compilation.listener`)
    from the first `use()` (or the first compile through `Backend`);
    `(0, 0, 0.0)` before. Triton reports no compile time for a hit, so what
    a hit saved is not known here.
    """
    with _counts_lock:
        return _counts["hits"], _counts["misses"], _compile_seconds[0]


def _listen(knobs: Any) -> None:
    """Count Triton's own hit and miss reports, keeping any listener already installed."""
    with _counts_lock:
        if _listening[0]:
            return
        _listening[0] = True
    previous = knobs.compilation.listener

    def listener(**report: Any) -> None:
        with _counts_lock:
            if report["cache_hit"]:
                _counts["hits"] += 1
            else:
                _counts["misses"] += 1
                _compile_seconds[0] += report["times"].total / 1e6
        if previous is not None:
            previous(**report)

    knobs.compilation.listener = listener


def _import_triton() -> tuple[Any, Any]:
    try:
        knobs = importlib.import_module("triton.knobs")
        cache = importlib.import_module("triton.runtime.cache")
    except ImportError as error:
        raise ImportError(
            f"warmenv.caches.triton needs Triton: {install_hint('triton')}"
        ) from error
    return knobs, cache.RemoteCacheManager


@functools.cache
def _backend_class() -> type:
    base: Any = importlib.import_module("triton.runtime.cache").RemoteCacheBackend

    class Backend(base):  # type: ignore[misc]
        """Triton's remote cache backend over a warmenv environment (see the module)."""

        def __init__(self, key: str) -> None:
            self._key = key
            self._cache = _served()

        def get(self, filenames: list[str]) -> dict[str, bytes]:
            return self._cache.get(self._key, filenames)

        def put(self, filename: str, data: bytes) -> None:
            self._cache.put(self._key, filename, data)

    Backend.__module__ = __name__
    Backend.__qualname__ = "Backend"
    return Backend


def __getattr__(name: str) -> Any:
    # `TRITON_REMOTE_CACHE_BACKEND=warmenv.caches.triton:Backend`: Triton asks
    # for the class by name; it subclasses Triton's, so it is made on demand.
    if name == "Backend":
        return _backend_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- directory: capture and restore ----------------------------------------------------


@attrs.frozen
class TritonCaptureReport:
    """What `capture` stored from one Triton cache directory."""

    files: CaptureReport
    """The kernels' files."""
    groups: int
    """Indexes stored (one per kernel)."""
    left_out: tuple[LeftOut, ...]
    """Indexes not captured, and why."""

    def __str__(self) -> str:
        return f"{self.files}; {self.groups} kernel indexes" + (
            f", {len(self.left_out)} left out" if self.left_out else ""
        )


@attrs.frozen
class TritonRestoreReport:
    """What `restore` wrote into one Triton cache directory."""

    files: RestoreReport
    groups: int
    """Indexes written (kernels Triton will now find)."""
    kept: int
    """Indexes already there (left as they were)."""
    refused: tuple[LeftOut, ...]
    """Indexes not written: malformed, unsafe, or naming a file that is not there."""

    def __str__(self) -> str:
        lines = [f"{self.files}", f"{self.groups} kernel indexes written"]
        lines += refused_lines(self.refused)
        return "\n".join(lines)


async def capture(env: Environment, source: str | Path | None = None) -> TritonCaptureReport:
    """Store a Triton cache directory (default: `cache_dir()`) in `env`, indexes as names only."""
    source = await anyio.to_thread.run_sync(_where, source)
    files, groups_tree = await anyio.to_thread.run_sync(_trees)
    captured = await _capture(env, files, source)
    groups, left_out = await anyio.to_thread.run_sync(_read_groups, source)
    stored = 0
    if groups:
        storage = env.storage(groups_tree.namespace)
        existing = await storage.get_many(groups)
        new = [(key, value) for key, value in groups.items() if key not in existing]
        stored = len(groups) - (await storage.insert_many(new)).failed
    return TritonCaptureReport(captured, stored, tuple(left_out))


def _where(path: str | Path | None) -> Path:
    """The directory meant, absolute: an index names its files by absolute path."""
    return Path(os.path.abspath(cache_dir() if path is None else expand_home(path, "cache_dir")))


def _read_groups(source: Path) -> tuple[dict[bytes, bytes], list[LeftOut]]:
    """Every index under `source`, as Triton's remote manager writes it (file names only).

    Walked through directory descriptors (a kernel's directory swapped for a
    symlink is not followed), each index opened by `open_owned` whatever the
    listing said of it: what lies at its name when it is read is what counts
    (a FIFO put there since would block the capture forever). An index, or a
    kernel's directory, that another user owns or can write is left out,
    named, by the rule the files' capture follows (`swappable`): its names
    would be restored as this machine's own."""
    groups: dict[bytes, bytes] = {}
    left_out: list[LeftOut] = []
    try:
        top = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # no directory: no indexes
        return groups, left_out
    try:
        if (why := swappable(os.fstat(top))) is not None:
            return groups, [LeftOut(".", f"a directory that {why}")]
        for kernel in sorted(os.listdir(top)):
            try:
                at = os.open(kernel, DIRECTORY_FLAGS, dir_fd=top)
            except OSError:  # not a directory (or a symlink to one): no kernel's
                continue
            try:
                if (why := swappable(os.fstat(at))) is not None:
                    left_out.append(LeftOut(kernel, f"a directory that {why}"))
                    continue
                for name in sorted(os.listdir(at)):
                    if name.startswith(GROUP_PREFIX):
                        data = _read_small(name, at)
                        names = _group_names(data, source / kernel)
                        if isinstance(names, str):
                            left_out.append(LeftOut(f"{kernel}/{name}", names))
                        else:
                            groups[f"{kernel}/{name}".encode()] = _group_bytes(names)
            finally:
                os.close(at)
    finally:
        os.close(top)
    return groups, left_out


def _read_small(name: str, at: int) -> bytes | str | None:
    """The index's bytes, why it is not read, or None if it is gone."""
    try:
        fd = open_owned(name, dir_fd=at)
    except OSError:
        return None
    if isinstance(fd, str):
        return fd
    try:
        read = read_bounded(fd, _MAX_GROUP_BYTES, name)
    finally:
        os.close(fd)
    return _too_large() if read.over is not None else read.data


def _group_names(data: bytes | str | None, kernel: Path | None) -> list[str] | str:
    """The file names an index lists, or why it is refused.

    Triton's file cache writes `{"child_paths": {name: absolute path}}`, its
    remote manager `{"child_paths": [names]}`; a name must be a plain file
    name and, given the kernel's directory, a path must be that name there.
    """
    if data is None:
        return "it went away while being captured"
    if isinstance(data, str):
        return data
    if len(data) > _MAX_GROUP_BYTES:
        return _too_large()
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "it is not JSON"
    children = parsed.get("child_paths") if isinstance(parsed, dict) else None
    if isinstance(children, Mapping) and kernel is not None:
        for name, path in children.items():
            if not isinstance(path, str) or Path(path) != kernel / str(name):
                return f"it names {path!r}, outside its kernel's directory"
        children = list(children)
    if not isinstance(children, list) or not children:
        return "it lists no files"
    for name in children:
        if not isinstance(name, str) or not _plain_name(name):
            return f"it names {name!r}, which is not a plain file name"
    return sorted(set(children))  # each name once, however often the index lists it


def _too_large() -> str:
    return f"it is larger than {_MAX_GROUP_BYTES:,} bytes"


def _plain_name(name: str) -> bool:
    parts = relative_parts(name.encode())
    return not isinstance(parts, str) and len(parts) == 1


def _group_bytes(names: list[str]) -> bytes:
    # Byte for byte what Triton's RemoteCacheManager.put_group writes, so the
    # live and the directory forms store the same value for one kernel.
    return json.dumps({"child_paths": sorted(names)}).encode()


async def restore(env: Environment, target: str | Path | None = None) -> TritonRestoreReport:
    """Write the kernels captured under this machine's facts into `target` (default: `cache_dir()`).

    Each index is rewritten to name its files under `target` and written
    only once they are all there, after every file: the files and the
    indexes are two trees of one pass (`restore_planned`).
    """
    done = await restore_planned(env, functools.partial(_plan, target))
    restored, grouped = done.reports
    return TritonRestoreReport(restored, grouped.written, grouped.kept, grouped.refused)


def _plan(target: str | Path | None) -> tuple[Path, list[tuple[CacheTree, str]]]:
    """The target and the trees, worked out on the restore's worker thread (facts are files)."""
    files, groups = _trees()
    indexes = attrs.evolve(groups, index=("*",), rewrite=_restored_group)
    return _where(target), [(files, ""), (indexes, "")]


def _restored_group(writer: Writer, parts: tuple[str, ...], value: bytes) -> bytes | str:
    """An index as Triton's file cache reads it: its files by absolute path under the
    target, every one of them there; or why it is refused."""
    if len(parts) != 2 or not parts[1].startswith(GROUP_PREFIX):
        return "it is not a kernel's index (<key>/__grp__<name>)"
    names = _group_names(value, None)
    if isinstance(names, str):
        return names
    for name in names:
        if writer.placed((parts[0], name)):
            continue
        mode = writer.mode_at((parts[0], name))
        if mode is None:
            return f"its file {name!r} is not in the cache"
        if not stat.S_ISREG(mode):
            return f"its file {name!r} is not a regular file"
    # `str(target / key / name)`, joined as text: both names are plain (one component).
    kernel = os.path.join(writer.target, parts[0])
    if not _UNESCAPED.match("".join(names)):
        return json.dumps({"child_paths": {name: f"{kernel}/{name}" for name in names}}).encode()
    # The same bytes as `json.dumps` of that, without its encoder (a twentieth of a
    # Triton restore's instructions): the names need no escaping, and JSON escapes a
    # string a character at a time, so the directory is escaped once for all its files.
    escaped = json.dumps(f"{kernel}/")[:-1]
    children = ", ".join(f'"{name}": {escaped}{name}"' for name in names)
    return f'{{"child_paths": {{{children}}}}}'.encode()
