"""A connection's worker thread: the one thread its sqlite3 connection is used on.

SQLite work must not run on an event loop's thread, and a transaction must
be one function run whole (BEGIN to COMMIT) even when its caller is
cancelled. So every connection gets a thread of its own that runs the
functions submitted to it, in order, each to its end; each backend's side
of the seam (`_asyncio`, `_trio`) only says how a result gets back to the
waiting task. A daemon thread: a connection never closed cannot keep the
process from exiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import SimpleQueue

__all__ = ["Jobs", "start", "stop"]

Jobs = SimpleQueue[Callable[[], None] | None]
"""What a worker runs, in order; `None` ends it."""


def start() -> Jobs:
    """Start a worker thread; the queue to submit its jobs to."""
    jobs: Jobs = SimpleQueue()
    threading.Thread(target=_work, args=(jobs,), name="warmenv-sqlite", daemon=True).start()
    return jobs


def stop(jobs: Jobs) -> None:
    """End the worker once the jobs already submitted have run."""
    jobs.put(None)


def _work(jobs: Jobs) -> None:
    while (job := jobs.get()) is not None:
        job()
