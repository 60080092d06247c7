"""The one seam between warmenv and SQLite: an async connection on any backend.

Everything above this package is written once. Below it, each connection
has a dedicated worker thread (`_worker`), whose results reach an asyncio
task through its loop's `call_soon_threadsafe` and a trio task through
trio's token. A connection offers one operation, `run(fn)`: call `fn` with the
sqlite3 connection on the worker thread, in one hop (or `start(fn)`: the same
hop begun at once and its answer awaited later, so that a caller can await
something else meanwhile without a task of its own; an answer that is there
before it is awaited wakes no loop). A transaction is one
such function, BEGIN to COMMIT, so a caller cancelled mid-way can never
leave it open: the worker finishes it (or rolls it back) on its own. A
caller that is not on an event loop may read with `run_here(fn)` instead,
on its own thread with a read-only connection of its own (see `_here`).
A database in memory (`open_memory`) needs no worker: it runs on the
caller's thread (see `_memory`). Work that is synchronous already, done
whole on a thread of its own (export's staging file and its sources, a
look inside a bundle file), takes a plain connection from `open_file` (or
`open_image`, over a file's bytes held in memory):
every `sqlite3` connection warmenv makes comes from this package.

A connection belongs to the event loop that opened it; `run` and `close`
from any other loop or backend raise a `WarmenvError` naming both (see
`_loop`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial
from typing import Protocol, TypeVar

import anyio

from warmenv._backend import current_backend
from warmenv._sqlite._loop import database_label

__all__ = [
    "Connection",
    "Pending",
    "connect",
    "open_file",
    "open_image",
    "open_memory",
    "open_with",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

BUSY_TIMEOUT_SECONDS = 30.0
FILE_BUSY_TIMEOUT_SECONDS = 5.0
"""`open_file`'s wait for a lock: SQLite's default, as its callers always had."""


class Pending(Protocol[T_co]):
    """A function `Connection.start` gave the worker: its result, once awaited."""

    async def result(self) -> T_co:
        """The function's return value, or the exception it raised; waits until it ran.

        No checkpoint when it has run already (the caller awaited something
        else meanwhile, which was one), and then the worker woke no loop to
        hand the answer over: only a caller already waiting is woken.
        """
        ...


class Connection(Protocol):
    """An async SQLite connection whose every call is one hop to its worker thread."""

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Call `fn(connection)` on the worker thread and return its result.

        `WarmenvError` if called from another event loop than the one that
        opened the connection.
        """
        ...

    def start(self, fn: Callable[[sqlite3.Connection], T]) -> Pending[T]:
        """Give `fn(connection)` to the worker thread now; `await pending.result()` later.

        `run` in two halves, for a caller with another wait to overlap with this
        one (a local read while Redis is asked) and no task to spend on it. A
        result never awaited (its caller was cancelled meanwhile) is dropped,
        an exception included; `fn` still runs whole. The loop check and
        `ClosedError` are `run`'s, raised here.
        """
        ...

    def run_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Call `fn(connection)` on this thread with a pooled read-only connection.

        For plain threads (no event loop): no hop to the worker. Safe from
        any thread; `ClosedError` once the connection is closed.
        """
        ...

    async def close(self) -> None:
        """Close the connection and end its worker thread, returning once the thread has
        ended (the loop runs on meanwhile); safe to call twice."""
        ...


async def connect(
    target: str, *, uri: bool = False, busy_timeout: float = BUSY_TIMEOUT_SECONDS
) -> Connection:
    """Open `target` on a worker thread suited to the running event loop.

    `busy_timeout` (seconds) is how long a statement waits for another process's
    lock before it fails with `SQLITE_BUSY`.
    """
    connector = partial(
        sqlite3.connect,
        target,
        uri=uri,
        timeout=busy_timeout,
        isolation_level=None,  # warmenv issues BEGIN/COMMIT itself
        check_same_thread=False,
        cached_statements=256,
    )
    database = database_label(target, uri=uri)
    if current_backend() == "trio":
        from warmenv._sqlite._trio import TrioConnection

        return await TrioConnection.open(connector, database)
    from warmenv._sqlite._asyncio import AsyncioConnection

    return await AsyncioConnection.open(connector, database)


def open_file(uri: str, *, busy_timeout: float = FILE_BUSY_TIMEOUT_SECONDS) -> sqlite3.Connection:
    """A plain, synchronous connection to the file a `file:` URI names (its mode, `ro`,
    `rw`, `rwc` or `immutable=1`, is the URI's), waiting `busy_timeout` seconds for
    another process's lock.

    For synchronous work on a worker thread, one thread at a time (anyio's
    worker threads take turns: `check_same_thread` is off), in autocommit
    mode: the caller issues BEGIN and COMMIT itself, as on `connect`'s.
    `sqlite3.Error` if SQLite cannot open it; the caller closes it.
    """
    return sqlite3.connect(
        uri,
        uri=True,
        timeout=busy_timeout,
        isolation_level=None,  # warmenv issues BEGIN/COMMIT itself
        check_same_thread=False,
    )


def open_image(image: bytes) -> sqlite3.Connection:
    """A plain, synchronous, read-only connection to a database held in memory as the
    bytes of its file (`image`, copied by SQLite; `sqlite3.Connection.deserialize`).

    For a look at the first bytes of a file read ahead (a SQLite bundle's first
    pages, fetched by range): a page `image` does not hold reads as damage
    (`sqlite3.DatabaseError`), never as the rest of a file. The caller closes it.
    """
    connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    try:
        connection.deserialize(image)
        connection.execute("PRAGMA query_only = ON")
    except BaseException:
        connection.close()
        raise
    return connection


async def open_with(
    target: str,
    prepare: Callable[[sqlite3.Connection], T],
    *,
    uri: bool = False,
    busy_timeout: float = BUSY_TIMEOUT_SECONDS,
) -> tuple[Connection, T]:
    """Connect, then run `prepare` on the new connection (a schema check, say).

    If `prepare` fails or the caller is cancelled, the connection is closed
    before the exception goes on: an open that did not finish leaks nothing.
    """
    connection = await connect(target, uri=uri, busy_timeout=busy_timeout)
    try:
        return connection, await connection.run(prepare)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await connection.close()
        raise


def open_memory(prepare: Callable[[sqlite3.Connection], T]) -> tuple[Connection, T]:
    """A new private `:memory:` database, `prepare`d; no event loop needed (see `_memory`)."""
    from warmenv._sqlite._memory import MemoryConnection

    connection = MemoryConnection()
    return connection, connection.run_here(prepare)  # if it fails, nothing else holds it
