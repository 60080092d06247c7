"""Progress on a terminal: rich's bar with rate, bytes and time left, drawn lazily.

Imported only when a bar is drawn on a terminal (rich is the `cli` extra).
What a bar shows follows from what the operation measures: an import or
export counts entries and bytes (entries done and entries/s, bytes done and
bytes/s, and the time left estimated from the bytes), a download and a
digest check (`warmenv verify`, an import's verify phase) count bytes, and
the demo's warm-up counts entries.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

from warmenv._text import plural
from warmenv.cli._format import per_second, size


class EntriesColumn(ProgressColumn):
    """`1,024/40,000 entries`, from the task's `entries` and `total_entries` fields."""

    def render(self, task: Task) -> Text:
        done, total = task.fields.get("entries", 0), task.fields.get("total_entries")
        shown = plural(done, "entry", "entries") if total is None else f"{done:,}/{total:,} entries"
        return Text(shown, style="progress.download")


class EntriesRateColumn(ProgressColumn):
    """`12,345 entries/s`, from the task's `entries_per_second` field (see `ProgressBar.rate`)."""

    def render(self, task: Task) -> Text:
        rate = task.fields.get("entries_per_second")
        shown = "? entries/s" if rate is None else per_second(rate)
        return Text(shown, style="progress.data.speed")


class BytesRateColumn(ProgressColumn):
    """`21.4 MiB/s`, from the task's `bytes_per_second` field, in the units of every size
    the command prints (rich's `TransferSpeedColumn` would say MB/s beside MiB)."""

    def render(self, task: Task) -> Text:
        rate = task.fields.get("bytes_per_second")
        shown = "?" if rate is None else size(int(rate))
        return Text(f"{shown}/s", style="progress.data.speed")


class TimeLeftColumn(TimeRemainingColumn):
    """`eta 0:00:03`; nothing while the total is unknown (a download of unsaid length)."""

    def render(self, task: Task) -> Text:
        left = super().render(task)
        return Text.assemble("eta ", left) if left.plain else left


def progress(console: Console, *, entries: bool, bytes: bool) -> RichProgress:
    """A rich display for one bar measuring `bytes` (its total is the task's), `entries`
    (the task's total when there are no bytes, else fields), or both."""
    columns: list[ProgressColumn | str] = [TextColumn("{task.description}", markup=False)]
    columns.append(BarColumn())
    if entries and bytes:
        columns += [EntriesColumn(), EntriesRateColumn()]
    elif entries:
        columns += [MofNCompleteColumn(), EntriesRateColumn()]
    if bytes:
        columns += [DownloadColumn(binary_units=True), BytesRateColumn()]
    columns.append(TimeLeftColumn())
    return RichProgress(*columns, console=console)
