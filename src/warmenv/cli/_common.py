"""What every sub-command shares: options, output, progress display, errors."""

from __future__ import annotations

import argparse
import errno
import json as jsonlib
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs

from warmenv.bundle import Finished, Progress, Started
from warmenv.bundle.events import Event, ExportReport, ImportReport
from warmenv.environment import Environment, open_environment


class UsageError(Exception):
    """The command line asked for something it cannot mean (exit status 2)."""


def shared_options() -> argparse.ArgumentParser:
    """`--env`, `--root`, `--json` and `--debug`, accepted after every sub-command."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--env", metavar="NAME", help="environment name (default: configured)")
    parent.add_argument("--root", metavar="DIR", type=Path, help="where environments live")
    parent.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parent.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return parent


def add_namespace_option(parser: argparse.ArgumentParser) -> None:
    """`--namespace PREFIX`, repeatable, matching whole segments."""
    parser.add_argument(
        "--namespace",
        metavar="PREFIX",
        action="append",
        dest="namespaces",
        help="only namespaces under PREFIX (whole segments; repeatable)",
    )


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename}: no such file"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"{exc.filename or 'the disk'} is full ({exc.strerror}); free space and retry"
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


@asynccontextmanager
async def environment(args: argparse.Namespace) -> AsyncIterator[Environment]:
    try:
        async with open_environment(args.env, root=args.root) as env:
            yield env
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _rich_console() -> Any | None:
    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console()


class Output:
    """Writes tables, progress and results as rich output, plain lines or JSON."""

    def __init__(self, *, json: bool) -> None:
        self.json = json
        self.console = None if json else _rich_console()

    def line(self, text: str = "") -> None:
        if self.json:
            return
        if self.console is not None:
            self.console.print(text, highlight=False, markup=False)
        else:
            print(text, flush=True)

    def error(self, text: str) -> None:
        print(f"warmenv: error: {text}", file=sys.stderr, flush=True)

    def result(self, document: dict[str, Any]) -> None:
        """The final answer: JSON in --json mode; otherwise nothing (already shown)."""
        if self.json:
            print(jsonlib.dumps(document, indent=2, default=_jsonable), flush=True)

    def table(self, title: str, columns: list[str], rows: list[list[object]]) -> None:
        if self.json:
            return
        if self.console is not None:
            from rich.table import Table

            table = Table(title=title, title_justify="left")
            for i, column in enumerate(columns):
                table.add_column(column, justify="right" if i else "left")
            for row in rows:
                table.add_row(*(str(cell) for cell in row))
            self.console.print(table)
            return
        widths = [
            max(len(str(c)) for c in [column, *(r[i] for r in rows)])
            for i, column in enumerate(columns)
        ]
        print(title)
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
        for row in rows:
            cells = [str(c) for c in row]
            print(
                "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(cells, widths, strict=True))
                )
            )
        print(flush=True)

    @contextmanager
    def bar(self, label: str, total: float) -> Iterator[ProgressBar]:
        """A progress bar on a terminal, periodic plain lines elsewhere, silence for JSON."""
        if self.console is not None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            with RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
            ) as progress:
                task = progress.add_task(label, total=total)
                yield ProgressBar(lambda done: progress.update(task, completed=done), total)
            return
        if self.json:
            yield ProgressBar(lambda done: None, total)
            return
        state = {"last": 0.0, "shown": -1.0}

        def show(done: float) -> None:
            now = time.monotonic()
            if done == state["shown"]:
                return
            if done >= total or now - state["last"] >= 1.0:
                state["last"], state["shown"] = now, done
                percent = 100.0 * done / total if total else 100.0
                print(f"{label}: {done:,.0f}/{total:,.0f} ({percent:.0f}%)", flush=True)

        yield ProgressBar(show, total)


@attrs.define
class ProgressBar:
    _update: Any
    total: float

    def update(self, done: float) -> None:
        self._update(done)


async def follow(
    out: Output, events: AsyncIterator[Event], label: str
) -> ImportReport | ExportReport:
    """Drive an import or export, drawing its progress; returns its report."""
    async for event in events:
        if isinstance(event, Started):
            break
    else:  # pragma: no cover - every run starts with Started
        raise RuntimeError("no Started event")
    with out.bar(label, max(event.total_entries, 1)) as bar:
        async for event in events:
            if isinstance(event, Progress):
                bar.update(event.entries_done)
            elif isinstance(event, Finished):
                bar.update(bar.total)
                return event.report
    raise RuntimeError("the operation ended without a report")  # pragma: no cover


def size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def _jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if attrs.has(type(value)):
        return attrs.asdict(value, recurse=True)  # type: ignore[arg-type]
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


def as_json(value: object) -> Any:
    """An attrs value (report, manifest, summary) as plain JSON data."""
    return jsonlib.loads(jsonlib.dumps(value, default=_jsonable))
