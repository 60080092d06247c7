"""What a store hands back: the value put in, its own copy, and `None` as a value."""

from __future__ import annotations

import datetime
import enum
import re
from typing import Any

import anyio
import anyio.to_thread
import pytest
from anyio import wait_all_tasks_blocked

from warmenv import CacheMode, Environment, JsonCodec, Namespace, Store
from warmenv.persistence import MISSING, BytesCodec, Stored

pytestmark = pytest.mark.anyio

NS = Namespace("app", "tuned", version="1")


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


NOT_JSON: list[Any] = [
    pytest.param((1, 2), "value: tuple is not JSON; use a list", id="tuple"),
    pytest.param([1, {"a": (2, 3)}], "value[1]['a']: tuple is not JSON; use a list", id="nested"),
    pytest.param({1: "x"}, "value: dict key 1 is int, not str", id="int-dict-key"),
    pytest.param({"s": {1, 2}}, "value['s']: set is not JSON; use a sorted list", id="set"),
    pytest.param([float("nan")], "value[0]: nan is not JSON; JSON has no NaN", id="nan"),
    pytest.param({"x": float("inf")}, "value['x']: inf is not JSON", id="inf"),
    pytest.param(b"raw", "value: bytes is not JSON; decode it to str", id="bytes"),
    pytest.param([Colour.RED], "value[0]: Colour is a subclass of int", id="enum"),
    pytest.param({"n": Name("x")}, "value['n']: Name is a subclass of str", id="str-subclass"),
    pytest.param(object(), "value: object is not JSON", id="object"),
    pytest.param(["\ud800"], "value[0]: str with a lone surrogate is not UTF-8", id="surrogate"),
]


@pytest.mark.parametrize(("value", "message"), NOT_JSON)
async def test_insert_refuses_a_value_that_would_not_come_back_the_same(
    env: Environment, value: Any, message: str
) -> None:
    store: Store[str, Any] = await env.store(NS)
    with pytest.raises(TypeError, match="^" + re.escape(message)):
        await store.insert("k", value)
    assert await env.storage(NS).get(b'"k"') is None


@pytest.mark.parametrize(("value", "message"), NOT_JSON)
async def test_get_or_compute_refuses_a_value_that_would_not_come_back_the_same(
    env: Environment, value: Any, message: str
) -> None:
    store: Store[str, Any] = await env.store(NS)

    async def compute() -> Any:
        return value

    with pytest.raises(TypeError, match="^" + re.escape(message)):
        await store.get_or_compute("k", compute)
    assert await store.get("k") is None
    assert await env.storage(NS).get(b'"k"') is None


@pytest.mark.parametrize("value", [datetime.date(2026, 12, 7), Colour.RED, object()])
async def test_a_value_json_cannot_hold_names_its_type_and_the_codec_that_can(
    env: Environment, value: object
) -> None:
    store: Store[str, object] = await env.store(NS)
    with pytest.raises(TypeError) as raised:
        await store.insert("k", value)
    said = str(raised.value)
    assert f"value: {type(value).__qualname__} " in said, said
    assert "Codec of your own" in said and "env.store(namespace, codec=...)" in said, said
    assert "\n" not in said


async def test_the_codec_the_message_names_stores_that_type(env: Environment) -> None:
    class DateCodec:  # what the message says to write
        def encode_key(self, key: str) -> bytes:
            return JsonCodec[str, object]().encode_key(key)

        def encode_value(self, value: datetime.date) -> bytes:
            return value.isoformat().encode()

        def decode_value(self, data: bytes) -> datetime.date:
            return datetime.date.fromisoformat(data.decode())

    store: Store[str, datetime.date] = await env.store(NS, codec=DateCodec())
    assert isinstance(await store.insert("k", datetime.date(2026, 12, 7)), Stored)
    assert await store.get("k") == datetime.date(2026, 12, 7)


async def test_keys_accept_tuples_as_lists_and_refuse_what_would_collide(
    env: Environment,
) -> None:
    store: Store[Any, int] = await env.store(NS)
    await store.insert(("matmul", 1024), 1)
    assert await store.get(["matmul", 1024]) == 1
    with pytest.raises(TypeError, match=r"^key\[1\]: dict key 1 is int, not str"):
        await store.get(["x", {1: 2}])


def _shape(value: object) -> object:
    """The value with every type spelled out, so == also compares types."""
    if isinstance(value, dict):
        return ("dict", {k: _shape(v) for k, v in value.items()})
    if isinstance(value, list):
        return ("list", [_shape(v) for v in value])
    return (type(value).__name__, value)


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_cold_and_warm_runs_return_equal_values_of_the_same_types(
    env: Environment, mode: CacheMode
) -> None:
    computed: dict[str, Any] = {
        "block": [128, 64],
        "ms": 1.0,
        "neg_zero": -0.0,
        "ok": True,
        "none": None,
        "nested": {"a": [{"b": "ü"}]},
    }

    async def tune() -> dict[str, Any]:
        return {
            "block": [128, 64],
            "ms": 1.0,
            "neg_zero": -0.0,
            "ok": True,
            "none": None,
            "nested": {"a": [{"b": "ü"}]},
        }

    cold_store: Store[str, dict[str, Any]] = await env.store(NS, mode=mode)
    cold = await cold_store.get_or_compute("k", tune)
    warm_store: Store[str, dict[str, Any]] = await env.store(NS, mode=mode)
    warm = await warm_store.get_or_compute("k", tune)
    assert _shape(cold) == _shape(warm) == _shape(computed)


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_mutating_a_value_from_get_does_not_change_what_later_callers_get(
    env: Environment, mode: CacheMode
) -> None:
    await env.storage(NS).insert(b'"k"', b'{"tiles":[16,32]}')
    store: Store[str, dict[str, list[int]]] = await env.store(NS, mode=mode)
    first = await store.get("k")
    assert first is not None
    first["tiles"].append(64)
    first["extra"] = []
    assert await store.get("k") == {"tiles": [16, 32]}
    assert await store.get_or_compute("k", _never) == {"tiles": [16, 32]}


async def test_mutating_a_computed_value_does_not_change_what_later_callers_get(
    env: Environment,
) -> None:
    store: Store[str, list[int]] = await env.store(NS)

    async def tune() -> list[int]:
        return [1, 2]

    cold = await store.get_or_compute("k", tune)
    cold.append(3)
    hit = await store.get_or_compute("k", tune)
    hit.append(4)
    assert await store.get("k") == [1, 2]


async def test_mutating_an_inserted_value_afterwards_does_not_change_the_store(
    env: Environment,
) -> None:
    store: Store[str, dict[str, int]] = await env.store(NS)
    value = {"block": 64}
    assert await store.insert("k", value) == Stored()
    value["block"] = 128
    assert await store.get("k") == {"block": 64}
    assert store.get_nowait("k") == {"block": 64}


async def test_get_nowait_answers_from_memory_or_says_it_would_block(
    env: Environment,
) -> None:
    await env.storage(NS).insert(b'"loaded"', b"[1]")
    store: Store[str, list[int]] = await env.store(NS, mode=CacheMode.EAGER)
    first = store.get_nowait("loaded")
    first.append(2)
    assert store.get_nowait("loaded") == [1]
    await env.storage(NS).insert(b'"late"', b"[3]")
    with pytest.raises(anyio.WouldBlock):
        store.get_nowait("late")
    assert await store.get("late") == [3]
    assert store.get_nowait("late") == [3]


async def test_get_nowait_answers_on_another_thread(env: Environment) -> None:
    store: Store[str, dict[str, int]] = await Store.open(env.storage(NS), max_entries=2)
    await store.insert("k", {"block": 64})
    found = await anyio.to_thread.run_sync(store.get_nowait, "k")
    assert found == {"block": 64}


async def test_waiters_of_one_run_each_get_their_own_copy(env: Environment) -> None:
    store: Store[str, list[int]] = await env.store(NS)
    gate = anyio.Event()
    results: list[list[int]] = []

    async def tune() -> list[int]:
        await gate.wait()
        return [1]

    async def ask() -> None:
        results.append(await store.get_or_compute("k", tune))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(ask)
        await wait_all_tasks_blocked()
        gate.set()
    results[0].append(2)
    assert results[1:] == [[1], [1]]


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_a_stored_none_is_returned_not_recomputed(env: Environment, mode: CacheMode) -> None:
    store: Store[str, int | None] = await env.store(NS, mode=mode)
    runs = 0

    async def probe() -> int | None:
        nonlocal runs
        runs += 1
        return None

    assert await store.get_or_compute("k", probe) is None
    assert await store.get_or_compute("k", probe) is None
    reopened: Store[str, int | None] = await env.store(NS, mode=mode)
    assert await reopened.get_or_compute("k", probe) is None
    assert runs == 1
    assert await env.storage(NS).get(b'"k"') == b"null"


async def test_get_tells_a_stored_none_from_a_miss(env: Environment) -> None:
    store: Store[str, int | None] = await env.store(NS)
    await store.insert("null", None)
    assert await store.get("null", MISSING) is None
    assert await store.get("absent", MISSING) is MISSING
    assert await store.get("absent", -1) == -1
    assert await store.get("absent") is None


async def test_a_non_canonical_nan_from_elsewhere_is_a_miss_and_repaired(
    env: Environment,
) -> None:
    await env.storage(NS).insert(b'"k"', b"NaN")  # a bundle written by another tool
    store: Store[str, float] = await env.store(NS)
    assert await store.get("k") is None
    assert await store.insert("k", 1.5) == Stored()
    assert await env.storage(NS).get(b'"k"') == b"1.5"


async def test_bytes_values_are_handed_out_as_they_are(env: Environment) -> None:
    store: Store[bytes, bytes] = await env.store(NS, codec=BytesCodec())
    await store.insert(b"k", b"\x00v")
    assert await store.get(b"k") == b"\x00v"


async def test_json_codec_decodes_what_it_encodes() -> None:
    codec: JsonCodec[str, dict[str, list[int]]] = JsonCodec()
    value = {"b": [1], "a": []}
    assert codec.encode_value(value) == b'{"a":[],"b":[1]}'
    assert codec.decode_value(codec.encode_value(value)) == value
    with pytest.raises(ValueError, match="not canonical JSON"):
        codec.decode_value(b"[" * 100_000)


async def _never() -> dict[str, list[int]]:
    raise AssertionError("a hit must not compute")
