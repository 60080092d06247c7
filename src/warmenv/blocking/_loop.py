"""The one event-loop thread of warmenv.blocking, and the one way across to it.

Every blocking environment in a process is served by one asyncio loop on a
daemon thread, started on first use and stopped at interpreter exit (or in
a forked child, forgotten: the child has the parent's memory, not its
threads). A synchronous caller reaches it only through `LoopThread`'s
crossing: a task started on the loop for one coroutine, and a mailbox the
caller's thread waits on. Through the mailbox the task can also hand work
back to the waiting thread (`asking`: a computation, a progress callback)
or hold an async context open until the caller releases it (`hold`).
An interrupted caller cancels its task and waits for it to end, so nothing
it started outlives the call.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, suppress
from typing import Any, Final, Generic, TypeVar, TypeVarTuple, final

import anyio
import attrs

from warmenv._backend import event_loop_here
from warmenv._errors import CALLER, ClosedError, WarmenvError, caller

__all__ = [
    "Ask",
    "EventLoopThreadError",
    "Held",
    "LoopThread",
    "refuse_event_loop_thread",
    "refused",
    "shared_loop",
    "waiting_refused",
]

R = TypeVar("R")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

Ask = Callable[[Callable[[], T]], Awaitable[T]]
"""In a crossing's task: `await ask(fn)` runs `fn()` on the waiting thread."""


class EventLoopThreadError(WarmenvError, RuntimeError):
    """warmenv.blocking was called on a thread running an event loop."""


def refused(what: str) -> EventLoopThreadError:
    """The error for `what`, called where waiting is refused (see `waiting_refused`)."""
    return EventLoopThreadError(
        f"warmenv.blocking {what} was called from async code (inside a coroutine, or a"
        " callback of an event loop), where waiting would block that loop; use the async"
        " API (warmenv.open_environment, await store.get(...)) there"
    )


_ASYNC: Final = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def waiting_refused() -> bool:
    """Whether a blocking call here must be refused: this thread runs an event loop,
    and the caller is its async code, not a REPL's or notebook cell's own.

    The one rule, checked on every call, hits included (a hit would work, but
    the same line would block, or deadlock, the loop on its first miss). A
    thread with no loop may always wait. On a loop's thread, only code that
    a coroutine ran with `exec` may: a Jupyter (ipykernel) cell, which runs
    on the kernel's loop but is the user's synchronous code, as
    `time.sleep` there is. Walking out from the caller, the first frame of a
    coroutine (or async generator) refuses, and so does a loop's callback
    (no such frame at all); a module's code met first allows it if and only
    if it is not itself async (a cell with a top-level `await`) and a
    coroutine ran it. Our loop thread never runs a cell, so it is refused
    there: waiting for itself would deadlock. A hit path calls this only
    if `event_loop_here()`, the first step below, is true: the same rule,
    one frame fewer for the threads that run no loop.
    """
    if not event_loop_here():
        return False
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_flags & _ASYNC:
            return True
        if code.co_name == "<module>":
            runner = frame.f_back
            return runner is None or not runner.f_code.co_flags & _ASYNC
        frame = frame.f_back
    return True


def refuse_event_loop_thread(what: str) -> None:
    """`EventLoopThreadError` for `what` if waiting here is refused (`waiting_refused`)."""
    if waiting_refused():
        raise refused(what)


_DONE: Final[Any] = object()  # the mailbox's last item: the task has ended


@attrs.define(eq=False)
class _Letter:
    """Something the task hands the waiting thread, and the thread's reply."""

    content: Any
    read: asyncio.Event = attrs.field(factory=asyncio.Event)
    reply: Any = None


@attrs.frozen
class _Raised:
    """An exception raised on the waiting thread, for the task to raise."""

    error: Exception


@final
class _Trip:
    """One coroutine run in a task on the loop, for a caller waiting on its own thread."""

    __slots__ = ("_loop", "_mail", "_tasks")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, make: Callable[[_Trip], Coroutine[Any, Any, Any]]
    ) -> None:
        self._loop = loop
        self._mail: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._tasks: list[asyncio.Task[Any]] = []
        coroutine = make(self)  # made here: nothing of it runs before the task does

        def start() -> None:
            task = loop.create_task(coroutine)
            self._tasks.append(task)
            task.add_done_callback(lambda _: self._mail.put(_DONE))

        # The task runs in a copy of this thread's context: what it warns names our caller.
        token = CALLER.set(CALLER.get() or caller(inspect.currentframe()))
        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:
            coroutine.close()
            raise ClosedError("warmenv.blocking's event-loop thread has stopped") from None
        finally:
            CALLER.reset(token)

    # --- in the task ---

    async def hand(self, content: Any) -> Any:
        """Hand `content` to the waiting thread; its reply."""
        letter = _Letter(content)
        self._mail.put(letter)
        await letter.read.wait()
        return letter.reply

    async def ask(self, fn: Callable[[], T]) -> T:
        """`fn()` run on the waiting thread: its value, or the exception it raised."""
        reply = await self.hand(fn)
        if isinstance(reply, _Raised):
            raise reply.error
        return reply  # type: ignore[no-any-return]

    # --- on the waiting thread ---

    def receive(self) -> Any:
        """The next letter from the task, or `_DONE` once it has ended."""
        return self._mail.get()

    def answer(self, letter: _Letter, reply: Any) -> None:
        letter.reply = reply
        self._loop.call_soon_threadsafe(letter.read.set)

    def when_done(self, fn: Callable[[], object]) -> None:
        """Call `fn()` on the loop thread once the task has ended."""
        self._loop.call_soon_threadsafe(lambda: self._tasks[0].add_done_callback(lambda _: fn()))

    def abandon(self) -> None:
        """Cancel the task (the caller was interrupted, or failed) and wait until it ends."""
        self._loop.call_soon_threadsafe(lambda: self._tasks[0].cancel())
        while self._mail.get() is not _DONE:
            pass

    def result(self) -> Any:
        return self._tasks[0].result()


@final
class Held(Generic[T]):
    """An async context entered in a task on the loop and held open until `release`.

    What `LoopThread.hold` returns: the open form without a `with` block. It
    holds no reference to what the caller wraps around `value`, so a
    finaliser of that wrapper may release it.
    """

    __slots__ = ("_letter", "_lock", "_owner", "_trip", "_waited", "value")

    def __init__(self, owner: LoopThread, trip: _Trip, letter: _Letter) -> None:
        self._owner = owner
        self._trip = trip
        self._letter: _Letter | None = letter
        self._waited = False
        self._lock = threading.Lock()  # for the state only, never held while waiting
        self.value: T = letter.content
        trip.when_done(lambda: owner.forget(self))

    def release(self, exc_info: tuple[Any, Any, Any] = (None, None, None), *, wait: bool) -> None:
        """Leave the context (`__aexit__(*exc_info)`); with `wait`, until it has left.

        Safe from any thread, and again: only the first call leaves it, only
        the first waiting call waits (and raises what `__aexit__` raised).
        Without `wait` (a finaliser, which may run on any thread, the loop's
        own included) it only tells the task; the loop's stop waits for it.
        """
        with self._lock:
            letter, self._letter = self._letter, None
            waiting = wait and not self._waited
            self._waited = self._waited or wait
        if letter is not None:
            try:
                self._trip.answer(letter, exc_info)
            except RuntimeError:  # the loop has stopped: its runner left the context
                self._owner.forget(self)
                return
        if waiting:
            LoopThread.end(self._trip)


@final
class LoopThread:
    """An asyncio event loop on a daemon thread, and the crossing to it."""

    __slots__ = ("_held", "_held_lock", "_stopping", "loop", "thread")

    def __init__(self) -> None:
        ready: concurrent.futures.Future[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = (
            concurrent.futures.Future()
        )
        self.thread = threading.Thread(
            target=self._main, args=(ready,), name="warmenv-blocking-loop", daemon=True
        )
        self.thread.start()
        self.loop, self._stopping = ready.result()
        self._held: set[Held[Any]] = set()
        self._held_lock = threading.RLock()  # a finaliser may run while it is taken

    @staticmethod
    def _main(
        ready: concurrent.futures.Future[tuple[asyncio.AbstractEventLoop, asyncio.Event]],
    ) -> None:
        loops: list[object] = []

        async def serve() -> None:
            loop = asyncio.get_running_loop()
            loops.append(loop)
            stopping = asyncio.Event()
            ready.set_result((loop, stopping))
            # When this returns, the loop's runner cancels every task still
            # running (an environment still open closes) and waits for them.
            await stopping.wait()

        try:
            anyio.run(serve)
        except BaseException as exc:  # reported to the thread that started the loop
            if not ready.done():
                ready.set_exception(exc)
            else:
                raise
        finally:
            # anyio tells its worker threads to stop when the loop ends but does
            # not wait for them; wait, so none outlives the loop thread.
            for thread in threading.enumerate():
                if loops and getattr(thread, "loop", None) is loops[0]:
                    thread.join(timeout=10)

    def call(self, fn: Callable[[*Ts], Coroutine[Any, Any, R]], *args: *Ts) -> R:
        """`await fn(*args)` in a task on the loop, waiting for it on this thread.

        This is every miss's round trip. The loop is always asyncio's (the
        thread is ours), and anyio code runs in any asyncio task.
        """
        trip = _Trip(self.loop, lambda _: fn(*args))
        try:
            trip.receive()  # nothing is handed back: this is its end
        except BaseException:  # interrupted: the task is ours to cancel and wait for
            trip.abandon()
            raise
        return trip.result()  # type: ignore[no-any-return]

    def asking(
        self, fn: Callable[[Ask[Any]], Coroutine[Any, Any, R]], *, hand_back_errors: bool
    ) -> R:
        """`await fn(ask)` in a task on the loop, running on this thread what it asks for.

        With `hand_back_errors`, an exception raised by what was asked for is
        raised in the task, at its `await ask(...)` (the task decides); else it
        cancels the task, as an interruption does, and is raised here once the
        task has ended.
        """
        trip = _Trip(self.loop, lambda trip: fn(trip.ask))
        try:
            while (letter := trip.receive()) is not _DONE:
                if hand_back_errors:
                    try:
                        reply = letter.content()
                    except Exception as exc:
                        reply = _Raised(exc)
                else:
                    reply = letter.content()
                trip.answer(letter, reply)
        except BaseException:
            trip.abandon()
            raise
        return trip.result()  # type: ignore[no-any-return]

    def hold(self, manager: AbstractAsyncContextManager[T]) -> Held[T]:
        """`async with manager` entered in one task on the loop, held until released.

        Whatever is still held when the loop stops (at interpreter exit) is
        released first, and waited for, so it leaves its context cleanly.
        """
        trip, letter = self._enter(manager)
        held: Held[T] = Held(self, trip, letter)
        with self._held_lock:
            self._held.add(held)
        return held

    def forget(self, held: Held[Any]) -> None:
        """`held` has left its context: stop does not wait for it."""
        with self._held_lock:
            self._held.discard(held)

    def _enter(self, manager: AbstractAsyncContextManager[Any]) -> tuple[_Trip, _Letter]:
        """A task on the loop inside `async with manager`, waiting for the letter's reply."""

        async def hold(trip: _Trip) -> bool | None:
            value = await manager.__aenter__()
            exc_info: tuple[Any, Any, Any] = (None, None, None)
            try:
                # The block runs on the caller's thread; its exception, if any, comes back.
                exc_info = await trip.hand(value)
            finally:
                # Also when the loop stops (at exit) with the block still running.
                suppressed = await manager.__aexit__(*exc_info)
            return suppressed

        trip = _Trip(self.loop, hold)
        try:
            letter = trip.receive()
        except BaseException:
            trip.abandon()
            raise
        if letter is _DONE:
            trip.result()  # raises why it could not be entered
            raise AssertionError("entering ended without a value or an error")  # pragma: no cover
        return trip, letter

    @staticmethod
    def end(trip: _Trip) -> None:
        """Wait for `trip`'s task to end; what it raised is raised here."""
        try:
            trip.receive()
        except BaseException:
            trip.abandon()
            raise
        trip.result()

    def soon(self, fn: Callable[[], object]) -> None:
        """Run `fn()` on the loop thread soon, without waiting for it."""
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:
            raise ClosedError("warmenv.blocking's event-loop thread has stopped") from None

    def stop(self) -> None:
        """End the loop (cancelling what still runs, and its worker threads), join the thread.

        What is still held open (an environment never closed) is released
        first and waited for; an error leaving it is no reason not to stop.
        """
        with self._held_lock:
            held, self._held = list(self._held), set()
        for each in held:
            with suppress(Exception):
                each.release(wait=True)
        try:
            self.loop.call_soon_threadsafe(self._stopping.set)
        except RuntimeError:
            pass  # already stopped
        self.thread.join(timeout=10)


_loop_lock = threading.Lock()
_loop: LoopThread | None = None


def shared_loop() -> LoopThread:
    """The process's loop thread, started on first use."""
    loop = _loop
    return _start_loop() if loop is None else loop


def _start_loop() -> LoopThread:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = LoopThread()
            atexit.register(_stop_loop)
        return _loop


def _stop_loop() -> None:
    global _loop
    with _loop_lock:
        loop, _loop = _loop, None
    if loop is not None:
        loop.stop()


def _forget_loop_after_fork() -> None:
    # The child has the parent's memory but not its threads: start afresh.
    global _loop, _loop_lock
    _loop = None
    _loop_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_loop_after_fork)
