"""What a store holds in memory: one compact copy per value, at most `max_entries`."""

from __future__ import annotations

import gc
import tracemalloc

import anyio
import pytest

from warmenv import CacheMode, Environment, Namespace, Store
from warmenv.persistence import Stored

pytestmark = pytest.mark.anyio

NS = Namespace("app", "tuned", version="1")


async def _fill(env: Environment, n: int) -> None:
    summary = await env.storage(NS).insert_many((b'"k%04d"' % i, b"%d" % i) for i in range(n))
    assert summary.stored == n


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_max_entries_bounds_what_is_held_and_the_rest_is_read_through(
    env: Environment, mode: CacheMode
) -> None:
    await _fill(env, 100)
    store: Store[str, int] = await Store.open(env.storage(NS), mode=mode, max_entries=10)
    assert len(store) <= 10
    for i in range(100):
        assert await store.get(f"k{i:04d}") == i
        assert len(store) <= 10
    assert store.max_entries == 10


async def test_the_least_recently_used_value_is_dropped_first(env: Environment) -> None:
    store: Store[str, int] = await Store.open(env.storage(NS), mode=CacheMode.LAZY, max_entries=2)
    await store.insert("a", 1)
    await store.insert("b", 2)
    assert await store.get("a") == 1  # "b" is now the least recently used
    await store.insert("c", 3)
    assert store.get_nowait("a") == 1
    assert store.get_nowait("c") == 3
    with pytest.raises(anyio.WouldBlock):
        store.get_nowait("b")
    assert await store.get("b") == 2  # still in the storage


async def test_an_eager_store_with_a_bound_loads_only_that_many(env: Environment) -> None:
    await _fill(env, 50)
    store: Store[str, int] = await Store.open(env.storage(NS), max_entries=20)
    assert len(store) == 20
    assert await store.get("k0049") == 49


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10"])
async def test_max_entries_must_be_a_positive_int(env: Environment, bad: object) -> None:
    with pytest.raises(ValueError, match="max_entries must be a positive int"):
        await Store.open(env.storage(NS), max_entries=bad)  # type: ignore[call-overload]


async def test_a_loaded_value_is_held_once_not_encoded_and_decoded(env: Environment) -> None:
    value = b'{"choice":"blocked","note":"' + b"x" * 200 + b'","tiles":[16,32,64]}'
    items = [(b'"key-%06d"' % i, value) for i in range(2000)]
    assert (await env.storage(NS).insert_many(items)).stored == 2000
    raw = sum(len(k) + len(v) for k, v in items)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store: Store[str, dict[str, object]] = await env.store(NS, mode=CacheMode.EAGER)
        await env.storage(NS).get(b"-")  # the worker thread lets go of the last page it read
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(store) == 2000
    # Held encoded and decoded, this measured 4.4x the raw size; one compact copy 1.4x.
    assert held < 1.6 * raw, f"{held / raw:.2f}x the raw size"


async def test_inserting_under_a_bound_keeps_the_storage_complete(env: Environment) -> None:
    store: Store[str, int] = await Store.open(env.storage(NS), max_entries=3)
    for i in range(10):
        assert await store.insert(f"k{i}", i) == Stored()
    assert len(store) == 3
    assert (await env.storage(NS).summary()).entries == 10


async def test_an_environments_store_takes_max_entries(env: Environment) -> None:
    await _fill(env, 50)
    store: Store[str, int] = await env.store(NS, max_entries=20)
    assert store.max_entries == 20
    assert len(store) == 20
    for i in range(50):
        assert await store.get(f"k{i:04d}") == i
        assert len(store) <= 20


async def test_an_environments_store_takes_hot_bytes(env: Environment) -> None:
    store: Store[str, dict[str, int]] = await env.store(NS, hot_bytes=0)
    assert store.hot_bytes == 0
    await store.insert("k", {"a": 1})
    for _ in range(256):  # enough for a hot set to take it in
        assert await store.get("k") == {"a": 1}
    assert not set(store.held.hot)  # internal: nothing held decoded


async def test_an_environments_store_refuses_a_bad_bound(env: Environment) -> None:
    with pytest.raises(ValueError, match="max_entries must be a positive int"):
        await env.store(NS, max_entries=0)
    with pytest.raises(ValueError, match="hot_bytes must be an int >= 0"):
        await env.store(NS, hot_bytes=-1)
