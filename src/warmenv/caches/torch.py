"""torch.compile's caches (Inductor on CPU), carried so that a warm start builds nothing.

What is captured: the Mega-Cache, the portable bytes torch itself makes of
what a process compiled (`torch.compiler.save_cache_artifacts()`: the FX
graph and AOT autograd entries), stored in `caches.torch/<facts>/mega`,
and beside it the kernels those entries load: the shared libraries
(`<2 chars>/<key>.so`) under Inductor's cache directory
(`TORCHINDUCTOR_CACHE_DIR`), at their paths relative to it, in
`caches.torch/<facts>/kernels`.

The trap fixed: the Mega-Cache alone hits torch's graph cache but not its
kernels. A graph loaded from it still asks g++ for each kernel, because
the `.so` files are not in it: each is looked up by a name that hashes its
source and the whole g++ command line, and built when absent. So shipping
the bytes alone (what torch's documentation suggests) saves the graph
work and pays every g++ build again. warmenv carries the `.so` files too.

What decides a hit: the g++ command line in each kernel's name holds
torch's absolute install directory (its include paths) and
`-march=native` (this CPU's features), and the entries are torch's own
(its version, the Python that pickled them). So the facts are `torch`,
`python`, `cpu` and `torch.path`: kernels captured where torch lives
elsewhere, or on another CPU, are another namespace, skipped with the
reason, never restored to be rebuilt anyway.

Hits are torch's own counters (`torch._dynamo.utils.counters`: Inductor's
`fxgraph_cache_hit` and `fxgraph_cache_miss`). Which entries were hit, for
`warmenv stats` (counted when `use()` captures): each graph hit's key from
Inductor's own line for it (`fx graph cache hit for key ...`, logger
`torch._inductor.codecache`, at INFO, read as JAX's hit line is: the
logger's handlers see what they saw before), one hit of the graph entry
under `fxgraph/<key[1:3]>/<key>/`; and each restored kernel this process
loaded, as the operating system maps it (`/proc/self/maps`; Linux only:
elsewhere kernels are not counted). The bytes torch loads are
pickles: a bundle of them is code (docs/caches.md, the trust model).

    import warmenv.caches.torch
    warmenv.caches.torch.use()  # before the first torch.compile; captured at exit
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, Final, final

import anyio.to_thread
import attrs

from warmenv._facts import Facts
from warmenv._fs import expand_home
from warmenv._install import install_hint
from warmenv.caches._children import EntryPoint
from warmenv.caches._home import default_cache_dir as _default_cache_dir
from warmenv.caches._inprocess import EnvironmentChoice, HitLines, _Where, where
from warmenv.caches._restore import restore_planned
from warmenv.caches._tree import (
    CacheTree,
    CaptureReport,
    RestoreReport,
    record_hits,
    refused_lines,
)
from warmenv.caches._tree import capture as _capture
from warmenv.environment import Environment, open_environment
from warmenv.future import block_on
from warmenv.persistence import Conflict, Namespace, Stored

__all__ = [
    "CACHE_DIR_VARIABLE",
    "FACTS",
    "REQUIRES",
    "TorchCaptureReport",
    "TorchRestoreReport",
    "TorchWarmed",
    "artifacts",
    "capture",
    "default_cache_dir",
    "hits",
    "kernels_in",
    "listen",
    "restore",
    "served_here",
    "settings",
    "tree",
    "trees",
    "use",
]

log = logging.getLogger("warmenv.caches")

FACTS: Final = ("torch", "python", "cpu", "torch.path")
"""The facts that decide whether captured kernels and graphs can hit (see `Facts`)."""
REQUIRES: Final = "torch"
"""The package this tool's facts are read from: `warmenv run --cache torch` needs it here."""
CACHE_DIR_VARIABLE: Final = "TORCHINDUCTOR_CACHE_DIR"
ENTRY_POINTS: Final = (EntryPoint("torch.backends", "warmenv.caches._torch_plugin:autoload"),)
"""`warmenv run`'s hook in its command: `import torch` loads it (`caches/_children.py`)."""
_KERNELS: Final = ("*.so",)
_GRAPHS: Final = ("fxgraph", "aotautograd")
MISSES_PART: Final = "fxgraph"
"""Inductor's misses are graphs looked up and compiled: counted in the graph entries' namespace."""
_HIT_LOGGER: Final = "torch._inductor.codecache"
_HIT_LINE: Final = "fx graph cache hit for key %s"


def tree(facts: Facts | None = None) -> CacheTree:
    """The tree Inductor's kernels are captured as (its `.so` files), under this machine's facts."""
    chosen = Facts.here(*FACTS) if facts is None else facts
    return CacheTree("torch", chosen, part="kernels", include=_KERNELS)


def trees() -> tuple[CacheTree, ...]:
    """The kernels' and the graph entries' trees, for `warmenv run`'s counting of its command."""
    facts = Facts.here(*FACTS)
    return (tree(facts), *_graph_trees(facts))


def _mega(facts: Facts) -> Namespace:
    return Namespace("caches.torch", "mega", version=facts.segment)


def default_cache_dir(env: EnvironmentChoice = None, *, root: str | Path | None = None) -> Path:
    """`<root>/<environment>.caches/torch`: `env`'s own (the configured environment and
    root by default), beside its database file; never shared with another environment,
    whose capture would take this one's files (`caches/_home.py`)."""
    return _default_cache_dir("torch", env, root)


def settings(cache_dir: str | Path) -> dict[str, str]:
    """The environment variables that point a torch process's Inductor at `cache_dir`."""
    return {CACHE_DIR_VARIABLE: str(cache_dir)}


@attrs.frozen
class TorchCaptureReport:
    """What `capture` stored: the kernels, Inductor's graph entries, the Mega-Cache bytes if new."""

    kernels: CaptureReport
    graphs: tuple[CaptureReport, ...]
    """Inductor's FX graph and AOT autograd entries (`fxgraph/`, `aotautograd/`)."""
    artifacts: int
    """Mega-Cache entries stored (0 when none was given or it was already there)."""

    def __str__(self) -> str:
        graphs = sum(report.files for report in self.graphs)
        return f"{self.kernels}; {graphs} graph entries; {self.artifacts} new Mega-Cache entries"


@attrs.frozen
class TorchRestoreReport:
    """What `restore` wrote: the kernels, then Inductor's graph entries."""

    kernels: RestoreReport
    graphs: tuple[RestoreReport, ...]
    artifacts: int
    """Mega-Cache entries captured under this machine's facts (`artifacts()` reads them)."""

    def __str__(self) -> str:
        graphs = sum(report.written for report in self.graphs)
        # A graph entry's path is shown under its directory (`fxgraph/...`), as Inductor has it.
        refused = tuple(
            attrs.evolve(left, path=f"{report.target.name}/{left.path}")
            for report in self.graphs
            for left in report.refused
        )
        lines = [
            f"{self.kernels}; {graphs} graph entries"
            + (f" ({len(refused)} refused)" if refused else "")
            + f"; {self.artifacts} Mega-Cache entries",
            *refused_lines(refused),
        ]
        return "\n".join(lines)


def _graph_trees(facts: Facts) -> tuple[CacheTree, ...]:
    return tuple(CacheTree("torch", facts, part=part) for part in _GRAPHS)


async def capture(
    env: Environment, cache_dir: str | Path, artifacts: bytes | None = None
) -> TorchCaptureReport:
    """Store Inductor's kernels and graph entries under `cache_dir`, and `artifacts`, in `env`.

    `artifacts` is the first item of `torch.compiler.save_cache_artifacts()`
    (only a process that compiled can give it: `use()` does), keyed by the
    digest of its bytes; `use()` passes it only when the process compiled
    something it did not load at start-up, so warm runs add nothing.
    """
    facts = await anyio.to_thread.run_sync(Facts.here, *FACTS)
    source = Path(cache_dir)
    kernels = await _capture(env, tree(facts), source)
    # A graph directory is Inductor's, inside the cache: never followed if it is a symlink.
    graphs = [await _capture(env, graph, source, part=graph.part) for graph in _graph_trees(facts)]
    stored = 0
    if artifacts:
        key = hashlib.sha256(artifacts).hexdigest().encode()
        outcome = await env.storage(_mega(facts)).insert(key, artifacts)
        stored = 1 if isinstance(outcome, Stored) else 0
        if not isinstance(outcome, Stored | Conflict):
            log.warning("the Mega-Cache entry was not stored: %s", outcome)
    return TorchCaptureReport(kernels, tuple(graphs), stored)


async def restore(env: Environment, cache_dir: str | Path) -> TorchRestoreReport:
    """Write the kernels, then the graph entries, captured under this machine's facts.

    Kernels first: a graph entry torch finds (or loads from the Mega-Cache
    afterwards) finds the kernels it names already built.
    """
    return (await _restore(env, cache_dir))[0]


async def _restore(env: Environment, cache_dir: str | Path) -> tuple[TorchRestoreReport, Facts]:
    """`restore`, and the facts it restored under."""
    into = expand_home(cache_dir, "the cache directory")
    done = await restore_planned(env, functools.partial(_plan, into))
    kernels, *graphs = done.reports
    facts = done.trees[0].facts
    mega = done.held.get(str(_mega(facts)), 0)  # counted in the same pass
    return TorchRestoreReport(kernels, tuple(graphs), mega), facts


def _plan(cache_dir: Path) -> tuple[Path, list[tuple[CacheTree, str]]]:
    """The target and the trees under this machine's facts, worked out on the worker
    thread that checks the target (the facts are files: never on SQLite's thread)."""
    facts = Facts.here(*FACTS)
    return cache_dir, [(tree(facts), ""), *((graph, graph.part) for graph in _graph_trees(facts))]


async def artifacts(env: Environment) -> tuple[bytes, ...]:
    """The Mega-Cache entries captured under this machine's facts, for `load_cache_artifacts`."""
    return await _artifacts(env, await anyio.to_thread.run_sync(Facts.here, *FACTS))


async def _artifacts(env: Environment, facts: Facts) -> tuple[bytes, ...]:
    return tuple([value async for _, value in env.storage(_mega(facts)).scan()])


# --- in-process ---------------------------------------------------------------------


@final
@attrs.define(eq=False)
class TorchWarmed:
    """What `use()` set up in this process: what was restored, torch's hits, `capture()`."""

    cache_dir: Path
    """Inductor's cache directory (`TORCHINDUCTOR_CACHE_DIR`)."""
    restored: TorchRestoreReport
    """What the restore at start-up wrote."""
    loaded: int
    """Mega-Cache entries torch loaded at start-up."""
    _where: _Where = attrs.field(alias="where")
    _known: frozenset[str] = attrs.field(alias="known")
    _present: frozenset[str] = attrs.field(alias="present")
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _recorded: dict[str, dict[str, int]] = attrs.field(factory=dict, init=False)
    _recorded_misses: int = attrs.field(default=0, init=False)

    @property
    def hits(self) -> int:
        """Graphs Inductor served from its cache so far, by its own counter."""
        return hits()[0]

    @property
    def misses(self) -> int:
        """Graphs Inductor looked up and compiled, by its own counter."""
        return hits()[1]

    def capture(self) -> TorchCaptureReport:
        """Store what this process compiled so far: the Mega-Cache bytes and the kernels.

        The graph entries and kernels this process was served since the last
        capture (`served()`) are counted as hits in the environment's
        statistics too, and Inductor's graph misses since then as misses.
        """
        saved = _import_torch().compiler.save_cache_artifacts()
        new = None
        if saved is not None and not _identities(saved[1]) <= self._known:
            new = bytes(saved[0])  # something not loaded at start-up
        with self._lock:
            served = served_here(self.cache_dir, self._present)
            delta = {
                part: {k: n - self._recorded.get(part, {}).get(k, 0) for k, n in hits.items()}
                for part, hits in served.items()
            }
            misses = self.misses
            report = block_on(
                _capture_in,
                self._where,
                self.cache_dir,
                new,
                delta,
                max(misses - self._recorded_misses, 0),
            )
            self._recorded = served
            self._recorded_misses = misses
            return report

    def capture_at_exit(self) -> None:
        atexit.register(self._capture_at_exit)

    def _capture_at_exit(self) -> None:
        try:
            report = self.capture()
        except Exception:  # an exit hook must not turn a clean exit into a traceback
            log.exception("capturing the torch cache at exit failed")
        else:
            log.info("%s", report)


async def _capture_in(
    chosen: _Where,
    cache_dir: Path,
    artifacts: bytes | None,
    served: dict[str, dict[str, int]],
    misses: int = 0,
) -> TorchCaptureReport:
    async with open_environment(chosen.name, root=chosen.root, file=chosen.file) as env:
        report = await capture(env, cache_dir, artifacts)
        facts = await anyio.to_thread.run_sync(Facts.here, *FACTS)
        trees = {t.part: t for t in (tree(facts), *_graph_trees(facts))}
        for part, hits in served.items():
            if part in trees and any(n > 0 for n in hits.values()):
                await record_hits(env, trees[part], {k: n for k, n in hits.items() if n > 0})
        if misses:
            await record_hits(env, trees[MISSES_PART], {}, misses)
        return report


async def _restore_in(
    chosen: _Where, cache_dir: Path
) -> tuple[TorchRestoreReport, tuple[bytes, ...]]:
    async with open_environment(chosen.name, root=chosen.root, file=chosen.file) as env:
        report, facts = await _restore(env, cache_dir)
        return report, await _artifacts(env, facts)  # the facts read once


def use(
    env: EnvironmentChoice = None,
    *,
    root: str | Path | None = None,
    cache_dir: str | Path | None = None,
    capture_at_exit: bool = True,
) -> TorchWarmed:
    """Restore torch.compile's caches from `env`; call before the first `torch.compile`.

    `env`: an environment's name (default: the configured one) or an open
    `warmenv.blocking` environment. `cache_dir` is Inductor's cache
    directory: `TORCHINDUCTOR_CACHE_DIR` if set, else
    `<root>/<environment>.caches/torch`, the environment's own
    (and `TORCHINDUCTOR_CACHE_DIR` is set to it). The kernels are written
    there, then torch loads the Mega-Cache. With `capture_at_exit`, what
    this process compiled is captured when the interpreter exits
    (`TorchWarmed.capture()` does it at once).
    """
    given = "cache_dir"
    if cache_dir is None:
        configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        given = "TORCHINDUCTOR_CACHE_DIR" if configured else given
        cache_dir = Path(configured) if configured else default_cache_dir(env, root=root)
    directory = Path(os.path.abspath(expand_home(cache_dir, given)))
    torch = _import_torch()
    _listen()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    chosen = where(env, root)
    report, mega = block_on(_restore_in, chosen, directory)
    for skipped in report.kernels.skipped:
        log.info("skipped %s: %s", skipped.namespace, "; ".join(skipped.reasons))
    loaded = 0
    known: frozenset[str] = frozenset()
    for entry in mega:
        info = torch.compiler.load_cache_artifacts(entry)
        if info is None:
            log.warning("torch could not load a Mega-Cache entry (torch logged why)")
            continue
        loaded += 1
        known |= _identities(info)
    present = kernels_in(directory)
    warmed = TorchWarmed(directory, report, loaded, where=chosen, known=known, present=present)
    if capture_at_exit:
        warmed.capture_at_exit()
    return warmed


def hits() -> tuple[int, int, float]:
    """This process's FX graph cache hits and misses, by Inductor's counters, and 0.0.

    `(0, 0, 0.0)` when torch has not been imported. Inductor records no
    compile time per hit, so what a hit saved is not known here.
    """
    utils = _loaded("torch._dynamo.utils")
    if utils is None:
        return 0, 0, 0.0
    inductor = utils.counters["inductor"]
    return int(inductor["fxgraph_cache_hit"]), int(inductor["fxgraph_cache_miss"]), 0.0


_lock = threading.Lock()
_graph_keys: dict[str, int] = {}
_listening = [False]


def listen() -> None:
    """Read Inductor's hit lines from now on, as `use()` does (`served_here` names them)."""
    _listen()


def _on_hit_key(key: str) -> None:
    with _lock:
        _graph_keys[key] = _graph_keys.get(key, 0) + 1


def _listen() -> None:
    with _lock:
        if _listening[0]:
            return
        _listening[0] = True
    HitLines.install(_HIT_LOGGER, logging.INFO, _HIT_LINE, _on_hit_key)


def kernels_in(cache_dir: str | Path) -> frozenset[str]:
    """The kernels (`.so`, relative paths) under `cache_dir` now."""
    base = Path(cache_dir)
    found = set()
    for directory, _, names in os.walk(base):
        for name in names:
            if name.endswith(".so"):
                found.add(os.path.relpath(os.path.join(directory, name), base))
    return frozenset(Path(p).as_posix() for p in found)


def served_here(cache_dir: str | Path, present: frozenset[str]) -> dict[str, dict[str, int]]:
    """This process's hits per captured entry under `cache_dir`, by tree part.

    `{"fxgraph": {relative path: hits}, "kernels": {relative path: 1}}`: each
    graph hit Inductor logged (since `use()`), as a hit of the first entry
    file under its key's directory; each kernel of `present` (those there
    before this process compiled: a kernel it built itself is no hit) that
    this process has mapped (Linux's `/proc/self/maps`), once.
    """
    base = Path(os.path.abspath(cache_dir))
    with _lock:
        keys = dict(_graph_keys)
    graphs: dict[str, int] = {}
    for key, count in keys.items():
        if len(key) < 3 or "/" in key or key.startswith("."):
            continue
        directory = base / "fxgraph" / key[1:3] / key
        try:
            names = sorted(e.name for e in os.scandir(directory) if e.is_file())
        except OSError:
            continue
        if names:
            graphs[f"{key[1:3]}/{key}/{names[0]}"] = count
    kernels: dict[str, int] = {}
    prefix = f"{base}{os.sep}"
    # Line by line: the kernel writes the map, one line per mapping, as many as the process has.
    with (
        contextlib.suppress(OSError),
        open("/proc/self/maps", encoding="utf-8", errors="replace") as maps,
    ):
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6:
                continue  # an anonymous mapping
            path = fields[5].strip()
            relative = path.removeprefix(prefix)
            if path.startswith(prefix) and relative in present:
                kernels[relative] = 1
    return {"fxgraph": graphs, "kernels": kernels}


def _loaded(module: str) -> Any:
    return sys.modules.get(module)


def _identities(info: Any) -> frozenset[str]:
    """The artifacts a Mega-Cache holds, by kind and key (torch's `CacheInfo.artifacts`)."""
    return frozenset(f"{kind}/{key}" for kind, keys in info.artifacts.items() for key in keys)


def _import_torch() -> Any:
    try:
        torch = importlib.import_module("torch")
        importlib.import_module("torch._dynamo.utils")
    except ImportError as error:
        raise ImportError(f"warmenv.caches.torch needs torch: {install_hint('torch')}") from error
    return torch
