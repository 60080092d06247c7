from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import anyio
import pytest
from anyio import WouldBlock, wait_all_tasks_blocked

from warmenv._backend import native_task
from warmenv.sync import (
    CapacityLimiter,
    Condition,
    Event,
    Lock,
    OnceCell,
    OnceCellStatistics,
    RLock,
    RLockStatistics,
    RWLock,
    RWLockStatistics,
    Semaphore,
)

pytestmark = pytest.mark.anyio


def test_the_basic_primitives_are_anyios_own() -> None:
    assert (Lock, Semaphore, Event, Condition, CapacityLimiter) == (
        anyio.Lock,
        anyio.Semaphore,
        anyio.Event,
        anyio.Condition,
        anyio.CapacityLimiter,
    )


async def test_the_native_task_is_found_without_raising_on_every_backend() -> None:
    """`native_task` asks the backend running here; it never tries one and catches its refusal
    (each `get_or_compute` miss and each RLock acquire asks it: a raise is a cost)."""
    raised: list[type[BaseException]] = []

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "exception":
            raised.append(arg[0])
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        task = native_task()
    finally:
        sys.settrace(previous)
    assert raised == []
    others: list[object] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _append_native_task(others))
    assert task is native_task() and others and others[0] is not task


async def _append_native_task(into: list[object]) -> None:
    into.append(native_task())


def test_the_native_task_outside_any_event_loop_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="inside an asyncio or trio task"):
        native_task()


async def test_rlock_is_reentrant_for_its_owner() -> None:
    lock = RLock()
    async with lock:
        async with lock:
            assert lock.locked()
        assert lock.locked()
    assert not lock.locked()


async def test_rlock_excludes_other_tasks_until_fully_released() -> None:
    lock = RLock()
    order: list[str] = []

    async def other() -> None:
        async with lock:
            order.append("other")

    await lock.acquire()
    await lock.acquire()
    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        await wait_all_tasks_blocked()
        lock.release()
        await wait_all_tasks_blocked()
        order.append("owner still holds")
        lock.release()
    assert order == ["owner still holds", "other"]


async def test_rlock_release_by_a_task_that_does_not_own_it_raises() -> None:
    lock = RLock()
    await lock.acquire()
    errors: list[BaseException] = []

    async def intruder() -> None:
        try:
            lock.release()
        except RuntimeError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(intruder)
    assert len(errors) == 1
    assert "not held by the current task" in str(errors[0])
    assert lock.locked()
    lock.release()


async def test_rlock_release_when_unlocked_raises() -> None:
    with pytest.raises(RuntimeError, match="not held"):
        RLock().release()


async def test_rlock_waiter_cancelled_leaves_the_lock_usable() -> None:
    lock = RLock()
    await lock.acquire()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lock.acquire)
        await wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    lock.release()
    assert not lock.locked()
    with anyio.fail_after(5):
        async with lock:
            assert lock.locked()


async def test_rlock_owner_identity_is_not_reused_by_a_later_task() -> None:
    lock = RLock()

    async def take_and_finish() -> None:
        await lock.acquire()

    async with anyio.create_task_group() as tg:
        tg.start_soon(take_and_finish)
    # The task that holds it ended; a new task must not be taken for the owner.
    results: list[bool] = []

    async def try_release() -> None:
        with pytest.raises(RuntimeError):
            lock.release()
        results.append(lock.locked())

    async with anyio.create_task_group() as tg:
        tg.start_soon(try_release)
    assert results == [True]


async def test_rwlock_lets_many_readers_in_at_once() -> None:
    lock = RWLock()
    inside = 0
    peak = 0
    release = Event()

    async def reader() -> None:
        nonlocal inside, peak
        async with lock.read():
            inside += 1
            peak = max(peak, inside)
            await release.wait()
            inside -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(reader)
        await wait_all_tasks_blocked()
        release.set()
    assert peak == 5


async def test_rwlock_writer_excludes_readers_and_writers() -> None:
    lock = RWLock()
    log: list[str] = []

    async def reader() -> None:
        async with lock.read():
            log.append("read")

    async def writer() -> None:
        async with lock.write():
            log.append("write")

    await lock.acquire_write()
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        await wait_all_tasks_blocked()
        assert log == []
        assert lock.statistics().waiting_writers == 1
        assert lock.statistics().waiting_readers == 1
        lock.release_write()
    # The queued writer goes first: a waiting writer blocks readers.
    assert log == ["write", "read"]


async def test_rwlock_a_waiting_writer_blocks_new_readers() -> None:
    lock = RWLock()
    log: list[str] = []
    first_reader_done = Event()

    async def late_reader() -> None:
        async with lock.read():
            log.append("late reader")

    async def writer() -> None:
        async with lock.write():
            log.append("writer")

    async with anyio.create_task_group() as tg:
        await lock.acquire_read()
        tg.start_soon(writer)
        await wait_all_tasks_blocked()
        tg.start_soon(late_reader)
        await wait_all_tasks_blocked()
        assert log == []
        lock.release_read()
        first_reader_done.set()
    assert log == ["writer", "late reader"]


async def test_rwlock_cancelled_waiting_writer_lets_blocked_readers_through() -> None:
    lock = RWLock()
    log: list[str] = []
    await lock.acquire_read()

    async def reader() -> None:
        async with lock.read():
            log.append("reader")

    async with anyio.create_task_group() as outer:
        with anyio.CancelScope() as writer_scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lock.acquire_write)
                await wait_all_tasks_blocked()
                outer.start_soon(reader)
                await wait_all_tasks_blocked()
                assert log == []
                writer_scope.cancel()
        await wait_all_tasks_blocked()
    assert log == ["reader"]
    lock.release_read()
    assert lock.statistics() == lock.statistics().__class__(0, False, 0, 0)


async def test_rwlock_writer_cancelled_as_it_is_woken_leaves_the_lock_to_the_next() -> None:
    lock = RWLock()
    log: list[str] = []
    await lock.acquire_write()
    first_scope = anyio.CancelScope()

    async def first_writer() -> None:
        with first_scope:
            async with lock.write():
                log.append("first woken")
                await anyio.lowlevel.checkpoint()
                log.append("first kept running")  # pragma: no cover - cancelled above

    async def second_writer() -> None:
        async with lock.write():
            log.append("second")

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_writer)
        await wait_all_tasks_blocked()
        tg.start_soon(second_writer)
        await wait_all_tasks_blocked()
        lock.release_write()  # wakes the first writer...
        first_scope.cancel()  # ...whose scope is cancelled before it runs
    assert log[-1] == "second"
    assert "first kept running" not in log
    assert lock.statistics() == lock.statistics().__class__(0, False, 0, 0)


async def test_rwlock_release_without_holding_raises() -> None:
    lock = RWLock()
    with pytest.raises(RuntimeError):
        lock.release_read()
    with pytest.raises(RuntimeError):
        lock.release_write()


async def test_oncecell_runs_the_initializer_once_for_concurrent_callers() -> None:
    cell: OnceCell[int] = OnceCell()
    calls = 0
    gate = Event()
    results: list[int] = []

    async def init() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 42

    async def caller() -> None:
        results.append(await cell.get_or_init(init))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(caller)
        await wait_all_tasks_blocked()
        gate.set()
    assert calls == 1
    assert results == [42] * 10
    assert cell.is_set()
    assert cell.get() == 42


async def test_oncecell_is_retried_after_the_initializer_fails() -> None:
    cell: OnceCell[str] = OnceCell()

    async def broken() -> str:
        raise ValueError("boom")

    async def working() -> str:
        return "ok"

    with pytest.raises(ValueError):
        await cell.get_or_init(broken)
    assert not cell.is_set()
    assert cell.get() is None
    assert await cell.get_or_init(working) == "ok"


async def test_oncecell_is_retried_after_the_initializer_is_cancelled() -> None:
    cell: OnceCell[str] = OnceCell()
    waiter_results: list[str] = []

    async def hangs() -> str:
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def quick() -> str:
        return "second"

    async def waiter() -> None:
        waiter_results.append(await cell.get_or_init(quick))

    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as inner:
                inner.start_soon(cell.get_or_init, hangs)
                await wait_all_tasks_blocked()
                tg.start_soon(waiter)
                await wait_all_tasks_blocked()
                scope.cancel()
    assert waiter_results == ["second"]
    assert cell.get() == "second"


async def test_rlock_statistics_show_the_owner_its_depth_and_the_waiters() -> None:
    lock = RLock()
    assert lock.statistics() == RLockStatistics(locked=False, owner=None, depth=0, tasks_waiting=0)
    await lock.acquire()
    await lock.acquire()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lock.acquire)
        tg.start_soon(lock.acquire)
        await wait_all_tasks_blocked()
        stats = lock.statistics()
        tg.cancel_scope.cancel()
    assert stats.locked
    assert stats.owner == anyio.get_current_task()
    assert (stats.depth, stats.tasks_waiting) == (2, 2)
    lock.release()
    lock.release()
    assert lock.statistics().depth == 0


async def test_rlock_statistics_are_a_frozen_value() -> None:
    stats = RLock().statistics()
    with pytest.raises(AttributeError):
        stats.depth = 3  # type: ignore[misc]


async def test_rlock_acquire_nowait_takes_a_free_lock_and_reenters_for_its_owner() -> None:
    lock = RLock()
    lock.acquire_nowait()
    lock.acquire_nowait()
    assert lock.statistics().depth == 2
    lock.release()
    assert lock.locked()
    lock.release()
    assert not lock.locked()


async def test_rlock_acquire_nowait_would_block_while_another_task_holds_it() -> None:
    lock = RLock()
    outcomes: list[str] = []

    async def try_it() -> None:
        try:
            lock.acquire_nowait()
        except WouldBlock:
            outcomes.append("would block")

    async with lock:
        async with anyio.create_task_group() as tg:
            tg.start_soon(try_it)
    assert outcomes == ["would block"]
    assert lock.statistics() == RLockStatistics(False, None, 0, 0)


async def test_rwlock_acquire_read_nowait_shares_and_would_block_behind_a_writer() -> None:
    lock = RWLock()
    lock.acquire_read_nowait()
    lock.acquire_read_nowait()
    assert lock.statistics() == RWLockStatistics(2, False, 0, 0)
    with pytest.raises(WouldBlock):
        lock.acquire_write_nowait()
    lock.release_read()
    lock.release_read()
    lock.acquire_write_nowait()
    with pytest.raises(WouldBlock):
        lock.acquire_read_nowait()
    with pytest.raises(WouldBlock):
        lock.acquire_write_nowait()
    lock.release_write()
    assert lock.statistics() == RWLockStatistics(0, False, 0, 0)


async def test_rwlock_acquire_read_nowait_would_block_while_a_writer_waits() -> None:
    lock = RWLock()
    await lock.acquire_read()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lock.acquire_write)
        await wait_all_tasks_blocked()
        with pytest.raises(WouldBlock):
            lock.acquire_read_nowait()
        lock.release_read()
    assert lock.statistics() == RWLockStatistics(0, True, 0, 0)
    lock.release_write()


async def test_oncecell_statistics_show_a_running_initializer_and_its_waiters() -> None:
    cell: OnceCell[int] = OnceCell()
    gate = Event()

    async def init() -> int:
        await gate.wait()
        return 1

    assert cell.statistics() == OnceCellStatistics(
        is_set=False, initializing=False, tasks_waiting=0
    )
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(cell.get_or_init, init)
        await wait_all_tasks_blocked()
        during = cell.statistics()
        gate.set()
    assert during == OnceCellStatistics(is_set=False, initializing=True, tasks_waiting=2)
    assert cell.statistics() == OnceCellStatistics(is_set=True, initializing=False, tasks_waiting=0)


async def test_oncecell_get_nowait_would_block_until_an_initializer_completes() -> None:
    cell: OnceCell[int] = OnceCell()
    with pytest.raises(WouldBlock):
        cell.get_nowait()

    async def init() -> int:
        return 5

    await cell.get_or_init(init)
    assert cell.get_nowait() == 5


async def test_oncecell_get_nowait_tells_a_stored_none_from_an_empty_cell() -> None:
    cell: OnceCell[int | None] = OnceCell()

    async def init() -> int | None:
        return None

    await cell.get_or_init(init)
    assert cell.get() is None
    assert cell.get_nowait() is None  # a value, where an empty cell raises WouldBlock
