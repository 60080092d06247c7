"""The asyncio side of the seam: one dedicated worker thread per connection.

The worker runs submitted functions in order (`_worker.start`) and hands
each result back through the loop's `call_soon_threadsafe`: a call costs one
thread hop, as on trio, where the result comes back through the trio token.
(This side used aiosqlite's thread before; its public API runs one statement
per hop, and a warmenv transaction must be one function, which took its
private `Connection._execute` and `_conn`. The worker is a few lines of
public asyncio and threading instead, and the same for both backends.) A
caller cancelled while its function runs is woken at once; the function
still runs to its end on the worker, and the next call queues behind it, so
nothing half-done is ever observed.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar, final

import anyio

from warmenv._errors import ClosedError, WarmenvError
from warmenv._sqlite import _worker
from warmenv._sqlite._here import Readers
from warmenv._sqlite._loop import asyncio_loop_label, foreign_loop_error

T = TypeVar("T")


@final
class AsyncioConnection:
    __slots__ = ("_database", "_jobs", "_loop", "_opened_on", "_raw", "_readers", "_worker")

    def __init__(self, worker: _worker.Worker, database: str, readers: Readers) -> None:
        self._worker = worker
        self._jobs = worker.jobs  # the hot path's, one attribute away
        self._raw: sqlite3.Connection | None = None
        self._readers = readers
        self._loop = asyncio.get_running_loop()
        self._opened_on = asyncio_loop_label(self._loop)
        self._database = database

    @classmethod
    async def open(
        cls, connector: Callable[[], sqlite3.Connection], database: str
    ) -> AsyncioConnection:
        self = cls(_worker.start(), database, Readers(connector, database))
        try:
            self._raw = await self._call(connector)
        except Exception:  # the open failed on the worker: its thread ends now
            with anyio.CancelScope(shield=True):
                await _worker.ended(self._worker)
            raise
        except BaseException:  # cancelled: the open may still run, and the thread ends after it
            _worker.stop(self._worker)
            raise
        return self

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        raw = self._raw
        if raw is None:
            raise ClosedError("this SQLite connection is closed; open the environment again")
        self._check_loop()
        return await self._call(partial(fn, raw))

    def start(self, fn: Callable[[sqlite3.Connection], T]) -> _Started[T]:
        raw = self._raw
        if raw is None:
            raise ClosedError("this SQLite connection is closed; open the environment again")
        self._check_loop()
        loop = self._loop
        future: asyncio.Future[tuple[T | None, BaseException | None]] = loop.create_future()

        def job() -> None:
            # Delivered as a result, an exception too: a future whose exception
            # nobody retrieves (a caller cancelled meanwhile) is logged by asyncio.
            try:
                answer: tuple[T | None, BaseException | None] = (fn(raw), None)
            except BaseException as exc:
                answer = (None, exc)
            _deliver(loop, future, _set_result, answer)

        self._jobs.put(job)
        return _Started(future)

    def run_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._readers.run(fn)

    async def close(self) -> None:
        raw = self._raw
        if raw is None:
            return
        self._check_loop()
        self._raw = None
        self._readers.close()
        with anyio.CancelScope(shield=True):
            try:
                await self._call(raw.close)
            finally:
                await _worker.ended(self._worker)

    def _check_loop(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no asyncio loop in this thread (trio, or none)
            raise self._foreign() from None
        if loop is not self._loop:
            raise self._foreign()

    def _foreign(self) -> WarmenvError:
        return foreign_loop_error(self._database, self._opened_on)

    async def _call(self, thunk: Callable[[], T]) -> T:
        loop = self._loop
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                result = thunk()
            except BaseException as exc:  # delivered to the caller, who decides
                _deliver(loop, future, _set_exception, exc)
            else:
                _deliver(loop, future, _set_result, result)

        self._jobs.put(job)
        return await future


@final
class _Started(Generic[T]):
    """`AsyncioConnection.start`'s `Pending`: the future its job answers."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[tuple[T | None, BaseException | None]]) -> None:
        self._future = future

    async def result(self) -> T:
        value, error = await self._future
        if error is not None:
            raise error
        return value  # type: ignore[return-value]


def _deliver(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    setter: Callable[[asyncio.Future[Any], Any], None],
    value: object,
) -> None:
    try:
        loop.call_soon_threadsafe(setter, future, value)
    except RuntimeError:  # the loop is closed: nobody waits for the result
        pass


def _set_result(future: asyncio.Future[Any], result: object) -> None:
    if not future.done():  # a cancelled caller left
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
