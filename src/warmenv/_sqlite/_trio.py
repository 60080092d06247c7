"""The trio side of the seam: one dedicated worker thread per connection.

The worker runs submitted functions in order and hands each result back
through the trio token, so a call costs one thread hop and no
`to_thread.run_sync` set-up. A caller cancelled while its function runs is
woken at once; the function still runs to its end on the worker, and the
next call queues behind it, so nothing half-done is ever observed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from queue import SimpleQueue
from typing import Any, TypeVar, final

import anyio
import outcome
import trio

from warmenv._errors import ClosedError

T = TypeVar("T")
_Job = Callable[[], None] | None


def _worker(jobs: SimpleQueue[_Job]) -> None:
    while (job := jobs.get()) is not None:
        job()


@final
class TrioConnection:
    __slots__ = ("_jobs", "_raw")

    def __init__(self, jobs: SimpleQueue[_Job]) -> None:
        self._jobs = jobs
        self._raw: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, connector: Callable[[], sqlite3.Connection]) -> TrioConnection:
        jobs: SimpleQueue[_Job] = SimpleQueue()
        threading.Thread(target=_worker, args=(jobs,), name="warmenv-sqlite", daemon=True).start()
        self = cls(jobs)
        try:
            self._raw = await self._call(connector)
        except BaseException:
            jobs.put(None)
            raise
        return self

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        raw = self._raw
        if raw is None:
            raise ClosedError("this SQLite connection is closed; open the environment again")
        return await self._call(partial(fn, raw))

    async def close(self) -> None:
        raw = self._raw
        if raw is None:
            return
        self._raw = None
        with anyio.CancelScope(shield=True):
            try:
                await self._call(raw.close)
            finally:
                self._jobs.put(None)

    async def _call(self, thunk: Callable[[], T]) -> T:
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
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
