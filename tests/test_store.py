from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked

from warmenv import (
    BytesCodec,
    CacheMode,
    Conflict,
    Environment,
    JsonCodec,
    Namespace,
    Store,
    Stored,
)
from warmenv.persistence import Purged, Storage

pytestmark = pytest.mark.anyio

NS = Namespace("app", "tuned", version="1")


async def test_a_store_maps_typed_keys_to_typed_values(env: Environment) -> None:
    store: Store[str, dict[str, int]] = await env.store(NS)
    assert await store.insert("matmul-1024", {"block": 128}) == Stored()
    assert await store.get("matmul-1024") == {"block": 128}
    assert await store.get("other") is None
    assert len(store) == 1


async def test_values_are_canonical_json_in_the_storage(env: Environment) -> None:
    store: Store[list[object], dict[str, object]] = await env.store(NS)
    await store.insert(["matmul", 1024], {"b": 1, "a": [1.5, "x"]})
    raw = await env.storage(NS).get(b'["matmul",1024]')
    assert raw == b'{"a":[1.5,"x"],"b":1}'


async def test_eager_loads_the_namespace_at_open(env: Environment) -> None:
    await env.storage(NS).insert(b'"k"', b"42")
    store: Store[str, int] = await env.store(NS, mode=CacheMode.EAGER)
    assert len(store) == 1
    assert await store.get("k") == 42


async def test_eager_reads_a_key_it_does_not_hold_through_to_the_storage(
    env: Environment,
) -> None:
    store: Store[str, int] = await env.store(NS, mode=CacheMode.EAGER)
    await env.storage(NS).insert(b'"late"', b"1")  # behind the store's back
    assert await store.get("late") == 1
    assert len(store) == 1


async def test_lazy_faults_keys_in_on_first_access(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS, mode=CacheMode.LAZY)
    assert len(store) == 0
    await env.storage(NS).insert(b'"late"', b"7")
    assert await store.get("late") == 7
    assert len(store) == 1


async def test_reinserting_a_value_the_store_holds_does_not_reach_the_storage(
    env: Environment,
) -> None:
    store: Store[str, int] = await env.store(NS)
    await store.insert("k", 1)
    await env.storage(NS).purge()  # the storage no longer has it; the store does
    assert await store.insert("k", 1) == Stored()
    assert await env.storage(NS).get(b'"k"') is None


async def test_an_undecodable_value_is_a_miss_and_the_next_insert_repairs_it(
    env: Environment,
) -> None:
    storage = env.storage(NS)
    await storage.insert(b'"k"', b"\xff not json")
    for mode in CacheMode:
        store: Store[str, int] = await env.store(NS, mode=mode)
        assert await store.get("k") is None
    assert await store.insert("k", 5) == Stored()
    assert await storage.get(b'"k"') == b"5"


async def test_a_value_computed_over_one_that_does_not_decode_keeps_its_cost_and_says_so(
    any_env: Environment, caplog: pytest.LogCaptureFixture
) -> None:
    storage = any_env.storage(NS)
    await storage.insert(b'"k"', b"\xff not json")
    await storage.insert(b'"j"', b"{broken")

    async def tune(value: int) -> int:
        await anyio.lowlevel.checkpoint()
        return value

    with caplog.at_level(logging.WARNING, logger="warmenv.store"):
        store: Store[str, int] = await any_env.store(NS, mode=CacheMode.EAGER)
        assert await store.get_or_compute("k", tune, 5) == 5
        assert await store.get_or_compute("j", tune, 6) == 6
    assert await storage.get(b'"k"') == b"5"
    info = await storage.info(b'"k"')
    # The repair records what the computation took, so its hits count seconds saved.
    assert info is not None and info.cost is not None and info.cost >= 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "warmenv.store"]
    assert len(warnings) == 1 and "cannot decode" in warnings[0], warnings


async def test_get_or_compute_passes_keyword_arguments_of_any_name_to_fn(
    env: Environment,
) -> None:
    store: Store[str, str] = await env.store(NS)
    calls: list[tuple[object, ...]] = []

    async def tune(size: int, *, key: str, fn: str = "f") -> str:
        calls.append((size, key, fn))
        return f"{size}-{key}-{fn}"

    # `key` and `fn` are get_or_compute's own, positional-only: here they are fn's.
    assert await store.get_or_compute("a", tune, 3, key="k", fn="g") == "3-k-g"
    assert await store.get_or_compute("b", tune, size=4, key="j") == "4-j-f"
    assert await store.get_or_compute("a", tune, 9, key="other") == "3-k-g"  # a hit
    assert calls == [(3, "k", "g"), (4, "j", "f")]


async def test_a_conflicting_value_that_does_not_decode_is_repaired(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS, mode=CacheMode.EAGER)
    await env.storage(NS).insert(b'"k"', b"{broken")  # arrives after open
    assert await store.insert("k", 5) == Stored()
    assert await env.storage(NS).get(b'"k"') == b"5"


async def test_insert_reports_the_conflicting_value_another_writer_stored(
    env: Environment,
) -> None:
    store: Store[str, int] = await env.store(NS)
    await env.storage(NS).insert(b'"k"', b"1")
    assert await store.insert("k", 2) == Conflict(b"1")
    assert await store.get("k") == 1


async def test_get_or_compute_runs_once_for_concurrent_askers(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS)
    calls = 0
    gate = anyio.Event()
    results: list[int] = []

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 99

    async def ask() -> None:
        results.append(await store.get_or_compute("k", compute))

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(ask)
        await wait_all_tasks_blocked()
        gate.set()
    assert calls == 1
    assert results == [99] * 8
    assert await env.storage(NS).get(b'"k"') == b"99"


async def test_get_or_compute_returns_the_value_another_process_stored_first(
    env: Environment,
) -> None:
    store: Store[str, int] = await env.store(NS, mode=CacheMode.EAGER)
    await env.storage(NS).insert(b'"k"', b"1")  # another process got there first

    async def compute() -> int:
        return 2

    assert await store.get_or_compute("k", compute) == 1
    assert await store.get("k") == 1


async def test_get_or_compute_retries_after_the_computation_fails(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS)

    async def broken() -> int:
        raise RuntimeError("boom")

    async def working() -> int:
        return 3

    with pytest.raises(RuntimeError):
        await store.get_or_compute("k", broken)
    assert await store.get_or_compute("k", working) == 3


async def test_purge_key_and_purge_clear_the_store_and_the_storage(env: Environment) -> None:
    store: Store[str, int] = await env.store(NS)
    await store.insert("a", 1)
    await store.insert("b", 2)
    assert await store.purge_key("a") == Purged(1)
    assert await store.get("a") is None
    assert await store.purge() == Purged(1)
    assert len(store) == 0
    assert (await env.storage(NS).summary()).entries == 0


async def test_bytes_codec_passes_bytes_through(env: Environment) -> None:
    store: Store[bytes, bytes] = await env.store(NS, codec=BytesCodec())
    await store.insert(b"\x00k", b"\xffv")
    assert await env.storage(NS).get(b"\x00k") == b"\xffv"
    with pytest.raises(TypeError, match="bytes"):
        await store.insert("text", b"v")  # type: ignore[arg-type]


async def test_json_codec_refuses_what_json_cannot_hold_canonically() -> None:
    codec: JsonCodec[object, object] = JsonCodec()
    with pytest.raises(TypeError, match=r"^value: nan is not JSON; JSON has no NaN"):
        codec.encode_value(float("nan"))
    with pytest.raises(TypeError, match=r"^key: set is not JSON; use a sorted list"):
        codec.encode_key({1, 2})


async def test_keys_equal_in_python_but_not_in_json_stay_apart(env: Environment) -> None:
    store: Store[object, str] = await env.store(NS)
    await store.insert(1, "int")
    await store.insert("1", "str")
    assert await store.get(1) == "int"
    assert await store.get("1") == "str"


async def test_a_store_works_over_any_storage(storage: Storage) -> None:
    store: Store[str, int] = await Store.open(storage)
    await store.insert("k", 1)
    reopened: Store[str, int] = await Store.open(storage)
    assert await reopened.get("k") == 1


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_a_string_key_finds_only_its_canonical_spelling(
    env: Environment, mode: CacheMode
) -> None:
    # A str key's value is held under the str itself; `"\u0041"` is JSON for
    # "A" too, but it is another key in the storage, so "A" must not find it.
    storage = env.storage(NS)
    await storage.insert(b'"\\u0041"', b"1")
    await storage.insert(b'"B"', b"2")
    store: Store[str, int] = await Store.open(storage, mode=mode)
    assert await store.get("A") is None
    assert await store.get("B") == 2
    await store.insert("A", 3)
    assert await store.get("A") == 3
    assert await storage.get(b'"\\u0041"') == b"1"


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_a_string_key_and_a_non_string_key_with_the_same_text_stay_apart(
    env: Environment, mode: CacheMode
) -> None:
    store: Store[object, str] = await Store.open(env.storage(NS), mode=mode)
    await store.insert("1", "the str")
    await store.insert(1, "the int")
    await store.insert(["1"], "the list")
    reopened: Store[object, str] = await Store.open(env.storage(NS), mode=mode)
    for s in (store, reopened):
        assert await s.get("1") == "the str"
        assert await s.get(1) == "the int"
        assert await s.get(["1"]) == "the list"
        assert s.get_nowait("1") == "the str"
