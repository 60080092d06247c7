from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from warmenv import stream
from warmenv.stream import StreamId, StreamPolicy


@pytest.fixture(autouse=True)
def _restore_policy() -> Iterator[None]:
    before = stream.policy()
    yield
    stream.set_policy(before)


def test_the_default_policy_is_per_thread() -> None:
    assert stream.policy() is StreamPolicy.PER_THREAD


def test_stream_ids_are_hashable_ordered_ints() -> None:
    assert StreamId(1) < StreamId(2)
    assert {StreamId(3), StreamId(3)} == {StreamId(3)}
    assert int(StreamId(7)) == 7 == StreamId(7).value


def test_new_never_repeats() -> None:
    ids = {stream.new() for _ in range(1000)}
    assert len(ids) == 1000
    assert StreamId(0) not in ids


def test_per_thread_is_stable_in_a_thread_and_distinct_between_threads() -> None:
    stream.set_policy(StreamPolicy.PER_THREAD)
    mine = stream.current()
    assert stream.current() == mine
    theirs: list[StreamId] = []
    thread = threading.Thread(target=lambda: theirs.append(stream.current()))
    thread.start()
    thread.join()
    assert theirs[0] != mine


def test_per_thread_ids_are_not_reused_by_later_threads() -> None:
    stream.set_policy(StreamPolicy.PER_THREAD)
    seen: list[StreamId] = []
    for _ in range(20):
        thread = threading.Thread(target=lambda: seen.append(stream.current()))
        thread.start()
        thread.join()
    assert len(set(seen)) == 20


def test_single_is_always_stream_zero() -> None:
    stream.set_policy(StreamPolicy.SINGLE)
    assert stream.current() == StreamId(0)


def test_set_policy_rejects_other_values() -> None:
    with pytest.raises(TypeError):
        stream.set_policy("per_task")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_per_task_is_stable_across_awaits_and_distinct_between_live_tasks() -> None:
    stream.set_policy(StreamPolicy.PER_TASK)
    seen: dict[int, list[StreamId]] = {}

    async def task(n: int) -> None:
        seen[n] = [stream.current()]
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
            seen[n].append(stream.current())

    async with anyio.create_task_group() as tg:
        for n in range(5):
            tg.start_soon(task, n)
    for ids in seen.values():
        assert len(set(ids)) == 1
    assert len({ids[0] for ids in seen.values()}) == 5


@pytest.mark.anyio
async def test_per_task_ids_are_not_reused_after_a_task_ends() -> None:
    stream.set_policy(StreamPolicy.PER_TASK)
    seen: list[StreamId] = []

    async def task() -> None:
        seen.append(stream.current())

    for _ in range(50):
        async with anyio.create_task_group() as tg:
            tg.start_soon(task)
    assert len(set(seen)) == 50


@pytest.mark.anyio
async def test_enter_pins_current_nests_and_restores() -> None:
    stream.set_policy(StreamPolicy.PER_TASK)
    base = stream.current()
    a, b = stream.new(), stream.new()
    with stream.enter(a):
        assert stream.current() == a
        await anyio.lowlevel.checkpoint()
        assert stream.current() == a
        with stream.enter(b):
            assert stream.current() == b
        assert stream.current() == a
    assert stream.current() == base


@pytest.mark.anyio
async def test_enter_in_one_task_does_not_leak_into_a_sibling() -> None:
    stream.set_policy(StreamPolicy.SINGLE)
    pinned = stream.new()
    sibling_saw: list[StreamId] = []

    async def pinned_task(ready: anyio.Event) -> None:
        with stream.enter(pinned):
            ready.set()
            await anyio.sleep_forever()

    async def sibling() -> None:
        sibling_saw.append(stream.current())

    async with anyio.create_task_group() as tg:
        ready = anyio.Event()
        tg.start_soon(pinned_task, ready)
        await ready.wait()
        tg.start_soon(sibling)
        await wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert sibling_saw == [StreamId(0)]
