"""Reads on the calling thread: for callers that are not on an event loop.

A caller on a plain thread (`warmenv.blocking`) that needs one row would
otherwise cross to the event-loop thread, which crosses to the worker
thread and back twice; each crossing waits for a thread to wake. It can
instead read with a connection of its own: in WAL mode a reader sees the
last committed state and never waits for the writer, and the sqlite3
module lets go of the GIL while SQLite works, so threads read in parallel.

The connections are pooled, not kept per thread, so a program that starts a
thread per request leaves no connection behind per dead thread. They are
read-only (`query_only`): writes stay on the worker, where a transaction is
one function. A pool belongs to the process that opened it: SQLite
connections must not be used across `fork`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from typing import TypeVar, final

from warmenv._errors import ClosedError

__all__ = ["Readers"]

T = TypeVar("T")

IDLE_KEPT = 8
"""Connections kept open between reads; more concurrent readers open and close their own."""


@final
class Readers:
    """A pool of read-only connections to one database, used on the calling thread."""

    __slots__ = ("_closed", "_connector", "_database", "_idle", "_lock", "_pid")

    def __init__(self, connector: Callable[[], sqlite3.Connection], database: str) -> None:
        self._connector = connector
        self._database = database
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)` on this thread, with a read-only connection no other thread uses.

        `ClosedError` once the pool is closed, or in a process forked from the
        one that opened it; `sqlite3.Error` from opening or from `fn`.
        """
        with self._lock:
            if self._closed or os.getpid() != self._pid:
                raise ClosedError(
                    f"the SQLite connection to {self._database} is closed (or belongs to"
                    " the process this one was forked from); open the environment again"
                )
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            connection = self._open()
        try:
            return fn(connection)
        finally:
            with self._lock:
                keep = not self._closed and len(self._idle) < IDLE_KEPT
                if keep:
                    self._idle.append(connection)
            if not keep:
                connection.close()

    def close(self) -> None:
        """Close the idle connections; one in use closes when its read ends. Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        if os.getpid() == self._pid:  # a forked child leaves the parent's connections alone
            for connection in idle:
                connection.close()

    def _open(self) -> sqlite3.Connection:
        connection = self._connector()
        try:
            connection.execute("PRAGMA query_only = ON")
        except BaseException:
            connection.close()
            raise
        return connection
