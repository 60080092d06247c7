"""What every sub-command shares: options, output, progress display, errors.

Everything the command prints goes through `Output`, and every piece of text
`Output` prints goes through `clean()` first. Bundles, environments and
paths are untrusted input: a bundle name holding `ESC [2J` would otherwise
clear the user's screen, and one holding a newline could forge an "ok" line.
Escaping at the one place where text leaves the process, rather than at
each call site, means no new command can forget it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json as jsonlib
import logging
import os
import re
import signal
import sqlite3
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import attrs

from warmenv._errors import WarmenvError
from warmenv._text import clean
from warmenv.bundle import Finished, Progress, Started, Verifying
from warmenv.bundle.events import Event, ExportReport, ImportReport
from warmenv.config import is_valid_name
from warmenv.environment import Environment, active, check_name, open_environment
from warmenv.persistence.remote import RemoteTier


class UsageError(Exception):
    """The command line asked for something it cannot mean (exit status 2)."""


class Failure(Exception):
    """The operation failed (exit status 1); `document` joins the `--json` error."""

    def __init__(self, message: str, document: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.document = document or {}


class Stopped(BaseException):
    """The command was stopped by a signal, or a prompt went unanswered (exit 128 + signal).

    A `BaseException`, like `KeyboardInterrupt`, so no `except Exception` on
    the way out mistakes it for a failure of the operation.
    """

    _WORDS: ClassVar[dict[int, str]] = {
        signal.SIGINT: "interrupted",
        signal.SIGTERM: "terminated (SIGTERM)",
        **({signal.SIGHUP: "hung up (SIGHUP)"} if hasattr(signal, "SIGHUP") else {}),
    }

    def __init__(self, signum: int, why: str | None = None) -> None:
        super().__init__(signum)
        self.signum = signum
        self.why = why or self._WORDS.get(signum, f"stopped by signal {signum}")

    @property
    def status(self) -> int:
        return 128 + self.signum


# --- text from outside: escaped by warmenv._text.clean ----------------------------


def text_argument(value: str, option: str) -> str:
    """`value` if it is valid text; a usage error (before any work) if not.

    An argument holding bytes that are not UTF-8 reaches Python as lone
    surrogates, which cannot be written into a manifest or a database.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{option} {clean(value)!s} is not valid UTF-8 text; spell it in UTF-8"
        ) from None
    return value


# --- options -------------------------------------------------------------------


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is a `UsageError` (one line, `--json` aware)."""

    def error(self, message: str) -> Any:
        # argparse quotes with repr(), which spells a byte that was not UTF-8
        # as \udcff; everything else the command prints says \xff.
        message = _SURROGATE_REPR.sub(lambda m: f"\\x{int(m[1], 16) - 0xDC00:02x}", message)
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


_SURROGATE_REPR = re.compile(r"\\u(dc[89a-f][0-9a-f])")


def shared_options() -> argparse.ArgumentParser:
    """`--env`, `--root`, `--remote`, `--json`, `--debug` and `--quiet`, after every sub-command."""
    parent = ArgumentParser(add_help=False)
    env = parent.add_argument(
        "--env", metavar="NAME", help="environment name (default: configured)"
    )
    env.completer = complete_environment  # type: ignore[attr-defined]  # read by argcomplete
    parent.add_argument("--root", metavar="DIR", type=Path, help="where environments live")
    parent.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parent.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parent.add_argument(
        "--remote",
        metavar="URL",
        help="the fleet's shared tier, redis:// or rediss:// (default: $WARMENV_REMOTE, "
        "else the config file's remote; '' for none); needs warmenv[redis]",
    )
    parent.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="print only warnings and errors (no progress, tables or summaries)",
    )
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


def namespace_prefixes(args: argparse.Namespace) -> list[str] | None:
    """The `--namespace` prefixes, each checked to be text."""
    if args.namespaces is None:
        return None
    prefixes = [text_argument(p, "--namespace") for p in args.namespaces]
    if any(not p.strip("/") for p in prefixes):
        raise UsageError(
            "--namespace must not be empty: give a prefix such as app or app/1 "
            "(or leave the option out to mean every namespace)"
        )
    return prefixes


def no_match(prefixes: list[str]) -> str:
    """What to say when `--namespace` matches nothing."""
    listed = ", ".join(repr(p) for p in prefixes)
    return f"no namespace matches {listed}"


# --- errors --------------------------------------------------------------------

# What a failed SQLite call means for the user, by its primary result code.
_SQLITE_HINTS = {
    "SQLITE_CANTOPEN": "cannot create or open a file there; check that the directory "
    "exists and is writable",
    "SQLITE_FULL": "the disk is full; free space and retry",
    "SQLITE_READONLY": "the file or its directory is read-only",
    "SQLITE_PERM": "permission denied",
    "SQLITE_IOERR": "an I/O error (a full or failing disk?)",
    "SQLITE_BUSY": "another process holds the database locked; retry when it is done",
    "SQLITE_LOCKED": "the database is locked; retry",
    "SQLITE_CORRUPT": "the file is damaged",
    "SQLITE_NOTADB": "the file is not a SQLite database",
}


def describe_error(exc: BaseException, subject: object = None) -> str:
    """One line for `exc`, naming its file (or `subject`, what the command worked on)."""
    where = f"{subject}: " if subject is not None else ""
    if isinstance(exc, FileNotFoundError) and exc.filename:
        if exc.strerror and not exc.strerror.startswith("No such file"):
            return str(exc.strerror)
        return f"{exc.filename}: no such file"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"{exc.filename or subject or 'the disk'}: the disk is full; free space and retry"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename or subject or 'a file'}: {exc.strerror}"
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        primary = name.split("_", 2)
        hint = _SQLITE_HINTS.get(name) or _SQLITE_HINTS.get("_".join(primary[:2]))
        return f"{where}{exc}" + (f" ({hint})" if hint else "")
    if isinstance(exc, UnicodeError):
        return f"{where}text that is not valid UTF-8 ({exc})"
    return str(exc) or type(exc).__name__


# --- environments --------------------------------------------------------------


@asynccontextmanager
async def environment(
    args: argparse.Namespace, out: Output, *, create: bool = False, write: bool = False
) -> AsyncIterator[Environment]:
    """The environment `--env`/`--root` name, refused unless it can do the job.

    `create=False` (commands that only read, and purge) never creates a file
    or directory: a missing environment is a `Failure` naming what exists.
    An environment that fell back to memory is refused always (it is not the
    file the user asked about), a read-only one when `write` is asked for.
    """
    if args.env is not None:
        try:
            check_name(args.env)
        except ValueError:
            raise UsageError(
                f"invalid environment name '{clean(args.env)}': use letters, digits, '.', "
                "'_' and '-' (and not '.' or '..')"
            ) from None
    async with AsyncExitStack() as stack:
        with out.holding() as notes:
            try:
                env = await stack.enter_async_context(
                    open_environment(
                        args.env,
                        root=args.root,
                        create=create,
                        remote=getattr(args, "remote", None),
                    )
                )
            except FileNotFoundError as exc:
                if create or not exc.filename:
                    raise
                raise Failure(await _no_environment(Path(exc.filename))) from None
        if env.in_memory or (write and env.read_only):
            raise Failure(await anyio.to_thread.run_sync(_cannot_use, env, notes, write))
        if not write:
            # A command that only reads must not evict on close (a configured
            # max_bytes is enforced by the application and `warmenv gc`).
            env.max_bytes = None
        for note in notes:
            out.warning(note)
        if env.remote is not None:
            await _reach(env.remote)
        if out.subject is None:
            out.subject = env.path
        yield env


async def _reach(tier: RemoteTier) -> None:
    """Ask the remote once, so that one that cannot be reached is said at once.

    No command needs the remote to do its job (each works on the local
    database; the remote is only a second tier for lookups), so none fails
    for it. Unprobed, the tier would connect on its first lookup, and a
    command that looks nothing up would never say that `--remote` (or
    `WARMENV_REMOTE`, or the configuration's `remote`) is unreachable. The
    tier itself warns, once per outage, with the reason (password hidden),
    and serves from the local tier from then on without trying again for a
    while, so the command pays the probe's timeout at most once.
    """
    await tier.ping()  # what it says is warned by the tier, once per outage


def environment_files(root: Path) -> list[Path]:
    """The environments under `root`: its `<name>.db` files, sorted (`OSError` if unreadable)."""
    return sorted(p for p in root.glob("*.db") if p.is_file())


def complete_environment(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Shell completion of `--env`: the environments under `--root`, or the configured root.

    Called by argcomplete (`warmenv ... --env <TAB>`); whatever goes wrong
    (no root, an invalid configuration) completes nothing rather than fail.
    Only names `--env` accepts are offered: a file named with control
    characters (an escape sequence, a newline) would otherwise reach the
    terminal and the command line raw.
    """
    try:
        root = getattr(parsed_args, "root", None) or active()[1]
        names = [p.stem for p in environment_files(Path(root).expanduser())]
    except (OSError, WarmenvError):
        return []
    return [name for name in names if name.startswith(prefix) and is_valid_name(name)]


async def _no_environment(path: Path) -> str:
    def existing() -> list[str]:
        try:
            return [p.stem for p in environment_files(path.parent)]
        except OSError:
            return []

    if await anyio.to_thread.run_sync(path.parent.exists):
        if not await anyio.to_thread.run_sync(path.parent.is_dir):
            return f"no environment {path.stem!r}: {path.parent} is not a directory"
    else:
        return f"no environment {path.stem!r}: {path.parent} does not exist"
    names = await anyio.to_thread.run_sync(existing)
    there = f"environments there: {', '.join(names)}" if names else "it holds no environments"
    return f"no environment {path.stem!r} in {path.parent} ({there})"


def _library_note(path: Path, note: str) -> str:
    """The library's warning on falling back to memory for `path`, reworded as a reason.

    Matched on the path itself: the reason may hold parentheses of its own.
    """
    found = re.fullmatch(
        rf"environment '.*?': cannot use {re.escape(str(path))} \((.*)\); keeping .*",
        note,
        re.DOTALL,
    )
    return note if found is None else f"{path} cannot be used ({found[1]})"


def _kind(path: Path) -> str:
    """What kind of file `path` is, in words, for one that is not a regular file."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return "not readable"
    for test, words in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def _cannot_use(env: Environment, notes: list[str], write: bool) -> str:
    """Why `env` cannot be used: found on disk where possible, else what the library said."""
    path = env.path
    why = ""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        why = f"{ancestor} is not a directory"
    elif not path.exists() and not os.access(ancestor, os.W_OK | os.X_OK):
        why = f"{ancestor} is not writable by this user"
    elif path.exists() and not path.is_file():
        return (
            f"cannot use environment {env.name!r}: {path} is {_kind(path)}, not a database "
            "file; nothing was done (remove it, or choose another --env)"
        )
    elif path.exists() and not os.access(path, os.W_OK if write else os.R_OK):
        why = f"{path} is not {'writable' if write else 'readable'} by this user"
    elif env.read_only:
        why = f"{path} can only be opened read-only (its directory is not writable)"
    elif notes:
        why = _library_note(path, notes[-1])
    else:
        why = f"{path} cannot be opened"
    if env.in_memory and write:
        return (
            f"cannot write environment {env.name!r}: {why}; nothing would persist, so nothing "
            "was done (point --root or WARMENV_ROOT at a directory you can write)"
        )
    if env.in_memory:
        return f"cannot read environment {env.name!r}: {why}"
    return f"environment {env.name!r} is read-only: {why}; nothing was done"


# --- output --------------------------------------------------------------------


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
        self._held: list[str] | None = None

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
            self.console.print(clean(text))
        else:
            print(clean(text), flush=True)

    def prompt(self, text: object) -> None:
        """A question, the cursor left after it for the answer."""
        if self.console is not None:
            self.console.print(clean(text), end="")
        else:
            print(clean(text), end="", flush=True)

    def warning(self, text: object) -> None:
        if self._held is not None:
            self._held.append(str(text))
            return
        print(f"warmenv: warning: {clean(text)}", file=sys.stderr, flush=True)

    def fail(self, text: object, status: int, document: dict[str, Any] | None = None) -> None:
        """The command's last word: one line on stderr, and a JSON object with `--json`
        (holding the exact text, as all JSON output does: JSON escapes what the line must)."""
        print(f"warmenv: error: {clean(text)}", file=sys.stderr, flush=True)
        if self.json:
            self.result({"error": str(text), "exit": status, **(document or {})})

    def result(self, document: dict[str, Any]) -> None:
        """The final answer: JSON in --json mode; otherwise nothing (already shown)."""
        if self.json:
            # ensure_ascii (the default) writes every control character as \\u escape.
            print(jsonlib.dumps(document, indent=2, default=_jsonable), flush=True)

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
        if self.console is not None:
            from rich.table import Table
            from rich.text import Text

            # The title is a line of its own: as rich's table title it is padded with
            # spaces to the table's width, and a copied line should not end in spaces.
            self.console.print(Text(title))
            table = Table()
            for i, column in enumerate(columns):
                table.add_column(Text(column), justify="right" if i else "left")
            for row in cells:
                table.add_row(*(Text(cell) for cell in row))
            self.console.print(table)
            return
        widths = [
            max(len(c) for c in [column, *(r[i] for r in cells)])
            for i, column in enumerate(columns)
        ]
        print(title)
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
        for row in cells:
            print(
                "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
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
        # The import checks the digest before its first batch.
        with out.checking(f"verifying {verifying}", started.total_bytes) as checked:
            following = await anext(events, None)
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


def plural(count: int, word: str, many: str | None = None) -> str:
    """`count` and `word`, in the plural unless it is one: "1 namespace", "2 entries"."""
    if count == 1:
        return f"1 {word}"
    return f"{count:,} {many or word + 's'}"


def per_second(rate: float) -> str:
    """An entries/s rate as shown: "1 entry/s", "3,100 entries/s"."""
    shown = f"{rate:,.0f}"
    return f"{shown} {'entry' if shown == '1' else 'entries'}/s"


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
