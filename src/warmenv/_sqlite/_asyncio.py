"""The asyncio side of the seam: aiosqlite's connection and its dedicated thread.

aiosqlite's public API runs one statement per hop. A warmenv transaction
must be one function run on the worker, so this module submits functions
through `Connection._execute`, the entry point every aiosqlite method is
built on (stable since aiosqlite 0.11). It is the only place warmenv touches
aiosqlite internals, and it checks for them at import.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar, final

import aiosqlite
import anyio

from warmenv._errors import ClosedError, WarmenvError
from warmenv._sqlite._here import Readers
from warmenv._sqlite._loop import asyncio_loop_label, foreign_loop_error

T = TypeVar("T")

if not hasattr(aiosqlite.Connection, "_execute"):  # pragma: no cover - version guard
    raise ImportError(
        f"aiosqlite {getattr(aiosqlite, '__version__', '?')} lacks Connection._execute, "
        "which warmenv needs to run a transaction in one hop; install aiosqlite>=0.20"
    )


@final
class AiosqliteConnection:
    __slots__ = ("_aio", "_database", "_loop", "_opened_on", "_raw", "_readers")

    def __init__(
        self, aio: aiosqlite.Connection, raw: sqlite3.Connection, database: str, readers: Readers
    ) -> None:
        self._aio = aio
        self._raw: sqlite3.Connection | None = raw
        self._readers = readers
        self._loop = asyncio.get_running_loop()
        self._opened_on = asyncio_loop_label(self._loop)
        self._database = database

    @classmethod
    async def open(
        cls, connector: Callable[[], sqlite3.Connection], database: str
    ) -> AiosqliteConnection:
        aio = aiosqlite.Connection(connector, iter_chunk_size=64)
        await aio
        raw: sqlite3.Connection = aio._conn
        return cls(aio, raw, database, Readers(connector, database))

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        raw = self._raw
        if raw is None:
            raise ClosedError("this SQLite connection is closed; open the environment again")
        if asyncio._get_running_loop() is not self._loop:
            raise self._foreign()
        execute: Any = self._aio._execute
        result: T = await execute(fn, raw)
        return result

    def run_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._readers.run(fn)

    async def close(self) -> None:
        if self._raw is None:
            return
        if asyncio._get_running_loop() is not self._loop:
            raise self._foreign()
        self._raw = None
        self._readers.close()
        with anyio.CancelScope(shield=True):
            await self._aio.close()

    def _foreign(self) -> WarmenvError:
        return foreign_loop_error(self._database, self._opened_on)
