"""A background warm-up: import a bundle while the application serves, and never fall over.

A service imports its bundle in the background so that it can serve at
once; requests the import has not reached yet compute their keys. Started
with `tasks.start_soon(import_bundle, ...)` in the service's own task group,
a bad bundle (corrupt, truncated, missing, of another version) raised into
that task group: it ended the lifespan, closed the environment, and the
server went on answering 500s. `warm_up` is the form that cannot do that:
the import runs in a task of the environment's (`Environment.start_soon`),
or of a task group the caller passes; an import that fails is logged,
recorded with the environment's statistics (`warmenv stats`) and kept on
its handle, and the environment stays open and serving. Closing the
environment cancels a warm-up still running, after its last whole batch.

The handle (`WarmUp`) says where the import is (`latest` event, `state`),
what it did (`report`, partial after a failure) and why it failed (`error`);
`await handle.wait()` waits for its end without ever raising its error.
"""

from __future__ import annotations

import enum
import inspect
import logging
import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Unpack, final

import anyio
import anyio.abc

from warmenv._errors import WarmenvError
from warmenv._url import is_url, redact
from warmenv.bundle.base import Bundle
from warmenv.bundle.events import BundleStarted, ImportEvent, ImportReport, NotFinishedError
from warmenv.bundle.importing import ImportProgress, importing
from warmenv.bundle.options import ImportOptions, check_options
from warmenv.environment import Environment
from warmenv.persistence.statistics import ImportOutcome, ImportRecord
from warmenv.persistence.storage import wall_clock

__all__ = ["WarmUp", "WarmUpState", "check_timeout", "warm_up"]

log = logging.getLogger("warmenv.bundle")

OnEvent = Callable[[ImportEvent], object]
"""Called with each event; if it returns an awaitable, the warm-up awaits it."""

_RECORD_SECONDS = 5.0  # how long recording the outcome may hold a closing environment


class WarmUpState(enum.Enum):
    """Where a warm-up is: running, or how it ended."""

    RUNNING = "running"
    FINISHED = "finished"
    """Imported to its end: `report` says what it did."""
    FAILED = "failed"
    """Stopped on an error (`error`); what it committed before stays imported."""
    CANCELLED = "cancelled"
    """Cancelled (`cancel()`, the environment closed); whole batches stay imported."""


def warm_up(
    source: str | Path | Bundle,
    env: Environment,
    *,
    task_group: anyio.abc.TaskGroup | None = None,
    on_event: OnEvent | None = None,
    **options: Unpack[ImportOptions],
) -> WarmUp:
    """Start importing `source` into `env` in the background; the handle, at once.

    `options` are every import's (`ImportOptions`, as for `import_bundle`);
    a keyword they do not list raises `TypeError` here, at the call. The
    import runs in the task group of `open_environment`'s block (or
    `task_group`, one the caller entered), and nothing it raises leaves it:
    a failure is logged (logger `warmenv.bundle`, ERROR), recorded with the
    environment's statistics and kept as `handle.error`, and the environment
    stays open. `on_event` is called with each import event, on the event
    loop (a callable returning an awaitable is awaited); if it raises, the
    warm-up fails.

    The arguments are checked here, at the call (`TypeError`/`ValueError`,
    as `import_bundle` raises them): a mistake in the code is raised, never
    logged as a failed warm-up.
    """
    given = check_options(source, env, options, "warm_up")
    if on_event is not None and not callable(on_event):
        raise TypeError(f"on_event must be a function, got {type(on_event).__name__} {on_event!r}")
    if given is not None:
        options = {**options, "trust": given}  # the keys parsed once, here
    label = _label(source)
    run = _Run(label)

    async def operation() -> None:
        async with importing(source, env, **options) as progress:
            run.progress = progress
            async for event in progress:
                run.seen(event)
                if on_event is not None:
                    reply = on_event(event)
                    if inspect.isawaitable(reply):
                        await reply

    env.start_soon(
        run.run, env, operation, name=f"warmenv warm-up of {label}", task_group=task_group
    )
    return WarmUp(run)


def check_timeout(timeout: object) -> None:
    """A wait's `timeout`: `None` (no bound) or seconds >= 0; one line at the call if not."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be seconds (a number) or None, got {timeout!r}")
    if not timeout >= 0:  # NaN fails this too
        raise ValueError(f"timeout must be seconds >= 0 or None, got {timeout!r}")


def _label(source: str | Path | Bundle) -> str:
    if is_url(source):
        return redact(str(source))
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return source.describe()


@final
class _Run:
    """The state of one warm-up, written by its task and read through its handle."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.state = WarmUpState.RUNNING
        self.error: Exception | None = None
        self.latest: ImportEvent | None = None
        self.bundle: str | None = None
        self.progress: ImportProgress | None = None
        self.final: ImportReport | None = None
        self.ended = anyio.Event()
        self.scope = anyio.CancelScope()

    def seen(self, event: ImportEvent) -> None:
        self.latest = event
        if isinstance(event, BundleStarted) and self.progress is not None:
            manifest = self.progress.manifest
            self.bundle = None if manifest is None else manifest.name

    def report(self) -> ImportReport | None:
        if self.final is not None:
            return self.final
        if self.progress is None:
            return None
        try:
            return self.progress.report
        except NotFinishedError:
            return None

    async def run(self, env: Environment, operation: Callable[[], Awaitable[None]]) -> None:
        outcome = ImportOutcome.CANCELLED
        try:
            with self.scope:
                log.info("warm-up of %s started", self.label)
                await operation()
                self.final = self.report()
                self.state = WarmUpState.FINISHED
                outcome = ImportOutcome.IMPORTED
                done = self.final
                if done is not None:
                    log.info(
                        "warm-up of %s finished: imported %d, skipped %d in %.2f s",
                        self.label,
                        done.imported,
                        done.skipped,
                        done.elapsed,
                    )
        except Exception as exc:
            self.error = _one(exc)
            self.state = WarmUpState.FAILED
            outcome = ImportOutcome.FAILED
            # A WarmenvError says what was wrong and what to do; anything else is a bug
            # worth its traceback.
            log.error(
                "warm-up of %s failed, serving without it (what it would have held is "
                "computed): %s",
                self.label,
                _line(self.error),
                exc_info=None if isinstance(self.error, _expected) else self.error,
            )
        finally:
            if self.state is WarmUpState.RUNNING:
                self.state = WarmUpState.CANCELLED
                log.info("warm-up of %s cancelled", self.label)
            self.final = self.report()
            try:
                with anyio.CancelScope(shield=True) as recording:
                    recording.deadline = anyio.current_time() + _RECORD_SECONDS
                    await env.record_import(self.record(outcome))
            except Exception as exc:  # a closed environment, a full disk: logged, not raised
                log.warning("could not record the warm-up of %s: %s", self.label, _line(exc))
            finally:
                self.ended.set()

    def record(self, outcome: ImportOutcome) -> ImportRecord:
        report = self.final
        return ImportRecord(
            source=self.label,
            outcome=outcome,
            at=wall_clock(),
            bundle=self.bundle,
            imported=0 if report is None else report.imported,
            skipped=0 if report is None else report.skipped,
            failed=0 if report is None else report.failed,
            error=None if self.error is None else _line(self.error),
        )


_expected = (WarmenvError, OSError)


def _one(exc: Exception) -> Exception:
    """The error itself, out of the exception groups a task group wraps it in."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@final
class WarmUp:
    """A warm-up started by `warm_up`: where it is, what it did, why it failed.

    Reading it never raises: a failed warm-up is a state (`FAILED`, with
    `error`), not an exception, so a service can show it (a readiness
    probe, a log line) and keep serving.
    """

    __slots__ = ("_run",)

    def __init__(self, run: _Run) -> None:
        self._run = run

    @property
    def source(self) -> str:
        """What is imported: the path, or the URL with its credentials hidden."""
        return self._run.label

    @property
    def state(self) -> WarmUpState:
        return self._run.state

    @property
    def done(self) -> bool:
        """Whether it has ended (finished, failed or cancelled)."""
        return self._run.ended.is_set()

    @property
    def report(self) -> ImportReport | None:
        """What it imported: the whole report once `FINISHED`; otherwise what the batches
        committed so far (`complete=False`), or `None` before the bundle was opened.

        After a failure: `None` if the bundle never opened (missing, truncated, not a
        bundle, a failed download, stale by its header); a report (`complete=False`,
        0 imported if it failed before its first batch, as a corrupt one does at its
        digest check) once it had."""
        return self._run.report()

    @property
    def error(self) -> Exception | None:
        """Why it failed (`FAILED`), else `None`."""
        return self._run.error

    @property
    def latest(self) -> ImportEvent | None:
        """The last import event (they are cumulative: it says how far it got)."""
        return self._run.latest

    def cancel(self) -> None:
        """Stop it after its last whole batch (what was committed stays); idempotent."""
        self._run.scope.cancel()

    # ASYNC109 asks for a cancel scope instead of a timeout, and `move_on_after` around
    # wait() works as well; the timeout is here so that both faces of the handle read
    # alike (`BlockingWarmUp.wait`, where no cancel scope exists, needs one) and so
    # that a readiness probe gets its answer, whether it ended in time, as the result.
    async def wait(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until it has ended, or `timeout` seconds (`None`: no bound); whether it has
        ended. Never raises its error (read `state` and `error`). `BlockingWarmUp.wait`
        takes and returns the same (a test compares them)."""
        check_timeout(timeout)
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            await self._run.ended.wait()
        return self._run.ended.is_set()

    def __repr__(self) -> str:
        return f"<WarmUp of {self.source!r}: {self.state.value}>"
