"""Futures and tasks, and the bridge from synchronous code into async code.

anyio (>= 4.16) already has a backend-neutral `Future`, task handles and
`gather`; warmenv re-exports them rather than growing a second kind of future.
What it adds is the way in from synchronous code: `block_on` for a caller that
can wait, and `spawn_detached` for a synchronous entry point that wants a
warm-up to run in the background while it carries on.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.from_thread
from anyio import Future, TaskHandle, create_task_group, gather

from warmenv._backend import event_loop_here

__all__ = ["Future", "TaskHandle", "block_on", "create_task_group", "gather", "spawn_detached"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def _options(backend_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    # A copy: the caller's mapping may change (or be a read-only view) before the loop starts.
    return None if backend_options is None else dict(backend_options)


def block_on(
    fn: Callable[[Unpack[Ts]], Awaitable[T]],
    *args: *Ts,
    backend: str = "asyncio",
    backend_options: Mapping[str, Any] | None = None,
) -> T:
    """Run `fn(*args)` to completion from synchronous code and return its result.

    From an anyio worker thread (`anyio.to_thread.run_sync`) it runs on the
    event loop that started the thread (and `backend` does not apply);
    elsewhere it runs a fresh event loop of `backend`, made with
    `backend_options` as `anyio.run` takes them (`{"use_uvloop": True}` for
    uvloop). It refuses to run on a thread whose loop is running, where
    blocking would deadlock that very loop.
    """
    if event_loop_here():
        raise RuntimeError(
            "block_on() was called on a thread whose event loop is running, where it would "
            "block that loop; await the coroutine function instead"
        )

    started = False

    async def run() -> T:
        nonlocal started
        started = True
        return await fn(*args)

    try:
        return anyio.from_thread.run(run)
    except anyio.NoEventLoopError:
        if started:
            raise
    return anyio.run(run, backend=backend, backend_options=_options(backend_options))


def spawn_detached(
    fn: Callable[[Unpack[Ts]], Awaitable[T]],
    *args: *Ts,
    backend: str = "asyncio",
    backend_options: Mapping[str, Any] | None = None,
) -> concurrent.futures.Future[T]:
    """Run `fn(*args)` on a daemon thread with its own event loop.

    For a synchronous entry point that starts a warm-up and carries on; the
    returned future holds the result or the exception. Cancelling the future
    before the thread starts the function prevents it from running. The loop
    is `backend`'s, made with `backend_options` as `anyio.run` takes them
    (`{"use_uvloop": True}` for uvloop).
    """
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    options = _options(backend_options)

    async def run() -> T:
        return await fn(*args)

    def thread_main() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = anyio.run(run, backend=backend, backend_options=options)
        except BaseException as exc:  # the future carries whatever happened
            future.set_exception(exc)
        else:
            future.set_result(result)

    name = f"warmenv-detached-{getattr(fn, '__qualname__', 'task')}"
    threading.Thread(target=thread_main, name=name, daemon=True).start()
    return future
