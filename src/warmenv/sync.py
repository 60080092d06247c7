"""Locks that behave the same on asyncio and trio.

anyio already provides the basic primitives, and warmenv re-exports them
unchanged. It lacks three that warm-up code keeps asking for: a task-reentrant
lock (anyio issue 563), a read-write lock (trio issue 528) and a cell that is
initialised once however many tasks race for it. They are built here on
anyio's own primitives, so cancellation semantics are anyio's: a task
cancelled while waiting leaves the primitive exactly as if it had never come.
Like anyio's, each has a form that never waits (raising `anyio.WouldBlock`)
and a `statistics()` snapshot for debugging.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Generic, TypeVar, final

import attrs
from anyio import CapacityLimiter, Condition, Event, Lock, Semaphore, TaskInfo, WouldBlock
from anyio.lowlevel import cancel_shielded_checkpoint, checkpoint, checkpoint_if_cancelled

from warmenv._backend import native_task
from warmenv._faces import AsyncWith

__all__ = [
    "CapacityLimiter",
    "Condition",
    "Event",
    "Lock",
    "OnceCell",
    "OnceCellStatistics",
    "RLock",
    "RLockStatistics",
    "RWLock",
    "RWLockStatistics",
    "Semaphore",
]

T = TypeVar("T")


@attrs.frozen
class RLockStatistics:
    """A snapshot of an `RLock`, for debugging.

    `depth` is how many times the owner holds it (0 when free); `owner` is
    anyio's `TaskInfo` of the owning task, as in anyio's `LockStatistics`.
    """

    locked: bool
    owner: TaskInfo | None
    depth: int
    tasks_waiting: int


@final
class RLock(AsyncWith):
    """A lock the owning task may acquire again without deadlocking itself.

    It is free once released as many times as it was acquired. Ownership is
    held as the native task object, never its id, so a task that ends while
    holding the lock can never be mistaken for a new task.
    """

    __slots__ = ("_count", "_lock", "_owner")
    _async_form = "lock"

    def __init__(self) -> None:
        self._lock = Lock()
        self._owner: object | None = None
        self._count = 0

    async def acquire(self) -> None:
        """Acquire the lock, waiting if another task holds it."""
        task = native_task()
        if self._owner is task:
            await checkpoint()
            self._count += 1
            return
        await self._lock.acquire()
        self._owner = task
        self._count = 1

    def acquire_nowait(self) -> None:
        """Acquire the lock without waiting; `anyio.WouldBlock` if another task holds it."""
        task = native_task()
        if self._owner is task:
            self._count += 1
            return
        self._lock.acquire_nowait()
        self._owner = task
        self._count = 1

    def release(self) -> None:
        """Release one level of ownership; `RuntimeError` if this task does not own it."""
        if self._owner is not native_task():
            raise RuntimeError(
                "this RLock is not held by the current task; only the task that acquired "
                "it may release it (use `async with lock:` to pair the two)"
            )
        self._count -= 1
        if self._count == 0:
            self._owner = None
            self._lock.release()

    def locked(self) -> bool:
        """Whether any task holds the lock."""
        return self._lock.locked()

    def statistics(self) -> RLockStatistics:
        """Who holds the lock, how deeply, and how many tasks wait for it."""
        inner = self._lock.statistics()
        return RLockStatistics(
            locked=inner.locked,
            owner=inner.owner,
            depth=self._count,
            tasks_waiting=inner.tasks_waiting,
        )

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


@attrs.frozen
class RWLockStatistics:
    """A snapshot of an `RWLock`, for debugging."""

    readers: int
    writer: bool
    waiting_readers: int
    waiting_writers: int


@final
class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers.

    Waiters are woken rather than handed the lock: each re-checks the state
    when it runs. A writer cancelled after being woken passes the wake-up on,
    so cancellation can never strand the lock with waiters asleep.
    """

    __slots__ = ("_read_gate", "_readers", "_reading", "_waiting_readers", "_writer", "_writers")

    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._writers: deque[Event] = deque()
        self._waiting_readers = 0
        self._read_gate: Event | None = None
        self._reading = _ReadGuard(self)

    def read(self) -> _ReadGuard:
        """`async with lock.read():` holds the lock shared."""
        return self._reading

    def write(self) -> _WriteGuard:
        """`async with lock.write():` holds the lock exclusively."""
        return _WriteGuard(self)

    def statistics(self) -> RWLockStatistics:
        """Who holds the lock and who waits, for debugging."""
        return RWLockStatistics(
            readers=self._readers,
            writer=self._writer,
            waiting_readers=self._waiting_readers,
            waiting_writers=len(self._writers),
        )

    async def acquire_read(self) -> None:
        """Hold the lock shared; waits while a writer holds it or is waiting."""
        await checkpoint_if_cancelled()
        if not self._writer and not self._writers:
            self._readers += 1
            await cancel_shielded_checkpoint()
            return
        self._waiting_readers += 1
        try:
            while self._writer or self._writers:
                if self._read_gate is None:
                    self._read_gate = Event()
                await self._read_gate.wait()
        finally:
            self._waiting_readers -= 1
        self._readers += 1

    def acquire_read_nowait(self) -> None:
        """Hold the lock shared without waiting; `anyio.WouldBlock` if a writer holds or waits."""
        if self._writer or self._writers:
            raise WouldBlock
        self._readers += 1

    def release_read(self) -> None:
        """Give up one shared hold; `RuntimeError` if no reader holds the lock."""
        if self._readers == 0:
            raise RuntimeError("RWLock.release_read() called with no reader holding the lock")
        self._readers -= 1
        self._wake()

    async def acquire_write(self) -> None:
        """Hold the lock exclusively; writers are served in the order they came."""
        await checkpoint_if_cancelled()
        if not self._writer and not self._readers and not self._writers:
            self._writer = True
            await cancel_shielded_checkpoint()
            return
        turn = Event()
        self._writers.append(turn)
        try:
            await turn.wait()
        except BaseException:
            self._writers.remove(turn)
            self._wake()
            raise
        # Woken only when the lock was free; nobody can take it before us
        # because every newcomer sees us queued.
        self._writers.popleft()
        self._writer = True

    def acquire_write_nowait(self) -> None:
        """Hold the lock exclusively without waiting; `anyio.WouldBlock` unless it is free."""
        if self._writer or self._readers or self._writers:
            raise WouldBlock
        self._writer = True

    def release_write(self) -> None:
        """Give up the exclusive hold; `RuntimeError` if no writer holds the lock."""
        if not self._writer:
            raise RuntimeError("RWLock.release_write() called with no writer holding the lock")
        self._writer = False
        self._wake()

    def _wake(self) -> None:
        if self._writer:
            return
        if self._writers:
            if self._readers == 0:
                self._writers[0].set()
        elif self._read_gate is not None:
            self._read_gate.set()
            self._read_gate = None


@final
class _ReadGuard(AsyncWith):
    __slots__ = ("_lock",)
    _async_form = "lock.read()"

    def __init__(self, lock: RWLock) -> None:
        self._lock = lock

    async def __aenter__(self) -> None:
        await self._lock.acquire_read()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release_read()


@final
class _WriteGuard(AsyncWith):
    __slots__ = ("_lock",)
    _async_form = "lock.write()"

    def __init__(self, lock: RWLock) -> None:
        self._lock = lock

    async def __aenter__(self) -> None:
        await self._lock.acquire_write()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release_write()


_UNSET: object = object()


@attrs.frozen
class OnceCellStatistics:
    """A snapshot of a `OnceCell`, for debugging.

    `initializing` is whether an initialiser is running now, and
    `tasks_waiting` how many callers wait for it to finish.
    """

    is_set: bool
    initializing: bool
    tasks_waiting: int


@final
class OnceCell(Generic[T]):
    """A value computed once, however many tasks ask for it at the same time.

    A hit returns without yielding to the event loop: it is a plain attribute
    read, which is the point of caching it. If the initialiser raises or is
    cancelled the cell stays empty and the next caller runs it again.

    The non-waiting form is `get_nowait()`: it cannot run an initialiser
    (that needs an await), so it reads the value or raises `WouldBlock`.
    Unlike `get()`, it tells an empty cell from one holding `None`.
    """

    __slots__ = ("_lock", "_value")

    def __init__(self) -> None:
        self._value: object = _UNSET
        self._lock = Lock()

    def get(self) -> T | None:
        """The value, or `None` while the cell is empty."""
        value = self._value
        return None if value is _UNSET else value  # type: ignore[return-value]

    def get_nowait(self) -> T:
        """The value; `anyio.WouldBlock` while no initialiser has completed."""
        value = self._value
        if value is _UNSET:
            raise WouldBlock
        return value  # type: ignore[return-value]

    def is_set(self) -> bool:
        """Whether an initialiser has completed."""
        return self._value is not _UNSET

    def statistics(self) -> OnceCellStatistics:
        """Whether the value is there, and whether callers wait for an initialiser."""
        inner = self._lock.statistics()
        return OnceCellStatistics(
            is_set=self._value is not _UNSET,
            initializing=inner.locked,
            tasks_waiting=inner.tasks_waiting,
        )

    async def get_or_init(self, init: Callable[[], Awaitable[T]]) -> T:
        """The value, running `init` first if no caller has completed it yet."""
        value = self._value
        if value is not _UNSET:
            return value  # type: ignore[return-value]
        async with self._lock:
            if self._value is _UNSET:
                self._value = await init()
            return self._value  # type: ignore[return-value]
