"""Progress events and reports of import and export.

An import or export yields `Started` once, `Progress` at least once per batch
(cumulative counts, so a consumer that drops events still shows the truth),
and `Finished` with the report. Command-line progress bars, logs and tests
all read the same events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Generic, TypeAlias, TypeVar

import attrs

from warmenv.bundle.manifest import BundleManifest
from warmenv.persistence.storage import NamespaceSummary

__all__ = [
    "Event",
    "EventStream",
    "ExportReport",
    "Finished",
    "ImportReport",
    "Progress",
    "Started",
]


@attrs.frozen
class ImportReport:
    """What an import did; `namespaces` counts the entries and bytes imported per namespace."""

    namespaces: tuple[NamespaceSummary, ...]
    imported: int
    skipped: int
    failed: int
    rejected: int
    bytes: int
    elapsed: float


@attrs.frozen
class ExportReport:
    """What an export wrote; `namespaces` counts the entries and bytes per namespace."""

    manifest: BundleManifest
    path: Path
    entries: int
    bytes: int
    namespaces: tuple[NamespaceSummary, ...]
    elapsed: float


@attrs.frozen
class Started:
    """The operation began: which namespaces, and how many entries and bytes in all."""

    namespaces: tuple[str, ...]
    total_entries: int
    total_bytes: int


@attrs.frozen
class Progress:
    """Cumulative counts after a batch; `namespace` is the one last written."""

    namespace: str
    entries_done: int
    total_entries: int
    bytes_done: int
    total_bytes: int


@attrs.frozen
class Finished:
    """The operation completed; `report` says what it did."""

    report: ImportReport | ExportReport


Event: TypeAlias = Started | Progress | Finished


R = TypeVar("R", ImportReport, ExportReport)


class EventStream(Generic[R]):
    """The events of one import or export, produced as they are consumed.

    The operation advances only while someone iterates; `aclose()` (which
    `importing` and `exporting` call when their block exits) stops it after
    its last whole batch. `report` is there once `Finished` has been seen.
    """

    _operation = "operation"

    def __init__(self) -> None:
        self._report: R | None = None
        self._events: AsyncGenerator[Event, None] | None = None

    @property
    def report(self) -> R:
        """What the operation did; `RuntimeError` until `Finished` has been seen."""
        if self._report is None:
            raise RuntimeError(
                f"the {self._operation} has not finished; iterate over the events first"
            )
        return self._report

    def __aiter__(self) -> AsyncIterator[Event]:
        events = self._events
        if events is None:
            events = self._events = self._run()
        return events

    async def aclose(self) -> None:
        """Stop the operation after its last whole batch (idempotent)."""
        if self._events is not None:
            await self._events.aclose()

    def _run(self) -> AsyncGenerator[Event, None]:
        raise NotImplementedError
