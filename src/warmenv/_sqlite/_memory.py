"""The in-memory side of the seam: a `:memory:` database run on the caller's thread.

An environment that cannot use its file, and a `MemoryStorage`, keep their
entries in a SQLite database in memory, so that they run the very SQL a
file does: one insert rule, one eviction, one statistics path. Such a
database touches no disk, so a call cannot stall on I/O the way a file's
can; it runs where it is called, after one checkpoint (a cancelled caller
changes nothing; once the function runs, it runs whole, as it never awaits),
with no worker thread and so no event loop of its own: a connection made
outside any loop (`MemoryStorage(namespace)` is a plain constructor) serves
whichever loop uses it. A lock keeps two threads from sharing the sqlite3
connection at once.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Generic, TypeVar, final

import anyio.lowlevel

from warmenv._errors import ClosedError

__all__ = ["MemoryConnection"]

T = TypeVar("T")


@final
class MemoryConnection:
    """A connection to a new, private `:memory:` database (the `Connection` protocol)."""

    __slots__ = ("_lock", "_raw")

    def __init__(self) -> None:
        self._raw: sqlite3.Connection | None = sqlite3.connect(
            ":memory:",
            isolation_level=None,  # warmenv issues BEGIN/COMMIT itself
            check_same_thread=False,
            cached_statements=256,
        )
        self._lock = threading.Lock()

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        await anyio.lowlevel.checkpoint()
        return self.run_here(fn)

    def start(self, fn: Callable[[sqlite3.Connection], T]) -> _Ran[T]:
        # Nothing to overlap: it runs here, now (a `ClosedError` is raised now, as `run`'s).
        try:
            return _Ran(self.run_here(fn), None)
        except ClosedError:
            raise
        except Exception as exc:
            return _Ran(None, exc)

    def run_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._raw is None:
                raise ClosedError("this in-memory database is closed; open the environment again")
            return fn(self._raw)

    async def close(self) -> None:
        with self._lock:
            raw, self._raw = self._raw, None
        if raw is not None:
            raw.close()


@final
class _Ran(Generic[T]):
    """`MemoryConnection.start`'s `Pending`: a function that has run already."""

    __slots__ = ("_error", "_value")

    def __init__(self, value: T | None, error: Exception | None) -> None:
        self._value = value
        self._error = error

    async def result(self) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
