"""How a command ends: the exceptions it raises, and the one funnel to a line and a status.

Every way a command can end (done, failed, bad usage, stopped by a signal,
an unexpected exception) is turned into one line on stderr, a JSON object
with `--json`, and an exit status by `conclude`, and only there: 0 done, 1
failed, 2 bad usage, 128 + the signal when stopped. A library error, an
`OSError` or a SQLite error becomes one line naming its file and, where one
is known, the fix (`describe_error`).
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import sys
import traceback
from typing import TYPE_CHECKING, Any, ClassVar

from warmenv._errors import WarmenvError
from warmenv.bundle.errors import BundleNotFoundError, InvalidSourceError

if TYPE_CHECKING:
    from warmenv.cli._output import Output


class UsageError(Exception):
    """The command line asked for something it cannot mean (exit status 2).

    Raised anywhere with what was wrong; `conclude`, the one place a usage
    mistake is said, names the sub-command and where its help is
    (`usage_line`). `located`: the message already says them (argparse's own
    errors), or is about no sub-command (WARMENV_CLI_BACKEND).
    """

    def __init__(self, message: str, *, located: bool = False) -> None:
        super().__init__(message)
        self.located = located


def usage_line(prog: str, message: str) -> str:
    """A usage mistake's line: the sub-command, what was wrong, where its help is.

    `prog` is argparse's (`warmenv` or `warmenv export`); the line is printed
    after `warmenv: error: `, so the program's name is not said again.
    """
    command = prog.removeprefix("warmenv").strip()
    return f"{command + ': ' if command else ''}{message} (see '{prog} --help')"


class Failure(Exception):
    """The operation failed (exit status 1, or `status`); `document` joins the `--json` error.

    `status` other than 1 only where a convention users script against says
    it: `warmenv run`'s COMMAND not found (127) or not runnable (126), as a
    shell says them.
    """

    def __init__(
        self,
        message: str,
        document: dict[str, Any] | None = None,
        *,
        status: int = 1,
        not_found: bool = False,
    ) -> None:
        super().__init__(message)
        self.document = document or {}
        self.status = status
        self.not_found = not_found
        """What the command was given was not found (a namespace, an environment): the
        line may say that it names an environment (`Output.misnamed`)."""


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


def conclude(out: Output, exc: BaseException, debug: bool) -> int:
    """Say how the command ended, in one line; returns the exit status."""
    leaf = leaf_of(exc)
    document: dict[str, Any] = {}
    if isinstance(leaf, Stopped):
        status, message = leaf.status, leaf.why
        if out.when_interrupted:
            message = f"{message}; {out.when_interrupted}"
    elif isinstance(leaf, KeyboardInterrupt):
        status, message = 130, "interrupted"
        if out.when_interrupted:
            message = f"{message}; {out.when_interrupted}"
    elif isinstance(leaf, UsageError):
        status, message = 2, str(leaf)
        if not leaf.located and out.subcommand:
            message = usage_line(f"warmenv {out.subcommand}", message)
    elif isinstance(leaf, Failure):
        status, message, document = leaf.status, str(leaf), leaf.document
        if leaf.not_found:
            message = _with_misnamed(out, message)
    elif isinstance(leaf, WarmenvError | OSError | sqlite3.Error | UnicodeError):
        status, message = 1, describe_error(leaf, out.subject)
        if isinstance(leaf, BundleNotFoundError | InvalidSourceError):  # `export OUT big`
            message = _with_misnamed(out, message)
    else:
        status = 1
        message = (
            f"unexpected {type(leaf).__name__}: {leaf}; run again with --debug and report "
            "the traceback"
        )
    if debug and status not in (0, 2):
        traceback.print_exception(exc)
    if isinstance(leaf, BrokenPipeError) and leaf.filename is None:
        # Whoever read stdout has had enough (`warmenv ls | head`): nothing to say,
        # unless the command was changing something and stopped half-way.
        _silence_stdout()
        if out.when_output_closed is not None:
            print(f"warmenv: error: {out.when_output_closed()}", file=sys.stderr, flush=True)
        return 1
    out.fail(message, status, document)
    return status


def _with_misnamed(out: Output, message: str) -> str:
    """`message`, and where what was not found names an environment, that it does."""
    hint = out.misnamed() if out.misnamed is not None else None
    return f"{message}; {hint}" if hint else message


def leaf_of(exc: BaseException) -> BaseException:
    """The exception that says what happened, out of any exception groups around it."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = list(exc.exceptions)
        # A stop or interrupt says more than the cancellations it caused.
        exc = next((e for e in leaves if isinstance(e, Stopped | KeyboardInterrupt)), leaves[0])
    return exc


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
