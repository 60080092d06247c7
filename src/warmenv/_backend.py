"""Which event loop is running, and which native task is current.

anyio identifies tasks by `id(task)`, which Python reuses once a task is gone,
so code that must tell tasks apart over time (lock owners, stream identity)
holds the native task object itself instead.
"""

from __future__ import annotations

import asyncio
import sys

# asyncio exports it (it is in asyncio.events.__all__) for exactly this: to
# ask whether a loop runs on this thread without raising, as the public
# get_running_loop() does (which would cost a hit path several times over).
from asyncio import _get_running_loop
from typing import Any, Literal

import anyio

__all__ = [
    "Backend",
    "current_backend",
    "event_loop_here",
    "native_task",
    "running_asyncio_loop",
    "sniffio_thread",
]

Backend = Literal["asyncio", "trio"]

running_asyncio_loop = _get_running_loop
"""The asyncio loop running on this thread, or None (without raising, unlike
`asyncio.get_running_loop`): for code that must tell its own loop from another."""


class _Unnamed:
    name: str | None = None


try:
    # trio names itself here while it runs on this thread (trio >= 0.23; anyio
    # runs trio >= 0.32 only): a plain attribute read, where trio's own
    # in_trio_run() would have to be imported first.
    from sniffio import thread_local as _sniffio_thread
except ImportError:  # no sniffio, so no trio (trio requires it)
    _sniffio_thread: Any = _Unnamed()  # type: ignore[no-redef]

sniffio_thread = _sniffio_thread
"""Its `name` is the async library running on this thread (trio's while it runs), or None."""


def event_loop_here() -> bool:
    """Whether an event loop (asyncio's, trio's) runs on this thread.

    The one rule of it, cheap enough to check on every hit of a blocking
    store: blocking on such a thread would stall that loop, or deadlock it.
    The hits of a blocking store (`BlockingStore.get`, `get_or_compute`, a
    memoized call) inline this line, naming it: the call to this function
    cost a `str` hit 384 machine instructions of its 4,077, where the whole
    floor (a dict lookup under a lock, with the benchmark's loop) is 2,750
    (callgrind, `benchmarks/hit_instructions.py --backend blocking`).
    """
    return running_asyncio_loop() is not None or sniffio_thread.name is not None


def current_backend() -> Backend:
    """The async library running in this thread; `NoEventLoopError` if none is."""
    if _get_running_loop() is not None:
        return "asyncio"
    if _sniffio_thread.name == "trio":
        return "trio"
    raise anyio.NoEventLoopError("no asyncio or trio event loop is running in this thread")


def native_task() -> object:
    """The running asyncio.Task or trio Task; `RuntimeError` outside a task.

    Asked of the backend that runs on this thread (as `current_backend`
    does), never by trying asyncio and catching its refusal: on trio that
    was an exception raised and caught on every `get_or_compute` miss and
    every `RLock` acquire.
    """
    loop = _get_running_loop()
    if loop is not None:
        task = asyncio.current_task(loop)
        if task is not None:
            return task
    elif _sniffio_thread.name == "trio":
        return sys.modules["trio"].lowlevel.current_task()
    raise RuntimeError("this must be called from inside an asyncio or trio task")
