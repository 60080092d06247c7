"""Which event loop is running, and which native task is current.

anyio identifies tasks by `id(task)`, which Python reuses once a task is gone,
so code that must tell tasks apart over time (lock owners, stream identity)
holds the native task object itself instead.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Literal

import anyio

Backend = Literal["asyncio", "trio"]


def current_backend() -> Backend:
    """The async library running in this thread; `NoEventLoopError` if none is."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return "trio"
    raise anyio.NoEventLoopError("no asyncio or trio event loop is running in this thread")


def native_task() -> object:
    """The running asyncio.Task or trio Task; `RuntimeError` outside a task."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is not None:
        return task
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return trio.lowlevel.current_task()
        except RuntimeError:
            pass
    raise RuntimeError("this must be called from inside an asyncio or trio task")
