"""What `mypy --strict` says about code opening stores, with and without annotations.

Documentation examples are copied by users: `store = await env.store(ns)`
must type-check as it stands (it used to infer `Store[Never, Never]` and
fail with "Need type annotation for store"), and a codec must still give
its types (`BytesCodec()` makes a `Store[bytes, bytes]`).
"""

from __future__ import annotations

import pytest

from helpers import mypy_strict

_UNANNOTATED = """\
from typing import reveal_type

from warmenv import (
    BytesCodec,
    JsonCodec,
    MemoryStorage,
    Namespace,
    Store,
    blocking,
    open_environment,
)

NS = Namespace("app", "tuned", "1")


async def main() -> None:
    async with open_environment() as env:
        store = await env.store(NS)
        await store.insert("matmul", {"block": 128})
        reveal_type(store)
        raw = await env.store(NS, BytesCodec())
        reveal_type(raw)
        reveal_type(await raw.get(b"k"))
        reveal_type(await env.store(NS, JsonCodec()))
        reveal_type(await Store.open(MemoryStorage(NS)))
        reveal_type(await Store.open(MemoryStorage(NS), BytesCodec()))
        typed: Store[str, int] = await env.store(NS)
        reveal_type(await typed.get("k"))
        bare: Store = store
        reveal_type(bare)


def sync() -> None:
    with blocking.open_environment() as env:
        store = env.store(NS)
        store.insert("matmul", {"block": 128})
        reveal_type(store)
        reveal_type(env.store(NS, BytesCodec()))
"""

_REJECTED = """\
from warmenv import BytesCodec, Namespace, blocking, open_environment

NS = Namespace("app", "tuned", "1")


async def main() -> None:
    async with open_environment() as env:
        raw = await env.store(NS, BytesCodec())
        await raw.insert(b"k", "not bytes")


def sync() -> None:
    with blocking.open_environment() as env:
        env.store(NS, BytesCodec()).insert("not bytes", b"v")
"""


_CALLS = """\
from warmenv import Namespace, Store, blocking

NS = Namespace("app", "tuned", "1")


async def tune(size: int, *, key: str) -> int:
    return size


def tune_here(size: int, *, key: str) -> int:
    return size


async def calls(store: Store[str, int], here: blocking.BlockingStore[str, int]) -> None:
    await store.get_or_compute("a", tune, 1, key="k")
    here.get_or_compute("a", tune_here, 1, key="k")
    await store.get_or_compute("a", tune, "1", key="k")
    here.get_or_compute("a", tune_here, 1, key=2)
    await store.get_or_compute("a", tune, 1, other="k")
"""


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """One `mypy --strict` run over the snippets above: its output lines, per file."""
    return mypy_strict(
        {"unannotated": _UNANNOTATED, "rejected": _REJECTED, "calls": _CALLS},
        tmp_path_factory.mktemp("mypy"),
    )


def _revealed(lines: list[str]) -> list[str]:
    return [
        line.partition("Revealed type is ")[2]
        .replace("builtins.", "")  # mypy < 2 spells them out
        .replace("warmenv.persistence.store.", "")
        .replace("warmenv.blocking._store.", "")
        for line in lines
        if "Revealed" in line
    ]


def test_a_store_opened_without_a_codec_type_checks_without_an_annotation(
    mypy_report: dict[str, list[str]],
) -> None:
    lines = mypy_report["unannotated"]
    assert not [line for line in lines if ": error: " in line], lines
    assert _revealed(lines) == [
        '"Store[Any, Any]"',
        '"Store[bytes, bytes]"',
        '"bytes | None"',
        '"Store[Any, Any]"',
        '"Store[Any, Any]"',
        '"Store[bytes, bytes]"',
        '"int | None"',
        '"Store[Any, Any]"',
        '"BlockingStore[Any, Any]"',
        '"BlockingStore[bytes, bytes]"',
    ]


def test_a_bytes_codec_store_rejects_other_types(mypy_report: dict[str, list[str]]) -> None:
    errors = [line for line in mypy_report["rejected"] if ": error: " in line]
    assert [line.split(":")[1] for line in errors] == ["9", "14"], errors
    assert all('incompatible type "str"; expected "bytes"' in line for line in errors), errors


def test_get_or_compute_checks_fn_s_arguments(mypy_report: dict[str, list[str]]) -> None:
    errors = [line for line in mypy_report["calls"] if ": error: " in line]
    # Lines 15-16 pass what `fn` takes; 17-19 a wrong type, a wrong type, an unknown name.
    assert sorted({int(line.split(":")[1]) for line in errors}) == [17, 18, 19], errors
