"""The trio side of the seam: one dedicated worker thread per connection.

The worker (`_worker`) runs submitted functions in order and hands each result back
through the trio token, so a call costs one thread hop and no
`to_thread.run_sync` set-up (and a `start`ed one whose answer is there
before it is awaited not even the hop back: `_Started`). A caller cancelled
while its function runs is woken at once; the function still runs to its end
on the worker, and the next call queues behind it, so nothing half-done is
ever observed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar, final

import anyio
import outcome
import trio

from warmenv._errors import ClosedError, WarmenvError
from warmenv._sqlite import _worker
from warmenv._sqlite._here import Readers
from warmenv._sqlite._loop import foreign_loop_error, trio_run_label

T = TypeVar("T")


@final
class TrioConnection:
    __slots__ = (
        "_database",
        "_handover",
        "_jobs",
        "_opened_on",
        "_raw",
        "_readers",
        "_token",
        "_worker",
    )

    def __init__(self, worker: _worker.Worker, database: str, readers: Readers) -> None:
        self._worker = worker
        self._jobs = worker.jobs  # the hot path's, one attribute away
        self._raw: sqlite3.Connection | None = None
        self._readers = readers
        self._token = trio.lowlevel.current_trio_token()
        self._opened_on = trio_run_label(self._token)
        self._database = database
        self._handover = threading.Lock()  # `start`'s answers, between the worker and the loop

    @classmethod
    async def open(
        cls, connector: Callable[[], sqlite3.Connection], database: str
    ) -> TrioConnection:
        self = cls(_worker.start(), database, Readers(connector, database))
        try:
            self._raw = await self._call(connector, self._token)
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
        token = self._token_here()
        return await self._call(partial(fn, raw), token)

    def start(self, fn: Callable[[sqlite3.Connection], T]) -> _Started[T]:
        raw = self._raw
        if raw is None:
            raise ClosedError("this SQLite connection is closed; open the environment again")
        token = self._token_here()
        started: _Started[T] = _Started(token, self._handover)
        thunk = partial(fn, raw)

        def job() -> None:
            started.deliver(outcome.capture(thunk))

        self._jobs.put(job)
        return started

    def run_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._readers.run(fn)

    async def close(self) -> None:
        raw = self._raw
        if raw is None:
            return
        token = self._token_here()
        self._raw = None
        self._readers.close()
        with anyio.CancelScope(shield=True):
            try:
                await self._call(raw.close, token)
            finally:
                await _worker.ended(self._worker)

    def _token_here(self) -> trio.lowlevel.TrioToken:
        """This connection's trio token, if this thread runs its trio run; else why not.

        The token `_call` needs anyway, fetched once: the loop check costs one `is`.
        """
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:  # not in a trio run: asyncio, or no loop in this thread
            raise self._foreign() from None
        if token is not self._token:
            raise self._foreign()
        return token

    def _foreign(self) -> WarmenvError:
        return foreign_loop_error(self._database, self._opened_on)

    async def _call(self, thunk: Callable[[], T], token: trio.lowlevel.TrioToken) -> T:
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        waiting = True

        def deliver(result: outcome.Outcome[T]) -> None:
            nonlocal waiting
            if waiting:
                waiting = False
                trio.lowlevel.reschedule(task, result)

        def job() -> None:
            result = outcome.capture(thunk)
            try:
                token.run_sync_soon(deliver, result)
            except trio.RunFinishedError:
                pass

        def abort(_: Any) -> trio.lowlevel.Abort:
            nonlocal waiting
            waiting = False
            return trio.lowlevel.Abort.SUCCEEDED

        self._jobs.put(job)
        value: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return value


@final
class _Started(Generic[T]):
    """`TrioConnection.start`'s `Pending`: the job's outcome, and the task waiting for it.

    The worker hands the outcome over under the connection's `handover` lock, and
    wakes the trio thread only for a task already waiting: an answer that comes
    before it is awaited (a local read that beat the Redis round trip it overlaps)
    is taken by `result` without a hop back through the trio token, which cost a
    remote hit a loop wake-up (the wake-up socket, a step of trio's entry-queue
    task, another pass of the run loop).
    """

    __slots__ = ("_handover", "_outcome", "_task", "_token")

    def __init__(self, token: trio.lowlevel.TrioToken, handover: threading.Lock) -> None:
        self._token = token
        self._handover = handover
        self._outcome: outcome.Outcome[T] | None = None
        self._task: trio.lowlevel.Task | None = None
        """The task waiting in `result`, if any: set and read under `handover`."""

    def deliver(self, answer: outcome.Outcome[T]) -> None:
        """On the worker: keep the outcome; wake the task waiting for it, if any."""
        with self._handover:
            self._outcome = answer
            waiting = self._task is not None
        if waiting:
            try:
                self._token.run_sync_soon(self._wake)
            except trio.RunFinishedError:
                pass

    def _wake(self) -> None:
        """On the trio thread: the waiting task goes on (unless it was cancelled meanwhile)."""
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self._task = None  # a `_wake` on its way finds no one
        return trio.lowlevel.Abort.SUCCEEDED

    async def result(self) -> T:
        if self._outcome is None:
            with self._handover:
                waiting = self._outcome is None
                if waiting:
                    self._task = trio.lowlevel.current_task()
            if waiting:
                await trio.lowlevel.wait_task_rescheduled(self._abort)
        return self._outcome.unwrap()  # type: ignore[union-attr]
