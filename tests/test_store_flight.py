"""Single flight: one run per key at a time, shared with every concurrent asker."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked

from helpers import counted
from warmenv import CacheMode, Environment, Namespace, Store, WarmenvError
from warmenv.persistence._flight import Flights

pytestmark = pytest.mark.anyio

NS = Namespace("app", "tuned", version="1")


_SELF = (
    "an async memoized function awaiting itself with its own arguments (asyncio, uvloop, trio)",
    "WarmenvError 'it would wait for itself' within 30 s, never a hang",
)


class TuningFailed(Exception):
    pass


async def test_a_failing_run_is_shared_by_every_waiter(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS)
    runs = 0
    gate = anyio.Event()
    caught: list[BaseException] = []

    async def tune() -> int:
        nonlocal runs
        runs += 1
        await gate.wait()
        raise TuningFailed(f"run {runs} failed")

    async def ask() -> None:
        with pytest.raises(TuningFailed) as info:
            await store.get_or_compute("k", tune)
        caught.append(info.value)

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(ask)
        await wait_all_tasks_blocked()
        gate.set()
    assert runs == 1
    assert len(caught) == 20
    assert all(exc is caught[0] for exc in caught)
    assert await env.storage(NS).get(b'"k"') is None


async def test_the_call_after_a_failed_run_starts_a_new_run(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS)
    outcomes: list[int | None] = [None, 3]

    async def tune() -> int:
        outcome = outcomes.pop(0)
        if outcome is None:
            raise TuningFailed("first run")
        return outcome

    with pytest.raises(TuningFailed):
        await store.get_or_compute("k", tune)
    assert await store.get_or_compute("k", tune) == 3
    assert outcomes == []


async def test_a_cancelled_waiter_leaves_the_run_to_the_others(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS)
    runs = 0
    gate = anyio.Event()
    results: list[int] = []

    async def tune() -> int:
        nonlocal runs
        runs += 1
        await gate.wait()
        return 5

    async def ask() -> None:
        results.append(await store.get_or_compute("k", tune))

    impatient = anyio.CancelScope()

    async def ask_impatiently() -> None:
        with impatient:
            await store.get_or_compute("k", tune)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        await wait_all_tasks_blocked()
        tg.start_soon(ask_impatiently)
        for _ in range(5):
            tg.start_soon(ask)
        await wait_all_tasks_blocked()
        impatient.cancel()
        await wait_all_tasks_blocked()
        gate.set()
    assert impatient.cancelled_caught
    assert runs == 1
    assert results == [5] * 6


async def test_when_the_runs_starter_is_cancelled_a_waiter_runs_it_again(
    env: Environment,
) -> None:
    store: Store[str, int] = await env.store(NS)
    runs = 0
    first_started = anyio.Event()
    results: list[int] = []

    async def tune(answer: int) -> int:
        nonlocal runs
        runs += 1
        if runs == 1:
            first_started.set()
            await anyio.sleep_forever()
        return answer

    starter = anyio.CancelScope()

    async def start() -> None:
        with starter:
            await store.get_or_compute("k", tune, 1)

    async def ask() -> None:
        results.append(await store.get_or_compute("k", tune, 2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        await first_started.wait()
        for _ in range(5):
            tg.start_soon(ask)
        await wait_all_tasks_blocked()
        starter.cancel()
    assert starter.cancelled_caught
    assert runs == 2  # the abandoned run, and one run for all five waiters
    assert results == [2] * 5
    assert await store.get("k") == 2


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_200_askers_for_10_missing_keys_compute_exactly_10_times(
    env: Environment, mode: CacheMode
) -> None:
    store: Store[str, str] = await env.store(NS, mode=mode)
    computed: list[str] = []

    async def tune(key: str) -> str:
        computed.append(key)
        await anyio.lowlevel.checkpoint()
        return f"tuned {key}"

    results: dict[int, str] = {}

    async def ask(asker: int) -> None:
        key = f"k{asker % 10}"
        results[asker] = await store.get_or_compute(key, tune, key)

    async with anyio.create_task_group() as tg:
        for asker in range(200):
            tg.start_soon(ask, asker)
    assert sorted(computed) == sorted(f"k{i}" for i in range(10))
    assert results == {asker: f"tuned k{asker % 10}" for asker in range(200)}


async def test_arguments_are_passed_so_a_loop_cannot_bind_the_wrong_key(
    env: Environment,
) -> None:
    store: Store[str, str] = await env.store(NS)

    async def tune(key: str, size: int) -> str:
        await anyio.lowlevel.checkpoint()
        return f"{key}@{size}"

    async with anyio.create_task_group() as tg:
        for key in ("a", "b", "c"):
            tg.start_soon(store.get_or_compute, key, tune, key, 64)
    assert [await store.get(key) for key in ("a", "b", "c")] == ["a@64", "b@64", "c@64"]
    assert await env.storage(NS).get(b'"b"') == b'"b@64"'


async def test_one_keys_run_does_not_hold_up_another_key(env: Environment) -> None:
    store: Store[str, str] = await env.store(NS)
    slow_gate = anyio.Event()

    async def slow() -> str:
        await slow_gate.wait()
        return "slow"

    async def fast() -> str:
        return "fast"

    async with anyio.create_task_group() as tg:
        tg.start_soon(store.get_or_compute, "slow", slow)
        await wait_all_tasks_blocked()
        assert await store.get_or_compute("fast", fast) == "fast"
        slow_gate.set()
    assert await store.get("slow") == "slow"


async def test_a_compute_asking_for_its_own_key_raises_instead_of_waiting_forever(
    env: Environment,
) -> None:
    store: Store[str, int] = await env.store(NS)

    async def recurse() -> int:
        return await store.get_or_compute("self", recurse) + 1

    with anyio.fail_after(30):  # the old code waited for itself here, forever
        with pytest.raises(WarmenvError, match="while computing that very key"):
            await store.get_or_compute("self", recurse)
    assert await store.get("self") is None  # the failed run stored nothing
    assert await store.get_or_compute("self", _one) == 1  # and the next call runs anew


@counted(*_SELF)
async def test_a_memoized_function_calling_itself_with_its_own_arguments_raises(
    env: Environment,
) -> None:
    store: Store[list[object], int] = await env.store(NS)

    @store.memoize
    async def depth(n: int) -> int:
        return await depth(n) + 1

    with anyio.fail_after(30):
        with pytest.raises(WarmenvError, match="it would wait for itself"):
            await depth(3)


async def test_another_task_asking_for_a_key_being_computed_waits_for_it(
    env: Environment,
) -> None:
    # Only the run's own task is refused: a task it starts is another asker.
    store: Store[str, int] = await env.store(NS)
    answers: list[int] = []

    async def ask() -> None:
        answers.append(await store.get_or_compute("k", _one))

    async with anyio.create_task_group() as tg:

        async def compute() -> int:
            tg.start_soon(ask)
            await wait_all_tasks_blocked()  # the asker waits for this run now
            return 7

        tg.start_soon(store.get_or_compute, "k", compute)
    assert answers == [7]


async def _one() -> int:
    return 1


async def test_a_run_nobody_waits_for_makes_no_event_and_a_waiter_is_still_woken() -> None:
    """The event a run's end sets is made by its first waiter: most runs (a read, a remote
    hit) have none, and making one is most of what an uncontended run costs."""
    flights: Flights[str, int] = Flights()
    seen: list[object] = []
    gate = anyio.Event()

    async def alone() -> int:
        seen.append(flights._flights["alone"].done)
        return 1

    async def waited_for() -> int:
        await gate.wait()
        return 2

    assert await flights.run("alone", alone) == 1
    assert seen == [None]
    answers: list[int] = []

    async def ask() -> None:
        answers.append(await flights.run("waited", waited_for))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        tg.start_soon(ask)
        await wait_all_tasks_blocked()
        assert flights._flights["waited"].done is not None  # made by the waiter
        gate.set()
    assert answers == [2, 2] and len(flights) == 0
