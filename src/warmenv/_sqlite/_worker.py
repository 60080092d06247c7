"""A connection's worker thread: the one thread its sqlite3 connection is used on.

SQLite work must not run on an event loop's thread, and a transaction must
be one function run whole (BEGIN to COMMIT) even when its caller is
cancelled. So every connection gets a thread of its own that runs the
functions submitted to it, in order, each to its end; each backend's side
of the seam (`_asyncio`, `_trio`) only says how a result gets back to the
waiting task. A daemon thread: a connection never closed cannot keep the
process from exiting. A connection closed has no thread left: `ended`
waits for it (on another thread, never blocking the loop), so that a
program or test that closed everything finds no worker of warmenv running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import final

import anyio.to_thread

__all__ = ["THREAD_NAME", "Jobs", "Worker", "ended", "start", "stop"]

THREAD_NAME = "warmenv-sqlite"

Jobs = SimpleQueue[Callable[[], None] | None]
"""What a worker runs, in order; `None` ends it."""


@final
class Worker:
    """A worker thread and the queue of the jobs it runs."""

    __slots__ = ("jobs", "thread")

    def __init__(self, jobs: Jobs, thread: threading.Thread) -> None:
        self.jobs = jobs
        self.thread = thread


def start() -> Worker:
    """Start a worker thread."""
    jobs: Jobs = SimpleQueue()
    thread = threading.Thread(target=_work, args=(jobs,), name=THREAD_NAME, daemon=True)
    thread.start()
    return Worker(jobs, thread)


def stop(worker: Worker) -> None:
    """End the worker once the jobs already submitted have run (without waiting)."""
    worker.jobs.put(None)


async def ended(worker: Worker) -> None:
    """`stop` the worker and wait until its thread has ended.

    The join runs on another thread, so the loop serves other tasks
    meanwhile; its caller has had the result of the worker's last job, so
    the wait is only the thread leaving. Not cancellable: call it where the
    jobs are done (a close, a failed open), shielded.
    """
    stop(worker)
    if worker.thread.is_alive():
        await anyio.to_thread.run_sync(worker.thread.join)


def _work(jobs: Jobs) -> None:
    while (job := jobs.get()) is not None:
        job()
