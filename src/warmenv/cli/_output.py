"""What a command prints: tables, lines, warnings, progress, prompts and JSON results.

Everything the command prints goes through `Output`, and every piece of text
`Output` prints goes through `clean()` first. Bundles, environments and
paths are untrusted input: a bundle name holding `ESC [2J` would otherwise
clear the user's screen, and one holding a newline could forge an "ok" line.
Escaping at the one place where text leaves the process, rather than at
each call site, means no new command can forget it.

On a terminal with rich installed, tables and progress bars are rich's
(the bar's columns are in `_progress`, imported only when one is drawn);
elsewhere they are plain lines, and with `--json` or `--quiet` nothing but
warnings, errors and the final result. With `--json` standard output holds
one JSON document and nothing else: the result, or the error (with the
result, when there was one), written once as the command ends.
"""

from __future__ import annotations

import contextlib
import json as jsonlib
import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs

from warmenv._text import clean, utf8_safe
from warmenv.bundle import Finished, Progress, Started, Verifying
from warmenv.bundle.events import Event, ExportReport, ImportReport
from warmenv.cli._format import as_json, per_second, size


def _rich_console() -> Any | None:
    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    # Markup, emoji codes and highlighting off: every string printed is literal.
    return Console(markup=False, emoji=False, highlight=False)


class _LogToOutput(logging.Handler):
    """warmenv's log warnings as one clean line each on stderr."""

    def __init__(self, out: Output) -> None:
        super().__init__(logging.WARNING)
        self._out = out

    def emit(self, record: logging.LogRecord) -> None:
        self._out.warning(record.getMessage())


class Output:
    """Writes tables, progress and results as rich output, plain lines or JSON.

    Also the command's state on the way out: `when_interrupted` is what an
    interrupted command says it left behind.
    """

    def __init__(self, *, json: bool, quiet: bool = False) -> None:
        self.json = json
        self.quiet = quiet
        self.console = None if json else _rich_console()
        self.when_interrupted = ""
        # What a command that completed although a stop signal came says about
        # its result (the signal still decides the exit status).
        self.when_completed = "it had completed"
        self.stopped: list[int] = []  # the stop signals received, first first
        self.entries_done = 0  # how far the running import or export got
        # What to say on stderr if whoever read stdout stops reading (None: nothing).
        self.when_output_closed: Callable[[], str] | None = None
        self.subject: object = None  # the file the command works on, for errors without one
        self.subcommand: str | None = None  # named by a usage error's line
        # Whether the command's argument (a namespace, a bundle) that was not found is an
        # environment's name, said as the fix (`_environments.misnamed`).
        self.misnamed: Callable[[], str | None] | None = None
        self._held: list[str] | None = None
        self._result: dict[str, Any] | None = None  # written by `finish` or `fail`

    @contextmanager
    def routing(self) -> Iterator[None]:
        """Route Python warnings and warmenv's log warnings here while the command runs."""
        handler = _LogToOutput(self)
        logger = logging.getLogger("warmenv")
        propagate, level = logger.propagate, logger.level
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET or logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            # coredis 6.9 leaves a connection's memory streams unclosed when a
            # connect is cancelled (a rediss:// server that does not answer in
            # time): the tier's one warning says what happened, not these.
            warnings.filterwarnings(
                "ignore", "Unclosed <MemoryObject(Send|Receive)Stream", ResourceWarning
            )
            warnings.showwarning = self._show_warning
            try:
                yield
            finally:
                logger.removeHandler(handler)
                logger.propagate, logger.level = propagate, level

    def _show_warning(self, message: Any, *_: Any, **__: Any) -> None:
        self.warning(str(message))

    @contextmanager
    def holding(self) -> Iterator[list[str]]:
        """Collect warnings instead of printing them; the caller decides what to say."""
        held: list[str] = []
        previous, self._held = self._held, held
        try:
            yield held
        finally:
            self._held = previous

    def line(self, text: object = "") -> None:
        if self.json or self.quiet:
            return
        if self.console is not None:
            self._print(clean(text))
        else:
            print(clean(text), flush=True)

    def prompt(self, text: object) -> None:
        """A question, the cursor left after it for the answer."""
        if self.console is not None:
            self.console.print(clean(text), end="")  # its last space is the cursor's
        else:
            print(clean(text), end="", flush=True)

    def _print(self, text: str) -> None:
        """`text` on the terminal, wrapped at its width with no space left at a line's end.

        rich leaves the space it wrapped at at the end of the line, and a
        copied line (a digest, a summary) should not end in spaces.
        """
        from rich.text import Text

        assert self.console is not None
        lines = Text(text).wrap(self.console, self.console.width)
        for line in lines:
            line.rstrip()
        self.console.print(Text("\n").join(lines), soft_wrap=True)

    def warning(self, text: object) -> None:
        if self._held is not None:
            self._held.append(str(text))
            return
        print(f"warmenv: warning: {clean(text)}", file=sys.stderr, flush=True)

    def fail(self, text: object, status: int, document: dict[str, Any] | None = None) -> None:
        """The command's last word: one line on stderr, and with `--json` the one document,
        its result if it had one (a command stopped once it had completed) with the error
        (the exact text, as all JSON output holds: JSON escapes what the line must)."""
        print(f"warmenv: error: {clean(text)}", file=sys.stderr, flush=True)
        result, self._result = self._result, None
        if self.json:
            self._write({**(result or {}), "error": str(text), "exit": status, **(document or {})})

    def result(self, document: dict[str, Any]) -> None:
        """The final answer: JSON in --json mode; otherwise nothing (already shown).

        Written when the command ends (`finish`), not here: with `--json`
        standard output is one document, and a command that fails or is
        stopped after its result was ready says so in that same document
        (`fail`), not in a second one a parser would choke on.
        """
        self._result = document

    def finish(self) -> None:
        """The command ended well: write its result, if it has one, with `--json`."""
        result, self._result = self._result, None
        if self.json and result is not None:
            self._write(result)

    def _write(self, document: dict[str, Any]) -> None:
        # ensure_ascii (the default) writes every control character as \\u escape;
        # a byte that was not UTF-8 (a lone surrogate) is written as \\xff text,
        # as on the terminal: "\\udcff" would not decode to UTF-8.
        print(jsonlib.dumps(_utf8_safe(as_json(document)), indent=2), flush=True)

    def table(
        self, title: str, columns: list[str], rows: list[list[object]], empty: str = ""
    ) -> None:
        """A table of `rows`; with none, the one line `empty` (or "TITLE: none") instead."""
        if self.json or self.quiet:
            return
        if not rows:
            self.line(empty or f"{title}: none")
            return
        title = clean(title)
        cells = [[clean(cell) for cell in row] for row in rows]
        # Figures are right-aligned (their digits line up), text left-aligned, headers as
        # their column; a column is of figures when every cell in it is one.
        figures = [
            all(_FIGURE.match(row[i]) for row in cells if row[i]) for i in range(len(columns))
        ]
        if self.console is not None:
            from rich.table import Table
            from rich.text import Text

            # The title is a line of its own: as rich's table title it is padded with
            # spaces to the table's width, and a copied line should not end in spaces.
            self._print(title)
            table = Table()
            for column, right in zip(columns, figures, strict=True):
                table.add_column(Text(column), justify="right" if right else "left")
            for row in cells:
                table.add_row(*(Text(cell) for cell in row))
            self.console.print(table)
            return
        widths = [
            max(len(c) for c in [column, *(r[i] for r in cells)])
            for i, column in enumerate(columns)
        ]

        def line(row: list[str]) -> str:
            padded = (
                c.rjust(w) if right else c.ljust(w)
                for c, w, right in zip(row, widths, figures, strict=True)
            )
            return "  ".join(padded).rstrip()

        print(title)
        print(line(columns))
        for row in cells:
            print(line(row))
        print(flush=True)

    @contextmanager
    def bar(self, label: str, total: int) -> Iterator[ProgressBar]:
        """Progress counted in entries: done of `total`, entries/s and the time left."""
        with self._progress(label, entries=True, total_entries=total) as bar:
            yield bar

    @contextmanager
    def transfer(self, label: str, total_entries: int, total_bytes: int) -> Iterator[ProgressBar]:
        """An import or export: entries and entries/s, bytes and bytes/s, the time left."""
        with self._progress(
            label, entries=True, bytes=True, total_entries=total_entries, total_bytes=total_bytes
        ) as bar:
            yield bar

    @contextmanager
    def download(self, label: str, total_bytes: int | None) -> Iterator[ProgressBar]:
        """A download: bytes (of a total the server may not have said), bytes/s, time left."""
        with self._progress(label, bytes=True, total_bytes=total_bytes) as bar:
            yield bar

    @contextmanager
    def checking(self, label: str, total_bytes: int) -> Iterator[ProgressBar]:
        """A digest check: bytes of keys and values hashed of `total_bytes`, bytes/s,
        the time left (fed by `Verifying` events)."""
        with self._progress(label, bytes=True, total_bytes=total_bytes) as bar:
            yield bar

    @contextmanager
    def _progress(
        self,
        label: str,
        *,
        entries: bool = False,
        bytes: bool = False,
        total_entries: int | None = None,
        total_bytes: int | None = None,
    ) -> Iterator[ProgressBar]:
        """A bar on a terminal, a plain line a second elsewhere, silence for JSON and --quiet.

        On a terminal the bar's own measure is bytes when it counts bytes (the
        time left is best estimated from them), else entries.
        """
        label = clean(label)
        bar = ProgressBar(
            total_entries if entries else None, total_bytes if bytes else None, counts_bytes=bytes
        )
        if self.json or self.quiet:
            yield bar
            return
        if self.console is not None:
            from warmenv.cli import _progress

            with _progress.progress(self.console, entries=entries, bytes=bytes) as progress:
                task = progress.add_task(
                    label,
                    total=total_bytes if bytes else total_entries,
                    entries=0,
                    total_entries=total_entries,
                    entries_per_second=None,
                    bytes_per_second=None,
                )

                def draw(bar: ProgressBar) -> None:
                    entries_per_second, bytes_per_second = bar.rate()
                    progress.update(
                        task,
                        completed=(bar.bytes if bytes else bar.entries) or 0,
                        entries=bar.entries or 0,
                        entries_per_second=entries_per_second,
                        bytes_per_second=bytes_per_second,
                    )

                bar.draw = draw
                yield bar
            return
        printed: list[float] = []  # when the last line was printed
        shown: list[tuple[int | None, int | None]] = []  # and what it showed

        def show(bar: ProgressBar) -> None:
            now = time.monotonic()
            counts = (bar.entries, bar.bytes)
            due = not printed or now - printed[0] >= 1.0
            if shown == [counts] or not (due or bar.finished):
                return
            printed[:], shown[:] = [now], [counts]
            print(f"{label}: {bar.describe()}", flush=True)

        bar.draw = show
        yield bar


# A number with an optional unit: 1,024 / 12.5 MiB / 3.2 s / 97.0 % / 28.6 min / -.
_FIGURE = re.compile(r"^(?:-|[-+]?[0-9][0-9,.]*(?: ?[A-Za-z%]{1,4})?)$")


def _utf8_safe(data: Any) -> Any:
    """JSON data with every string, keys too, made `utf8_safe`."""
    if isinstance(data, str):
        return utf8_safe(data)
    if isinstance(data, list):
        return [_utf8_safe(item) for item in data]
    if isinstance(data, dict):
        return {utf8_safe(key): _utf8_safe(value) for key, value in data.items()}
    return data


@attrs.define
class ProgressBar:
    """The handle a command moves its progress with: entries and bytes done so far.

    Rates are counted from the first update, not from when the bar appeared:
    the first batch may have been done before (an import's comes right after
    its digest check), and counting it over no time at all would show a
    rate thousands of times too high.
    """

    total_entries: int | None
    """The entries to do, if the bar counts entries."""
    total_bytes: int | None
    """The bytes to do, if the bar counts bytes and the total is known."""
    counts_bytes: bool = False
    draw: Callable[[ProgressBar], None] = lambda bar: None
    entries: int | None = attrs.field(init=False, default=None)
    bytes: int | None = attrs.field(init=False, default=None)
    _first: tuple[float, int, int] | None = attrs.field(init=False, default=None)

    def update(self, entries: int | None = None, *, bytes: int | None = None) -> None:
        """Cumulative counts; a measure not given keeps its last value."""
        if entries is not None:
            self.entries = entries
        if bytes is not None:
            self.bytes = bytes
        if self._first is None:
            self._first = (time.monotonic(), self.entries or 0, self.bytes or 0)
        self.draw(self)

    def finish(self) -> None:
        """All done: the totals (the last batch's counts may fall short of a rounded total)."""
        self.update(self.total_entries, bytes=self.total_bytes)

    @property
    def finished(self) -> bool:
        if self.total_entries is not None:
            return (self.entries or 0) >= self.total_entries
        return self.total_bytes is not None and (self.bytes or 0) >= self.total_bytes

    def rate(self) -> tuple[float | None, float | None]:
        """Entries and bytes per second since the first update (None until measurable)."""
        if self._first is None:
            return None, None
        since, entries, size = self._first
        elapsed = time.monotonic() - since
        if elapsed <= 0 or (self.entries or 0) + (self.bytes or 0) == entries + size:
            return None, None
        return ((self.entries or 0) - entries) / elapsed, ((self.bytes or 0) - size) / elapsed

    def describe(self) -> str:
        """`40/40 (100%), 2.1 KiB, 3,100 entries/s`, or for bytes `1.0 MiB/4.0 MiB (25%), ...`."""
        entries_rate, bytes_rate = self.rate()
        if self.total_entries is not None:
            total, done = self.total_entries, self.entries or 0
            parts = [f"{done:,}/{total:,} ({100.0 * done / total if total else 100.0:.0f}%)"]
            if self.counts_bytes:
                parts.append(size(self.bytes or 0))
            if entries_rate is not None:
                parts.append(per_second(entries_rate))
            return ", ".join(parts)
        expected, done = self.total_bytes, self.bytes or 0
        percent = f" ({100.0 * done / expected:.0f}%)" if expected else ""
        parts = [f"{size(done)}/{'?' if expected is None else size(expected)}{percent}"]
        if bytes_rate is not None:
            parts.append(f"{size(int(bytes_rate))}/s")
        return ", ".join(parts)


async def ask(out: Output, question: str) -> str | None:
    """The line typed at the terminal after `question`; `None` at end of input (Ctrl-D).

    The read runs on a daemon thread the command does not wait for, so
    Ctrl-C at the prompt ends the command at once rather than after Enter.
    """
    out.prompt(question)
    token = anyio.lowlevel.current_token()
    answered = anyio.Event()
    answer: list[str] = []

    def read() -> None:
        try:
            answer.append(sys.stdin.readline())
        finally:
            with contextlib.suppress(Exception):  # the command may be gone already
                anyio.from_thread.run_sync(answered.set, token=token)

    threading.Thread(target=read, name="warmenv-prompt", daemon=True).start()
    await answered.wait()
    return answer[0] if answer and answer[0] else None


async def follow(
    out: Output,
    events: AsyncIterator[Event],
    label: str,
    on_start: Callable[[Started], None] | None = None,
    verifying: str | None = None,
) -> ImportReport | ExportReport:
    """Drive an import or export, drawing its progress; returns its report.

    `on_start` sees the `Started` event (the totals) and may refuse to go on
    by raising: nothing has been written or published by then. `verifying`
    names the bundle of an import that checks its digest first: that phase is
    drawn as a bar of its own, from the `Verifying` events.
    """
    async for event in events:
        if isinstance(event, Started):
            break
    else:  # pragma: no cover - every run starts with Started
        raise RuntimeError("no Started event")
    if on_start is not None:
        on_start(event)
    started = event
    following: Event | None = None
    if verifying is not None:
        # The import checks the digest before its first batch: of the whole bundle, so
        # the bar's total is the first Verifying's, not the namespaces selected (Started's).
        following = await anext(events, None)
        if isinstance(following, Verifying):
            with out.checking(f"verifying {verifying}", following.total_bytes) as checked:
                while isinstance(following, Verifying):
                    checked.update(bytes=following.bytes_done)
                    following = await anext(events, None)
    with out.transfer(label, started.total_entries, started.total_bytes) as bar:

        def show(event: Event) -> ImportReport | ExportReport | None:
            if isinstance(event, Progress):
                out.entries_done = event.entries_done
                bar.update(event.entries_done, bytes=event.bytes_done)
            elif isinstance(event, Finished):
                bar.finish()
                return event.report
            return None

        if following is not None and (report := show(following)) is not None:
            return report
        async for event in events:
            if (report := show(event)) is not None:
                return report
    raise RuntimeError("the operation ended without a report")  # pragma: no cover
