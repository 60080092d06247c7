"""Progress events and reports of import and export.

An import or export yields `BundleStarted` once, `BundleProgress` at least
once per batch (cumulative counts, so a consumer that drops events still
shows the truth), and `BundleFinished` with the report. An import from a
URL yields `Downloading` events before `BundleStarted`, while the bundle
is fetched (an export never does); an import that checks the digest yields
`Verifying` events after `BundleStarted`, while the digest is computed, and
before the first `BundleProgress`. Command-line
progress bars, logs and tests all read the same events.

`BundleFinished` is generic in its report, so an import's events carry an
`ImportReport` and an export's an `ExportReport` for the type checker too:
`event.report.imported` needs no cast in an import loop. The short names of
0.1 (`Started`, `Progress`, `Finished`, `Event`) stay as aliases; the
`Bundle*` names exist because `Progress` and `Event` collide with rich's
`Progress` and `warmenv.sync.Event` in the same module.

The operation runs as its events are consumed. Leaving the `async with`
block without having iterated runs it to completion (it is what was asked
for); leaving it after iterating stops it after its last whole batch.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Generic, TypeAlias, TypeVar

import attrs

from warmenv._errors import WarmenvError
from warmenv._keys import PublicKey
from warmenv.bundle.manifest import BundleManifest
from warmenv.persistence.storage import NamespaceSummary

__all__ = [
    "BundleEvent",
    "BundleFinished",
    "BundleProgress",
    "BundleStarted",
    "Downloading",
    "Event",
    "EventStream",
    "EventStreamBase",
    "ExportEvent",
    "ExportReport",
    "Finished",
    "ImportEvent",
    "ImportReport",
    "NotFinishedError",
    "Progress",
    "Started",
    "Verifying",
]


class NotFinishedError(WarmenvError, RuntimeError):
    """A report was asked of an operation that did not run to its end."""


@attrs.frozen
class ImportReport:
    """What an import did; `namespaces` counts the entries and bytes imported per namespace.

    `complete` is false for the report of an import that was stopped early
    (the block left while iterating, cancelled, or failed): the counts are
    then those of the batches committed before it stopped.
    """

    namespaces: tuple[NamespaceSummary, ...]
    imported: int
    skipped: int
    failed: int
    rejected: int
    bytes: int
    elapsed: float
    complete: bool = True
    other_versions: tuple[str, ...] = ()
    """The bundle's namespaces left out because they carry another version than the one
    the import was given (`version=`): no lookup of that version could hit them."""
    signer: PublicKey | None = None
    """The trusted key whose signature was checked, or None (unsigned, or none checked)."""
    paused: float = 0.0
    """Seconds the import paused between batches to keep to its `share` of the time
    (included in `elapsed`)."""


@attrs.frozen
class ExportReport:
    """What an export wrote; `namespaces` counts the entries and bytes per namespace."""

    manifest: BundleManifest
    path: Path
    entries: int
    bytes: int
    namespaces: tuple[NamespaceSummary, ...]
    elapsed: float
    left_out: int = 0
    """Rows of the sources left out because their namespace is not UTF-8 text (another
    program wrote them): no reader could address them, so no bundle carries them."""


@attrs.frozen
class BundleStarted:
    """The operation began: which namespaces, and how many entries and bytes in all."""

    namespaces: tuple[str, ...]
    total_entries: int
    total_bytes: int


@attrs.frozen
class BundleProgress:
    """Cumulative counts after a batch; `namespace` is the one last written."""

    namespace: str
    entries_done: int
    total_entries: int
    bytes_done: int
    total_bytes: int


@attrs.frozen
class Downloading:
    """A bundle named by URL is being fetched: bytes on disk so far, and the whole if known.

    Cumulative, like `BundleProgress`; `total_bytes` is `None` when the
    server did not say how long the body is. A download that resumes after
    a dropped connection keeps counting from where it was; one that has to
    start over (the file changed on the server) goes back to 0.
    """

    bytes_done: int
    total_bytes: int | None
    elapsed: float = 0.0  # seconds since the download began

    @property
    def bytes_per_second(self) -> float:
        """The mean rate so far (0 before the first second's first byte)."""
        return self.bytes_done / self.elapsed if self.elapsed > 0 else 0.0


@attrs.frozen
class Verifying:
    """The digest is being checked: bytes of keys and values hashed so far, of the whole.

    Cumulative, like `BundleProgress`. The first comes at 0, the last at
    `total_bytes` once every entry is hashed (the comparison with the
    manifest follows). A SQLite bundle whose rows are not stored in key
    order is hashed a second time in order, and the count then starts again
    from 0. `compute_digest(progress=...)` and `verify(progress=...)` of a
    bundle report the same events.
    """

    bytes_done: int
    total_bytes: int


R = TypeVar("R", ImportReport, ExportReport)


@attrs.frozen
class BundleFinished(Generic[R]):
    """The operation completed; `report` says what it did (typed by the direction)."""

    report: R


ImportEvent: TypeAlias = (
    Downloading | BundleStarted | Verifying | BundleProgress | BundleFinished[ImportReport]
)
ExportEvent: TypeAlias = BundleStarted | BundleProgress | BundleFinished[ExportReport]
BundleEvent: TypeAlias = ImportEvent | ExportEvent

# The 0.1 names, kept working.
Started = BundleStarted
Progress = BundleProgress
Finished = BundleFinished
Event: TypeAlias = BundleEvent


E = TypeVar("E")


class EventStreamBase(Generic[E, R]):
    """The events `E` of one import or export, produced as they are consumed.

    `aclose()` (which `importing` and `exporting` call when their block
    exits) stops the operation after its last whole batch; `finish()` runs
    it to its end when nobody iterated. `report` is there once
    `BundleFinished` has been seen; see the subclasses for what it says
    after an early stop.
    """

    _operation = "operation"

    def __init__(self) -> None:
        self._report: R | None = None
        self._events: AsyncGenerator[E, None] | None
        self._events = None
        # Set by the operation's first step, so "never iterated" is exact
        # even when `aiter()` was called but no event was asked for.
        self._started = False
        self._closed = False

    @property
    def report(self) -> R:
        """What the operation did; `NotFinishedError` if it did not run to its end."""
        if self._report is not None:
            return self._report
        partial = self._partial_report()
        if partial is not None:
            return partial
        raise NotFinishedError(self._not_finished())

    def _not_finished(self) -> str:
        if not self._started:
            if self._closed:
                return (
                    f"the {self._operation} did not run: the block was left with an error "
                    "before any event was read"
                )
            return (
                f"the {self._operation} has not run yet: iterate over the events, or leave "
                "the block to run it to its end"
            )
        return f"the {self._operation} has not finished yet; iterate over the events first"

    def _partial_report(self) -> R | None:
        """The report of an operation stopped early, where one means something."""
        return None

    def __aiter__(self) -> AsyncIterator[E]:
        events = self._events
        if events is None:
            events = self._events = self._events_once()
        return events

    async def _events_once(
        self,
    ) -> AsyncGenerator[E, None]:
        self._started = True
        run = self._run()
        try:
            async for event in run:
                yield event
        finally:
            await run.aclose()

    async def finish(self) -> None:
        """Run the operation to its end if nobody has started iterating (else do nothing)."""
        if self._started or self._closed:
            return
        async for _ in self:
            pass

    async def aclose(self) -> None:
        """Stop the operation after its last whole batch (idempotent)."""
        self._closed = True
        if self._events is not None:
            await self._events.aclose()

    def _run(self) -> AsyncGenerator[E, None]:
        raise NotImplementedError


class EventStream(EventStreamBase[BundleStarted | BundleProgress | BundleFinished[R], R]):
    """A stream with no download before it: an export's, typed by its report."""
