"""The in-process form every tool's `use()` shares: restore now, count hits, capture at exit.

A tool's `use(env)` is called once at start-up, from synchronous code,
before the first compile. It restores the tool's captured files into the
cache directory the tool is then pointed at, and (by default) captures that
directory again when the interpreter exits, so the next machine gets what
this one compiled. The environment is opened for each of these two steps
on an event loop of its own (`warmenv.future.block_on`), by name or by the
file of a `BlockingEnvironment`, so `use()` neither needs nor holds an
open environment while the application runs, and never blocks an
application's event loop: called on a thread whose loop is running, it
raises and says to use the async `restore`/`capture` instead.

`Warmed` is what `use()` returns: what was restored, the hits the tool's
own counters report so far, and `capture()`.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import final

import attrs

from warmenv.caches._home import EnvironmentChoice, not_an_environment
from warmenv.caches._restore import restore
from warmenv.caches._tree import (
    CacheTree,
    CaptureReport,
    RestoreReport,
    capture,
    record_hits,
)
from warmenv.environment import open_environment
from warmenv.future import block_on

__all__ = ["EnvironmentChoice", "HitLines", "Tally", "Warmed", "where"]

log = logging.getLogger("warmenv.caches")


@final
@attrs.frozen
class Tally:
    """A tool's own counts in this process, read together in one pass.

    One pass because reading them can cost: Numba's are found by walking
    every object of the process, which a capture would otherwise do twice.
    """

    hits: int
    misses: int
    saved_seconds: float = 0.0
    """Compile seconds the tool reports its hits saved (0.0 if it does not say)."""
    served: Mapping[str, int] = attrs.field(factory=dict)
    """Hits per captured entry, where the tool names the entry it served."""


@attrs.frozen
class _Where:
    name: str | None
    root: Path | None
    file: Path | None

    async def restore(self, tree: CacheTree, target: Path) -> RestoreReport:
        async with open_environment(self.name, root=self.root, file=self.file) as env:
            return await restore(env, tree, target)

    async def capture(
        self, tree: CacheTree, source: Path, served: Mapping[str, int], misses: int = 0
    ) -> CaptureReport:
        async with open_environment(self.name, root=self.root, file=self.file) as env:
            report = await capture(env, tree, source)
            if served or misses:
                await record_hits(env, tree, served, misses)
            return report


def where(env: EnvironmentChoice, root: str | Path | None) -> _Where:
    """Which environment the in-process hooks open, from what `use()` was given."""
    if env is None or isinstance(env, str):
        return _Where(env, None if root is None else Path(root), None)
    # Imported here: a process given an environment's name never needs the blocking face.
    from warmenv.blocking import BlockingEnvironment

    if isinstance(env, BlockingEnvironment):
        if env.in_memory:
            raise ValueError(
                f"{env.describe()} lives in memory, which this process's compiler hooks cannot "
                "reopen; give an environment on disk (or its name)"
            )
        return _Where(None, None, env.path)
    raise not_an_environment(env)


@final
@attrs.define(eq=False)
class Warmed:
    """What a tool's `use()` set up in this process."""

    tool: str
    cache_dir: Path
    """The directory the tool now caches in."""
    restored: RestoreReport
    """What the restore at start-up wrote."""
    _tree: CacheTree = attrs.field(alias="tree")
    _where: _Where = attrs.field(alias="where")
    _tally: Callable[[], Tally] = attrs.field(alias="tally")
    _recorded: dict[str, int] = attrs.field(factory=dict, init=False)
    _recorded_misses: int = attrs.field(default=0, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    @property
    def hits(self) -> int:
        """Compilations the tool served from its cache so far, by its own counter."""
        return self._tally().hits

    @property
    def misses(self) -> int:
        """Compilations the tool looked up in its cache and did not find, by its own counter."""
        return self._tally().misses

    @property
    def saved_seconds(self) -> float:
        """Compile seconds the tool reports its hits saved (0.0 if it does not say)."""
        return self._tally().saved_seconds

    def capture(self) -> CaptureReport:
        """Store the cache directory as it is now into the environment.

        The tool's hits per entry since the last capture, where it reports
        them (Numba, JAX), and its misses since then are counted in the
        environment's statistics too.
        """
        with self._lock:
            tally = self._tally()  # once: Numba's walks every object of the process
            served, misses = dict(tally.served), tally.misses
            delta = {k: n - self._recorded.get(k, 0) for k, n in served.items()}
            report = block_on(
                self._where.capture,
                self._tree,
                self.cache_dir,
                {k: n for k, n in delta.items() if n > 0},
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
            log.exception("capturing the %s cache at exit failed", self.tool)
        else:
            log.info("%s", report)


def restored(
    tool: str,
    tree: CacheTree,
    cache_dir: Path,
    env: EnvironmentChoice,
    root: str | Path | None,
    tally: Callable[[], Tally],
) -> Warmed:
    """Restore `tree` into `cache_dir` now and return the handle `use()` gives back."""
    chosen = where(env, root)
    report = block_on(chosen.restore, tree, cache_dir)
    for skipped in report.skipped:
        log.info("skipped %s: %s", skipped.namespace, "; ".join(skipped.reasons))
    return Warmed(tool, cache_dir, report, tree=tree, where=chosen, tally=tally)


# --- hits named by a tool's own log line -------------------------------------------


@final
class HitLines(logging.Filter):
    """On a tool's logger: hands each hit line's key to `on_key`, passes on what passed before.

    Some tools count hits without naming the entry (JAX's monitoring events,
    Inductor's counters) but log a line naming its key for each hit, below
    the level their loggers show. `install` lowers the logger's level so the
    line reaches this filter; every record below the level the logger had
    before (its own, else its parents') is dropped here, so its handlers
    and its parents' see what they saw without it. A level set on the
    logger afterwards governs it again (and hides the hit line, if above).
    """

    def __init__(
        self, logger: logging.Logger, level: int, line: str, on_key: Callable[[str], None]
    ) -> None:
        super().__init__()
        self._logger = logger
        self._level = level
        self._lowered = logger.level
        self._line = line
        self._on_key = on_key

    @classmethod
    def install(cls, name: str, level: int, line: str, on_key: Callable[[str], None]) -> HitLines:
        """Listen on logger `name` for `line` (logged at `level`, its key the last argument)."""
        logger = logging.getLogger(name)
        found = cls(logger, logger.level, line, on_key)
        logger.addFilter(found)
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)
        found._lowered = logger.level
        return found

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg == self._line and isinstance(args, tuple) and args:
            key = args[-1]
            if isinstance(key, str) and key:
                self._on_key(key)
        return record.levelno >= self._passing()

    def _passing(self) -> int:
        if self._logger.level != self._lowered:
            return logging.NOTSET  # the application set its level since: that level decided
        if self._level != logging.NOTSET:
            return self._level
        parent = self._logger.parent
        return parent.getEffectiveLevel() if parent is not None else logging.WARNING
