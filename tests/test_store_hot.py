"""The hot set: decoded copies of a JSON store's most used containers, bounded in bytes.

The hot set is internal (a hit is answered the same with or without it), so
these tests look at `store.held.hot` to know that the hot path is the one they
exercise.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import pytest

from warmenv import CacheMode, Environment, Namespace, Store
from warmenv.persistence import Origin, Purged, Stored
from warmenv.persistence.store import DEFAULT_HOT_BYTES

pytestmark = pytest.mark.anyio

NS = Namespace("app", "hot", version="1")
VALUE: dict[str, Any] = {
    "tiles": [16, 32],
    "nested": {"deep": [{"x": 1}, [2, [3]]], "leaf": "s"},
    "ms": 1.5,
    "none": None,
}


def hot(store: Store[Any, Any]) -> set[object]:
    """The keys whose values `store` holds decoded (internal)."""
    return set(store.held.hot)


async def heat(store: Store[str, Any], key: str, times: int = 64) -> None:
    for _ in range(times):
        await store.get(key)


async def _never() -> Any:
    raise AssertionError("a hit must not compute")


def mutate_everything(value: Any) -> None:
    """Change every container in `value`, at every depth."""
    if type(value) is dict:
        for item in list(value.values()):
            mutate_everything(item)
        value["added"] = "by a caller"
    elif type(value) is list:
        for item in list(value):
            mutate_everything(item)
        value.append("by a caller")


async def test_a_value_asked_for_often_is_held_decoded(env: Environment) -> None:
    store: Store[str, Any] = await env.store(NS)
    await store.insert("k", VALUE)
    await store.insert("other", {"a": [1]})
    await heat(store, "k")
    assert hot(store) == {"k"}
    assert await store.get("k") == VALUE


GETTERS: dict[str, Callable[[Store[str, Any], str], Awaitable[Any]]] = {
    "get": lambda store, key: store.get(key),
    "get_or_compute": lambda store, key: store.get_or_compute(key, _never),
    "get_nowait": lambda store, key: anyio.to_thread.run_sync(store.get_nowait, key),
}


@pytest.mark.parametrize("getter", list(GETTERS))
@pytest.mark.parametrize("value", [VALUE, [{"a": [1]}, [2, [3, {"b": 4}]], "leaf"]])
async def test_mutating_a_hot_value_does_not_change_what_later_callers_get(
    env: Environment, getter: str, value: Any
) -> None:
    store: Store[str, Any] = await env.store(NS)
    await store.insert("k", value)
    await heat(store, "k")
    assert hot(store) == {"k"}
    ask = GETTERS[getter]
    for _ in range(3):
        got = await ask(store, "k")
        assert got == value
        mutate_everything(got)
    assert await store.get("k") == value
    assert hot(store) == {"k"}


async def test_a_memoized_call_on_a_hot_value_gets_its_own_copy(env: Environment) -> None:
    store: Store[Any, Any] = await env.store(NS)

    @store.memoize
    async def tiles(size: int) -> dict[str, list[int]]:
        return {"tiles": [size, [size]]}  # type: ignore[list-item]

    first = await tiles(16)
    for _ in range(64):
        await tiles(16)
    assert hot(store) == {b"[16]"}
    got = await tiles(16)
    mutate_everything(got)
    assert await tiles(16) == first == {"tiles": [16, [16]]}


async def test_a_hot_value_replaced_by_a_local_one_is_not_served_again(
    env: Environment,
) -> None:
    await env.storage(NS).insert(b'"k"', b'{"from":["bundle"]}', Origin.IMPORTED)
    store: Store[str, Any] = await env.store(NS)
    await heat(store, "k")
    assert hot(store) == {"k"}
    assert await store.insert("k", {"from": ["here"]}) == Stored()
    assert hot(store) == set()
    assert await store.get("k") == {"from": ["here"]}


async def test_a_purged_hot_value_is_gone(env: Environment) -> None:
    store: Store[str, Any] = await env.store(NS)
    await store.insert("a", {"x": [1]})
    await store.insert("b", {"y": [2]})
    await heat(store, "a")
    assert await store.purge_key("a") == Purged(1)
    assert hot(store) == set()
    assert await store.get("a") is None
    await heat(store, "b")
    assert hot(store) == {"b"}
    assert await store.purge() == Purged(1)
    assert hot(store) == set()
    assert await store.get("b") is None


async def test_a_hot_value_dropped_by_max_entries_leaves_the_hot_set(env: Environment) -> None:
    store: Store[str, Any] = await Store.open(env.storage(NS), mode=CacheMode.LAZY, max_entries=2)
    await store.insert("a", {"x": [1]})
    await heat(store, "a")
    assert hot(store) == {"a"}
    await store.insert("b", {"y": [2]})
    await store.insert("c", {"z": [3]})  # "a" is the least recently used: dropped
    assert hot(store) == set()
    assert await store.get("a") == {"x": [1]}  # read back from the storage


async def test_values_asked_for_once_each_seldom_turn_hot(env: Environment) -> None:
    store: Store[str, Any] = await env.store(NS)
    for i in range(3000):
        await store.insert(f"k{i}", {"i": [i]})
    for i in range(3000):
        assert await store.get(f"k{i}") == {"i": [i]}
    # Only keys whose samples share a mark (a hash collision) turn hot: a few.
    assert len(hot(store)) < 30


async def test_the_hot_set_holds_at_most_hot_bytes(env: Environment) -> None:
    limit = 64 * 1024
    items = [
        (b'"k%04d"' % i, b'{"note":"%s","tiles":[%d,2,3]}' % (b"x" * 200, i)) for i in range(2000)
    ]
    assert (await env.storage(NS).insert_many(items)).stored == 2000
    store: Store[str, Any] = await Store.open(env.storage(NS), hot_bytes=limit)
    assert store.hot_bytes == limit
    keys = [f"k{i:04d}" for i in range(2000)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(16):  # every key often: all would be hot without the bound
            for key in keys:
                await store.get(key)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(hot(store)) < 2000
    assert limit // 2 < store.held.hot.size <= limit  # filled up to the bound, not past it
    # The hot set itself, and the 64 KiB of marks that decide what enters it.
    assert grown < limit + 64 * 1024 + 16 * 1024, f"{grown} bytes held after the hits"


async def test_hot_bytes_zero_holds_nothing_decoded(env: Environment) -> None:
    store: Store[str, Any] = await Store.open(env.storage(NS), hot_bytes=0)
    await store.insert("k", VALUE)
    await heat(store, "k")
    assert hot(store) == set()
    assert await store.get("k") == VALUE


@pytest.mark.parametrize("bad", [-1, 1.5, "4MiB", None])
async def test_hot_bytes_must_be_an_int_of_zero_or_more(env: Environment, bad: object) -> None:
    with pytest.raises(ValueError, match="hot_bytes must be an int >= 0"):
        await Store.open(env.storage(NS), hot_bytes=bad)  # type: ignore[call-overload]


async def test_only_a_json_store_has_a_hot_set(env: Environment) -> None:
    assert (await Store.open(env.storage(NS))).hot_bytes == DEFAULT_HOT_BYTES
    store: Store[str, Any] = await Store.open(env.storage(NS), codec=_ListCodec())
    assert store.hot_bytes == 0
    await store.insert("k", ["v"])
    await heat(store, "k")
    assert hot(store) == set()


class _ListCodec:
    """Values are lists of one str: containers, but not known to be JSON."""

    def encode_key(self, key: str) -> bytes:
        return key.encode()

    def encode_value(self, value: list[str]) -> bytes:
        return value[0].encode()

    def decode_value(self, data: bytes) -> list[str]:
        return [data.decode()]


async def test_a_value_nested_deeper_than_a_plan_follows_stays_encoded(
    env: Environment,
) -> None:
    deep: Any = ["leaf"]
    for _ in range(40):
        deep = [deep]
    store: Store[str, Any] = await env.store(NS)
    await store.insert("deep", deep)
    await store.insert("shallow", {"a": [[1]]})
    await heat(store, "deep")
    await heat(store, "shallow")
    assert hot(store) == {"shallow"}
    got = await store.get("deep")
    assert got == deep
    mutate_everything(got)
    assert await store.get("deep") == deep
