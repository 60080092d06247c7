from __future__ import annotations

import concurrent.futures
import threading

import anyio
import anyio.to_thread
import pytest

from warmenv.future import (
    Future,
    TaskHandle,
    block_on,
    create_task_group,
    gather,
    spawn_detached,
)


async def _double(x: int) -> int:
    await anyio.lowlevel.checkpoint()
    return 2 * x


async def _fail() -> None:
    await anyio.lowlevel.checkpoint()
    raise ValueError("nope")


def test_future_names_are_anyios_own() -> None:
    assert (Future, TaskHandle, create_task_group, gather) == (
        anyio.Future,
        anyio.TaskHandle,
        anyio.create_task_group,
        anyio.gather,
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_block_on_runs_a_coroutine_function_from_sync_code(backend: str) -> None:
    assert block_on(_double, 21, backend=backend) == 42


def test_block_on_propagates_the_exception() -> None:
    with pytest.raises(ValueError, match="nope"):
        block_on(_fail)


@pytest.mark.anyio
async def test_block_on_refuses_to_block_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="await the coroutine function instead"):
        block_on(_double, 1)


@pytest.mark.anyio
async def test_block_on_from_a_worker_thread_runs_on_the_originating_loop() -> None:
    loop_thread = threading.get_ident()
    ran_on: list[int] = []

    async def where() -> int:
        ran_on.append(threading.get_ident())
        return await _double(5)

    result = await anyio.to_thread.run_sync(block_on, where)
    assert result == 10
    assert ran_on == [loop_thread]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_spawn_detached_runs_on_a_daemon_thread_and_returns_a_future(backend: str) -> None:
    seen: list[threading.Thread] = []

    async def work(x: int) -> int:
        seen.append(threading.current_thread())
        return await _double(x)

    future = spawn_detached(work, 4, backend=backend)
    assert isinstance(future, concurrent.futures.Future)
    assert future.result(timeout=30) == 8
    assert seen[0] is not threading.main_thread()
    assert seen[0].daemon


def test_spawn_detached_carries_the_exception() -> None:
    future = spawn_detached(_fail)
    with pytest.raises(ValueError, match="nope"):
        future.result(timeout=30)
