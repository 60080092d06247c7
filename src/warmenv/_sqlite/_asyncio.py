"""The asyncio side of the seam: one dedicated worker thread per connection.

The worker runs submitted functions in order (`_worker.start`) and hands
each result back through the loop's `call_soon_threadsafe`: a call costs one
thread hop, as on trio, where the result comes back through the trio token
(and a `start`ed one whose answer is there before it is awaited not even the
hop back: `_Started`).
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
import threading
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
    __slots__ = (
        "_database",
        "_handover",
        "_jobs",
        "_loop",
        "_opened_on",
        "_raw",
        "_readers",
        "_worker",
    )

    def __init__(self, worker: _worker.Worker, database: str, readers: Readers) -> None:
        self._worker = worker
        self._jobs = worker.jobs  # the hot path's, one attribute away
        self._raw: sqlite3.Connection | None = None
        self._readers = readers
        self._loop = asyncio.get_running_loop()
        self._opened_on = asyncio_loop_label(self._loop)
        self._database = database
        self._handover = threading.Lock()  # `start`'s answers, between the worker and the loop

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
        started: _Started[T] = _Started(self._loop, self._handover)

        def job() -> None:
            try:
                answer: tuple[T | None, BaseException | None] = (fn(raw), None)
            except BaseException as exc:  # delivered to the caller, who decides
                answer = (None, exc)
            started.deliver(answer)

        self._jobs.put(job)
        return started

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
    """`AsyncioConnection.start`'s `Pending`: the job's answer, and the future of a
    caller waiting for it.

    The worker hands the answer over under the connection's `handover` lock, and
    wakes the loop only for a caller already waiting: an answer that comes before
    it is awaited (a local read that beat the Redis round trip it overlaps) is
    taken by `result` without a hop back through `call_soon_threadsafe`, which
    cost a remote hit a loop wake-up (the self-pipe, another pass of the loop).
    An answer is a value, an exception too: one nobody takes (a caller cancelled
    meanwhile) is dropped, never logged as a future's unretrieved exception.
    """

    __slots__ = ("_answer", "_future", "_handover", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, handover: threading.Lock) -> None:
        self._loop = loop
        self._handover = handover
        self._answer: tuple[T | None, BaseException | None] | None = None
        self._future: asyncio.Future[None] | None = None
        """The waiting caller's, if any: set and read under `handover`."""

    def deliver(self, answer: tuple[T | None, BaseException | None]) -> None:
        """On the worker: keep the answer; wake the caller waiting for it, if any."""
        with self._handover:
            self._answer = answer
            future = self._future
        if future is not None:
            _deliver(self._loop, future, _set_result, None)

    async def result(self) -> T:
        if self._answer is None:
            with self._handover:
                future = None
                if self._answer is None:
                    future = self._future = self._loop.create_future()
            if future is not None:
                await future
        value, error = self._answer  # type: ignore[misc]
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
