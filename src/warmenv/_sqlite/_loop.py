"""Which event loop a connection belongs to, and the error for crossing loops.

A connection belongs to the event loop that opened it: its results are
delivered through that loop (an asyncio future, a trio token), and the
objects built on it (locks, single-flight runs) are that loop's. Used from
another loop or backend it would fail somewhere below warmenv with another
library's message ("There is no current event loop in thread ..."), or seem
to work until two loops race. So each connection records its loop's identity
at open and compares it on every call: one `is` against a value the call
needs anyway, and the descriptions are built only when they differ.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from urllib.parse import unquote

from warmenv._errors import WarmenvError


def asyncio_loop_label(loop: asyncio.AbstractEventLoop) -> str:
    """`loop`, running in this thread, named so that two loops can be told apart."""
    kind = type(loop)
    flavour = "uvloop" if kind.__module__.partition(".")[0] == "uvloop" else "asyncio"
    return (
        f"{flavour} event loop {kind.__module__}.{kind.__qualname__} at {id(loop):#x} "
        f"(thread {threading.current_thread().name!r})"
    )


def trio_run_label(token: object) -> str:
    """The trio run in this thread, named by its token."""
    return f"trio run {id(token):#x} (thread {threading.current_thread().name!r})"


def current_label() -> str:
    """The event loop running in this thread, described as `*_label` do."""
    try:
        return asyncio_loop_label(asyncio.get_running_loop())
    except RuntimeError:  # no asyncio loop in this thread
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return trio_run_label(trio.lowlevel.current_trio_token())
        except RuntimeError:
            pass
    return f"thread {threading.current_thread().name!r}, which runs no asyncio or trio loop"


def database_label(target: str, *, uri: bool) -> str:
    """The file behind a connection target, without the URI's options."""
    if uri and target.startswith("file:"):
        return unquote(target[len("file:") :].partition("?")[0])
    return target


def foreign_loop_error(database: str, opened_on: str) -> WarmenvError:
    """The error for a connection used from a loop other than the one that opened it."""
    return WarmenvError(
        f"the SQLite connection to {database} was opened on the {opened_on} and is used "
        f"from the {current_label()}; an environment or bundle belongs to the event loop "
        "that opened it: open one per event loop (or run the work on that loop, e.g. "
        "through anyio.from_thread)"
    )
