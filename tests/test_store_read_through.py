"""Both modes read through on a miss: entries that arrive after a store opened are found."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from conftest import KERNELS
from helpers import run_python
from warmenv import BytesCodec, CacheMode, Environment, Namespace, Store, open_environment
from warmenv.bundle import import_bundle
from warmenv.persistence import (
    Failed,
    Insertion,
    InsertSummary,
    NamespaceSummary,
    Origin,
    Purged,
    Storage,
    Stored,
)
from warmenv.persistence.storage import DEFAULT_SCAN_BATCH, BundleRef, EntryInfo, InsertItems

pytestmark = pytest.mark.anyio

NS = Namespace("app", "tuned", version="1")


class GatedStorage(Storage):
    """A real storage that counts its reads and can hold them at a gate.

    The gate lets a test gather every concurrent asker before the first
    read completes, without sleeping.
    """

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.gets = 0
        self.get_manys: list[list[bytes]] = []
        self.gate: anyio.Event | None = None
        self.arrived = anyio.Event()

    @property
    def namespace(self) -> str:
        return self.inner.namespace

    async def get(self, key: bytes) -> bytes | None:
        self.gets += 1
        found = await self.inner.get(key)
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()  # the read is done; its answer is held back
        return found

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        keys = list(keys)
        self.get_manys.append(keys)
        return await self.inner.get_many(keys)

    async def insert(
        self,
        key: bytes,
        value: bytes,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        written_at: float | None = None,
    ) -> Insertion:
        return await self.inner.insert(key, value, origin, cost=cost, written_at=written_at)

    async def insert_many(
        self,
        items: InsertItems,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        bundle: BundleRef | None = None,
    ) -> InsertSummary:
        return await self.inner.insert_many(items, origin, cost=cost, bundle=bundle)

    async def info(self, key: bytes) -> EntryInfo | None:
        return await self.inner.info(key)

    async def dated(self, keys: Iterable[bytes]) -> dict[bytes, tuple[bytes, float | None]]:
        return await self.inner.dated(keys)

    async def touch(self, keys: Iterable[bytes]) -> int:
        return await self.inner.touch(keys)

    async def replace(
        self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL, *, cost: float | None = None
    ) -> Stored | Failed:
        return await self.inner.replace(key, value, origin, cost=cost)

    def scan(self, batch_size: int = DEFAULT_SCAN_BATCH) -> AsyncIterator[tuple[bytes, bytes]]:
        return self.inner.scan(batch_size)

    def scan_with_info(
        self, batch_size: int = DEFAULT_SCAN_BATCH
    ) -> AsyncIterator[tuple[bytes, bytes, EntryInfo]]:
        return self.inner.scan_with_info(batch_size)

    async def purge(self) -> Purged | Failed:
        return await self.inner.purge()

    async def purge_key(self, key: bytes) -> Purged | Failed:
        return await self.inner.purge_key(key)

    async def summary(self) -> NamespaceSummary:
        return await self.inner.summary()

    def describe(self) -> str:
        return self.inner.describe()


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_a_store_finds_an_entry_written_after_it_opened(
    env: Environment, mode: CacheMode
) -> None:
    store: Store[str, dict[str, int]] = await env.store(NS, mode=mode)
    assert await store.get("k") is None
    await env.storage(NS).insert(b'"k"', b'{"block":64}')
    assert await store.get("k") == {"block": 64}


async def test_an_eager_store_finds_an_entry_another_process_wrote_after_it_opened(
    root: Path,
) -> None:
    async with open_environment("shared", root=root) as env:
        store: Store[str, int] = await env.store(NS, mode=CacheMode.EAGER)
        assert await store.get("from-elsewhere") is None
        child = run_python(
            "import sys, anyio\n"
            "from warmenv import Namespace, open_environment\n"
            "async def main():\n"
            "    async with open_environment('shared', root=sys.argv[1]) as env:\n"
            "        ns = Namespace('app', 'tuned', version='1')\n"
            "        store = await env.store(ns)\n"
            "        print(await store.insert('from-elsewhere', 42))\n"
            "anyio.run(main)\n",
            str(root),
        )
        assert child.returncode == 0, child.stderr
        assert await store.get("from-elsewhere") == 42


async def test_an_eager_store_finds_a_bundle_imported_while_it_serves(
    bundle_path: Path, cold_env: Environment
) -> None:
    store: Store[bytes, bytes] = await cold_env.store(KERNELS, codec=BytesCodec())
    assert len(store) == 0
    assert await store.get(b"k007") is None
    await import_bundle(bundle_path, cold_env)
    assert await store.get(b"k007") == b"kernel-7"

    computed: list[bytes] = []

    async def compute(key: bytes) -> bytes:
        computed.append(key)
        return b"recomputed"

    assert await store.get_or_compute(b"k008", compute, b"k008") == b"kernel-8"
    assert computed == []


async def test_concurrent_reads_of_one_key_share_one_storage_read(env: Environment) -> None:
    gated = GatedStorage(env.storage(NS))
    await gated.insert(b'"k"', b"5")
    store: Store[str, int] = await Store.open(gated, mode=CacheMode.LAZY)
    gated.gate = anyio.Event()
    results: list[int | None] = []

    async def ask() -> None:
        results.append(await store.get("k"))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(ask)
        await wait_all_tasks_blocked()
        gated.gate.set()
    assert gated.gets == 1
    assert results == [5] * 10


async def test_concurrent_gets_of_a_missing_key_share_one_read_and_all_miss(
    env: Environment,
) -> None:
    gated = GatedStorage(env.storage(NS))
    store: Store[str, int] = await Store.open(gated, mode=CacheMode.EAGER)
    gated.gate = anyio.Event()
    results: list[int | None] = []

    async def ask() -> None:
        results.append(await store.get("nowhere"))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(ask)
        await wait_all_tasks_blocked()
        gated.gate.set()
    assert gated.gets == 1
    assert results == [None] * 10


async def test_a_hit_does_not_read_the_storage(env: Environment) -> None:
    gated = GatedStorage(env.storage(NS))
    await gated.insert(b'"k"', b"5")
    store: Store[str, int] = await Store.open(gated, mode=CacheMode.EAGER)
    for _ in range(3):
        assert await store.get("k") == 5
        assert await store.get_or_compute("k", _never) == 5
    assert gated.gets == 0


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_get_many_reads_every_key_not_in_memory_in_one_storage_call(
    env: Environment, mode: CacheMode
) -> None:
    gated = GatedStorage(env.storage(NS))
    await gated.insert(b'"held"', b"1")
    store: Store[str, int] = await Store.open(gated, mode=mode)
    assert await store.get("held") == 1  # held in memory from here on
    for key, value in (("a", 2), ("b", 3)):  # written after the store opened
        await env.storage(NS).insert(f'"{key}"'.encode(), str(value).encode())
    gated.get_manys.clear()
    gated.gets = 0

    asked = ["b", "absent", "held", "a", "b"]
    assert list((await store.get_many(asked)).items()) == [("b", 3), ("held", 1), ("a", 2)]
    assert sorted(map(sorted, gated.get_manys)) == [[b'"a"', b'"absent"', b'"b"']]
    assert gated.gets == 0
    # What it read is held now: asking again needs only the one still missing.
    assert await store.get_many(["a", "b", "absent"]) == {"a": 2, "b": 3}
    assert gated.get_manys[1:] == [[b'"absent"']]
    assert await store.get_many(["a", "held"]) == {"a": 2, "held": 1}
    assert len(gated.get_manys) == 2 and gated.gets == 0


async def test_get_many_refuses_an_unhashable_key_before_reading_anything(
    env: Environment,
) -> None:
    gated = GatedStorage(env.storage(NS))
    await gated.insert(b"[1,2]", b"5")
    store: Store[object, int] = await Store.open(gated, mode=CacheMode.LAZY)
    with pytest.raises(TypeError, match="unhashable"):
        await store.get_many(["x", [1, 2]])
    assert gated.get_manys == [] and gated.gets == 0
    assert await store.get_many([(1, 2)]) == {(1, 2): 5}  # a tuple is the JSON list key


async def test_a_purge_during_a_read_is_not_undone_by_the_read(env: Environment) -> None:
    gated = GatedStorage(env.storage(NS))
    await gated.insert(b'"k"', b"5")
    store: Store[str, int] = await Store.open(gated, mode=CacheMode.LAZY)
    gated.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.get, "k")
        await gated.arrived.wait()  # the read has read 5 and waits at the gate
        assert await store.purge_key("k") == Purged(1)
        gated.gate.set()
    gated.gate = None
    assert len(store) == 0
    assert await store.get("k") is None


async def _never() -> int:
    raise AssertionError("a hit must not compute")
