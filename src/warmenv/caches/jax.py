"""JAX's persistent compilation cache, carried so that it hits on another machine.

What is captured: the files of JAX's compilation-cache directory
(`<key>-cache`, each a compiled XLA executable with its compile time),
leaving out its `-atime` bookkeeping and lock files.

What decides a hit: JAX's key hashes the computation, the compile options
and the backend (jaxlib's version among them), and the executable is built
for this CPU's instruction set; so the namespace's facts are the `jax` and
`jaxlib` versions and the `cpu`.

The trap fixed: by default (`jax_persistent_cache_enable_xla_caches` =
`"xla_gpu_per_fusion_autotune_cache_dir"`) JAX writes the cache directory's
absolute path into the compile options' DebugOptions, which are hashed into
every key, even on CPU: a cache copied to another path misses every time.
`use()` (and `warmenv run --cache jax`) sets it to `"none"`, so keys do not
depend on where the cache lives. That setting turns off XLA's GPU autotune
and kernel caches inside the directory, which only GPUs use.

How: the directory form (`warmenv.caches._tree`) on every JAX version,
restored before the first compile and captured at exit. JAX's pluggable
cache (`CacheInterface`, which would let it read the environment directly)
is private API with no stability promise, so warmenv does not install
itself there.

    import warmenv.caches.jax
    warmenv.caches.jax.use()  # before the first jit; then use JAX as usual

Hits: JAX's `jax.monitoring` events count lookups (`compile_requests_use_cache`),
hits and writes (which JAX names `cache_misses`: a compilation too quick
to be cached, under `jax_persistent_cache_min_compile_time_secs`, is
looked up, missed and not written, so it is counted in no such event);
a miss is a lookup without a hit. The events name no
entry, so the entries hit are read from JAX's own log line for each hit
(`Persistent compilation cache hit for ... with key ...`, logger
`jax._src.compiler`, at DEBUG): `served()`, counted per entry in
`warmenv stats` when `use()` captures. The logger is let through at DEBUG
for that line only; what its handlers see is what they saw before. A JAX
whose line reads otherwise leaves `served()` empty (the events still count).
"""

from __future__ import annotations

import importlib
import logging
import threading
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import anyio.to_thread

from warmenv._facts import Facts
from warmenv._fs import expand_home
from warmenv._install import install_hint
from warmenv.caches._children import EntryPoint
from warmenv.caches._home import default_cache_dir as _default_cache_dir
from warmenv.caches._inprocess import EnvironmentChoice, HitLines, Tally, Warmed, restored
from warmenv.caches._restore import restore_made
from warmenv.caches._tree import CacheTree, CaptureReport, RestoreReport
from warmenv.caches._tree import capture as _capture
from warmenv.environment import Environment

__all__ = [
    "FACTS",
    "REQUIRES",
    "capture",
    "configure",
    "default_cache_dir",
    "hits",
    "listen",
    "notes",
    "restore",
    "served",
    "settings",
    "tree",
    "trees",
    "uncached",
    "use",
]

FACTS: Final = ("jax", "jaxlib", "cpu")
_EXCLUDE: Final = ("*-atime", ".lockfile", "*.lock")
_HIT: Final = "/jax/compilation_cache/cache_hits"
_REQUEST: Final = "/jax/compilation_cache/compile_requests_use_cache"
_WRITE: Final = "/jax/compilation_cache/cache_misses"  # JAX records it as it writes an entry
_SAVED: Final = "/jax/compilation_cache/compile_time_saved_sec"
_HIT_LOGGER: Final = "jax._src.compiler"
_HIT_LINE: Final = "Persistent compilation cache hit for '%s' with key %r"
_ENTRY_SUFFIX: Final = "-cache"
CACHE_DIR_VARIABLE: Final = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_VARIABLE: Final = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
REQUIRES: Final = "jax"
"""The package this tool's facts are read from: `warmenv run --cache jax` needs it here."""
ENTRY_POINTS: Final = (
    EntryPoint("jax_plugins", "warmenv.caches._jax_plugin:initialize", names_a_module=True),
)
"""`warmenv run`'s hook in its command: JAX loads it as a plug-in (`caches/_children.py`)."""


def tree() -> CacheTree:
    """The tree JAX's cache is captured as, under this machine's facts."""
    return CacheTree("jax", Facts.here(*FACTS), exclude=_EXCLUDE, cost=_recorded_seconds)


_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"


def _recorded_seconds(entry: bytes) -> float | None:
    """The compile time JAX recorded in a cache entry, in seconds, or None where it is not known.

    An entry is its compressor's output (zlib, or zstandard where installed)
    of the compile time, 4 big-endian bytes of whole seconds (truncated),
    then the executable (`jax._src.compilation_cache`, read on JAX 0.10).
    JAX's own hit event (`compile_time_saved_sec`) is that time less the
    read's. A compile under a second is recorded as 0, which says only that:
    None, as for an entry this cannot read.
    """
    try:
        if entry.startswith(_ZSTD_MAGIC):
            zstandard = importlib.import_module("zstandard")
            head = zstandard.ZstdDecompressor().stream_reader(entry).read(4)
        else:
            head = zlib.decompressobj().decompress(entry, 4)
    except (ImportError, zlib.error, ValueError, OSError):
        return None
    if len(head) < 4:
        return None
    return float(int.from_bytes(head[:4], "big")) or None


def trees() -> tuple[CacheTree, ...]:
    """Every tree of JAX's cache (the one), for `warmenv run`'s counting of its command's hits."""
    return (tree(),)


async def restore(env: Environment, cache_dir: str | Path) -> RestoreReport:
    """Write the JAX cache captured under this machine's facts into `cache_dir`."""
    return await restore_made(env, tree, cache_dir)  # its facts read on a worker thread


async def capture(env: Environment, cache_dir: str | Path) -> CaptureReport:
    """Store JAX's cache directory `cache_dir` into `env`."""
    return await _capture(env, await anyio.to_thread.run_sync(tree), cache_dir)  # facts: files


def default_cache_dir(env: EnvironmentChoice = None, *, root: str | Path | None = None) -> Path:
    """`<root>/<environment>.caches/jax`: `env`'s own (the configured environment and
    root by default), beside its database file; never shared with another environment,
    whose capture would take this one's files (`caches/_home.py`)."""
    return _default_cache_dir("jax", env, root)


def settings(cache_dir: str | Path, *, min_compile_seconds: float | None = None) -> dict[str, str]:
    """The environment variables that point a JAX process at `cache_dir`, the trap fixed."""
    chosen = {
        "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none",
    }
    if min_compile_seconds is not None:
        chosen[MIN_COMPILE_VARIABLE] = str(min_compile_seconds)
    return chosen


def notes(environ: Mapping[str, str], uncached: int) -> list[str]:
    """What a user who ran a JAX process under `environ` should know (`warmenv run`).

    JAX caches only compilations that took at least its minimum (1 s unless
    `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` says otherwise), so a program
    of fast compilations leaves nothing to capture, in silence. Said only
    when the process left `uncached` compilations out of the cache (`uncached()`).
    """
    if not uncached:
        return []
    minimum = environ.get(MIN_COMPILE_VARIABLE)
    shown = "1 s, JAX's default" if minimum is None else f"{minimum} s"
    return [
        f"JAX left {uncached} compilation{'' if uncached == 1 else 's'} uncached, so not "
        f"captured (shorter than its minimum compile time, {shown}, or using host callbacks); "
        f"set {MIN_COMPILE_VARIABLE}=0 for the command to capture every one"
    ]


def configure(cache_dir: str | Path, *, min_compile_seconds: float | None = None) -> None:
    """Point this process's JAX at `cache_dir` with path-independent keys (imports JAX).

    `min_compile_seconds`: cache only compilations at least this long
    (JAX's `jax_persistent_cache_min_compile_time_secs`, 1.0 by default).
    """
    jax = _import_jax()
    compilation_cache = importlib.import_module(
        "jax.experimental.compilation_cache.compilation_cache"
    )
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    if min_compile_seconds is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    compilation_cache.reset_cache()  # a cache set up before this call used the old settings
    _listen(jax)


def use(
    env: EnvironmentChoice = None,
    *,
    root: str | Path | None = None,
    cache_dir: str | Path | None = None,
    min_compile_seconds: float | None = None,
    capture_at_exit: bool = True,
) -> Warmed:
    """Restore JAX's cache from `env` and point JAX at it; call before the first compile.

    `env`: an environment's name (default: the configured one) or an open
    `warmenv.blocking` environment. `cache_dir` defaults to
    `<root>/<environment>.caches/jax`, the environment's own (`default_cache_dir`).
    With `capture_at_exit`, what this process compiled is captured into the
    environment when the interpreter exits (`Warmed.capture()` does it at once).
    """
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir(env, root=root)
    directory = expand_home(directory, "cache_dir")
    _import_jax()  # fail before the restore, with the install hint
    warmed = restored("jax", tree(), directory, env, root, tally)
    configure(directory, min_compile_seconds=min_compile_seconds)
    if capture_at_exit:
        warmed.capture_at_exit()
    return warmed


# --- JAX's own counters -----------------------------------------------------------

_lock = threading.Lock()
_counts = {"requests": 0, "hits": 0, "writes": 0}
_saved = [0.0]
_served: dict[str, int] = {}
_listening = [False]


def hits() -> tuple[int, int, float]:
    """This process's compilation-cache hits, misses and compile seconds saved, by JAX's events.

    A miss is a lookup JAX made that did not hit, cached since or not (see
    `uncached()`). Counted from the first `configure`/`use`; `(0, 0, 0.0)` before.
    """
    with _lock:
        return _counts["hits"], _counts["requests"] - _counts["hits"], _saved[0]


def uncached() -> int:
    """This process's compilations JAX looked up, missed and did not write to its cache.

    Those that took less than JAX's minimum compile time, among others: they
    are compiled again by every process, and `notes` says so.
    """
    with _lock:
        return max(_counts["requests"] - _counts["hits"] - _counts["writes"], 0)


def served() -> dict[str, int]:
    """This process's hits per captured entry (`<key>-cache`), from JAX's log line for each hit."""
    with _lock:
        return dict(_served)


def tally() -> Tally:
    """`hits()` and `served()` together (for warmenv's hooks)."""
    hit, missed, saved = hits()
    return Tally(hit, missed, saved, served())


def listen() -> None:
    """Count this process's hits from now on, as `use()` does (imports JAX)."""
    _listen(_import_jax())


def _on_hit_key(key: str) -> None:
    entry = key + _ENTRY_SUFFIX
    with _lock:
        _served[entry] = _served.get(entry, 0) + 1


_COUNTED: Final = {_REQUEST: "requests", _HIT: "hits", _WRITE: "writes"}


def _on_event(event: str, **_: Any) -> None:
    counted = _COUNTED.get(event)
    if counted is not None:
        with _lock:
            _counts[counted] += 1


def _on_duration(event: str, duration: float, **_: Any) -> None:
    if event == _SAVED:
        with _lock:
            _saved[0] += max(duration, 0.0)


def _listen(jax: Any) -> None:
    with _lock:
        if _listening[0]:
            return
        _listening[0] = True
    jax.monitoring.register_event_listener(_on_event)
    HitLines.install(_HIT_LOGGER, logging.DEBUG, _HIT_LINE, _on_hit_key)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)


def _import_jax() -> Any:
    try:
        jax = importlib.import_module("jax")
        importlib.import_module("jax.monitoring")
    except ImportError as error:
        raise ImportError(f"warmenv.caches.jax needs JAX: {install_hint('jax')}") from error
    return jax
