from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest
import trio

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


class _RunCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.runs = 0

    def before_run(self) -> None:
        self.runs += 1


@attrs.frozen
class OptionsCase:
    """Backend options and a probe, run inside the loop, that sees whether they took."""

    backend: str
    options: dict[str, Any]
    took_effect: Callable[[], Awaitable[bool]]


@pytest.fixture(params=["asyncio", "uvloop", "trio"])
def options_case(request: pytest.FixtureRequest) -> OptionsCase:
    if request.param == "trio":
        counter = _RunCounter()

        async def instrumented() -> bool:
            return counter.runs == 1

        return OptionsCase("trio", {"instruments": [counter]}, instrumented)
    if request.param == "uvloop":

        async def on_uvloop() -> bool:
            return type(asyncio.get_running_loop()).__module__.startswith("uvloop")

        return OptionsCase("asyncio", {"use_uvloop": True}, on_uvloop)

    async def in_debug_mode() -> bool:
        return asyncio.get_running_loop().get_debug()

    return OptionsCase("asyncio", {"debug": True}, in_debug_mode)


def test_block_on_makes_its_loop_with_the_backend_options(options_case: OptionsCase) -> None:
    took = block_on(
        options_case.took_effect,
        backend=options_case.backend,
        backend_options=options_case.options,
    )
    assert took


def test_spawn_detached_makes_its_loop_with_the_backend_options(
    options_case: OptionsCase,
) -> None:
    future = spawn_detached(
        options_case.took_effect,
        backend=options_case.backend,
        backend_options=options_case.options,
    )
    assert future.result(timeout=30)


def test_block_on_without_backend_options_runs_plain_asyncio() -> None:
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert block_on(loop_module).startswith("asyncio")
