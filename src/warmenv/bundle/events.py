"""Progress events and reports of import and export.

An import or export yields `Started` once, `Progress` at least once per batch
(cumulative counts, so a consumer that drops events still shows the truth),
and `Finished` with the report. Command-line progress bars, logs and tests
all read the same events.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeAlias

import attrs

from warmenv.bundle.manifest import BundleManifest
from warmenv.persistence.storage import NamespaceSummary

__all__ = ["Event", "ExportReport", "Finished", "ImportReport", "Progress", "Started"]


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
    namespaces: tuple[str, ...]
    total_entries: int
    total_bytes: int


@attrs.frozen
class Progress:
    namespace: str
    entries_done: int
    total_entries: int
    bytes_done: int
    total_bytes: int


@attrs.frozen
class Finished:
    report: ImportReport | ExportReport


Event: TypeAlias = Started | Progress | Finished
