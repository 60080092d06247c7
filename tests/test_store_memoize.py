"""`@store.memoize`: an async function whose calls go through `get_or_compute`."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from warmenv import Environment, Namespace, Store

pytestmark = pytest.mark.anyio

NS = Namespace("app", "tuned", version="1")


async def test_a_memoized_function_runs_once_per_distinct_arguments(env: Environment) -> None:
    store: Store[object, dict[str, int]] = await env.store(NS)
    calls: list[tuple[str, int]] = []

    @store.memoize
    async def tune(workload: str, size: int) -> dict[str, int]:
        calls.append((workload, size))
        return {"block": size // 8}

    assert await tune("matmul", 1024) == {"block": 128}
    assert await tune("matmul", 1024) == {"block": 128}
    assert await tune("matmul", 512) == {"block": 64}
    assert await tune(size=512, workload="matmul") == {"block": 64}
    assert calls == [("matmul", 1024), ("matmul", 512)]


async def test_the_key_is_the_list_of_arguments_with_defaults_applied(env: Environment) -> None:
    store: Store[object, str] = await env.store(NS)
    calls = 0

    @store.memoize
    async def tune(workload: str, size: int = 256) -> str:
        nonlocal calls
        calls += 1
        return f"{workload}@{size}"

    assert await tune("conv") == "conv@256"
    assert await tune("conv", 256) == "conv@256"
    assert calls == 1
    assert await store.get(["conv", 256]) == "conv@256"
    assert await env.storage(NS).get(b'["conv",256]') == b'"conv@256"'


async def test_a_key_function_chooses_the_key(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS)

    class Model:
        def __init__(self, name: str) -> None:
            self.name = name

    @store.memoize(key=lambda model, size: f"{model.name}/{size}")
    async def tune(model: Model, size: int) -> int:
        return size * 2

    assert await tune(Model("resnet"), 4) == 8
    assert await store.get("resnet/4") == 8


async def test_concurrent_calls_with_the_same_arguments_share_one_run(env: Environment) -> None:
    store: Store[object, int] = await env.store(NS)
    runs = 0
    gate = anyio.Event()
    results: list[int] = []

    @store.memoize
    async def tune(size: int) -> int:
        nonlocal runs
        runs += 1
        await gate.wait()
        return size + 1

    async def ask() -> None:
        results.append(await tune(41))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(ask)
        await wait_all_tasks_blocked()
        gate.set()
    assert runs == 1
    assert results == [42] * 10


async def test_memoize_keeps_the_functions_name_and_documentation(env: Environment) -> None:
    store: Store[object, int] = await env.store(NS)

    async def tune(size: int) -> int:
        """Tune for one size."""
        return size

    memoized = store.memoize(tune)
    assert memoized.__name__ == "tune"
    assert memoized.__doc__ == "Tune for one size."
    assert memoized.__wrapped__ is tune  # type: ignore[attr-defined]


async def test_an_argument_that_cannot_be_a_key_is_named(env: Environment) -> None:
    store: Store[object, int] = await env.store(NS)

    @store.memoize
    async def tune(shape: list[int], options: dict[str, object]) -> int:
        return 0

    with pytest.raises(TypeError, match=r"tune\(\) argument 'options'\['s'\]: set is not JSON"):
        await tune([1], {"s": {1}})


async def test_a_second_function_needs_its_own_store_or_a_key(env: Environment) -> None:
    store: Store[object, int] = await env.store(NS)

    @store.memoize
    async def first(size: int) -> int:
        return size

    async def second(size: int) -> int:
        return -size

    with pytest.raises(ValueError, match=r"already memoizes .*first\(\).*own namespace"):
        store.memoize(second)
    keyed = store.memoize(key=lambda size: ["second", size])(second)
    assert await first(3) == 3
    assert await keyed(3) == -3
