"""The storage contract, run over every backend (SQLite and memory)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio.to_thread
import pytest

from warmenv.persistence import (
    Conflict,
    Failed,
    InsertSummary,
    Namespace,
    NamespaceSummary,
    Origin,
    Purged,
    Storage,
    Stored,
)
from warmenv.persistence.sqlite.storage import SqliteStorage

pytestmark = pytest.mark.anyio

IMPORTED = Origin.IMPORTED
LOCAL = Origin.LOCAL


async def test_a_missing_key_is_a_miss(storage: Storage) -> None:
    assert await storage.get(b"nope") is None


async def test_get_blocking_reads_on_a_thread_or_says_it_cannot(storage: Storage) -> None:
    assert await storage.insert(b"k", b"v") == Stored()
    found = await anyio.to_thread.run_sync(storage.get_blocking, b"k")
    assert await anyio.to_thread.run_sync(storage.get_blocking, b"nope") is None
    # SQLite reads the file with a connection of the thread's own; memory cannot (None:
    # ask `get` on the event loop).
    assert found == (b"v" if isinstance(storage, SqliteStorage) else None)


async def test_an_inserted_value_is_read_back(storage: Storage) -> None:
    assert await storage.insert(b"k", b"v") == Stored()
    assert await storage.get(b"k") == b"v"


async def test_a_value_never_overwrites_one_of_the_same_origin(storage: Storage) -> None:
    for origin in (LOCAL, IMPORTED):
        key = b"key-%d" % origin
        await storage.insert(key, b"first", origin)
        assert await storage.insert(key, b"second", origin) == Conflict(b"first")
        assert await storage.get(key) == b"first"


async def test_a_local_value_replaces_a_stale_imported_one(storage: Storage) -> None:
    await storage.insert(b"k", b"stale", IMPORTED)
    assert await storage.insert(b"k", b"fresh", LOCAL) == Stored()
    assert await storage.get(b"k") == b"fresh"
    assert await storage.insert(b"k", b"again", IMPORTED) == Conflict(b"fresh")


async def test_an_imported_value_replaces_nothing(storage: Storage) -> None:
    await storage.insert(b"k", b"local", LOCAL)
    assert await storage.insert(b"k", b"imported", IMPORTED) == Conflict(b"local")
    assert await storage.get(b"k") == b"local"


async def test_replace_ignores_the_rules(storage: Storage) -> None:
    await storage.insert(b"k", b"old", LOCAL)
    assert await storage.replace(b"k", b"new", IMPORTED) == Stored()
    assert await storage.get(b"k") == b"new"


async def test_get_many_returns_only_the_keys_present(storage: Storage) -> None:
    await storage.insert_many([(b"a", b"1"), (b"b", b"2")])
    assert await storage.get_many([b"a", b"b", b"c"]) == {b"a": b"1", b"b": b"2"}
    assert await storage.get_many([]) == {}


async def test_get_many_handles_more_keys_than_one_query_takes(storage: Storage) -> None:
    items = [(b"%05d" % i, b"v%d" % i) for i in range(1500)]
    await storage.insert_many(items)
    assert await storage.get_many([k for k, _ in items]) == dict(items)


async def test_insert_many_counts_stored_and_conflicting(storage: Storage) -> None:
    await storage.insert(b"taken", b"x")
    summary = await storage.insert_many([(b"a", b"1"), (b"taken", b"y"), (b"a", b"2")])
    assert summary == InsertSummary(stored=1, conflict=2, failed=0)
    assert await storage.get(b"a") == b"1"


async def test_insert_many_accepts_an_async_iterable(storage: Storage) -> None:
    async def items() -> AsyncIterator[tuple[bytes, bytes]]:
        for i in range(5):
            yield b"k%d" % i, b"v"

    assert (await storage.insert_many(items())).stored == 5


async def test_insert_many_local_replaces_imported(storage: Storage) -> None:
    await storage.insert_many([(b"a", b"old"), (b"b", b"old")], IMPORTED)
    summary = await storage.insert_many([(b"a", b"new"), (b"c", b"new")], LOCAL)
    assert summary == InsertSummary(stored=2, conflict=0, failed=0)
    assert await storage.get(b"a") == b"new"
    assert await storage.get(b"b") == b"old"


async def test_insert_many_with_a_bad_item_raises_and_stores_nothing(storage: Storage) -> None:
    with pytest.raises(TypeError, match="bytes"):
        await storage.insert_many([(b"a", b"1"), ("b", b"2")])  # type: ignore[list-item]
    assert await storage.get(b"a") is None


async def test_a_key_that_is_not_bytes_raises(storage: Storage) -> None:
    with pytest.raises(TypeError, match="keys are bytes"):
        await storage.get("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="values are bytes"):
        await storage.insert(b"k", "text")  # type: ignore[arg-type]


async def test_scan_yields_every_entry_in_key_order(storage: Storage) -> None:
    items = [(b"%04d" % i, b"v%d" % i) for i in reversed(range(25))]
    await storage.insert_many(items)
    scanned = [item async for item in storage.scan(batch_size=4)]
    assert scanned == sorted(items)


async def test_scan_with_info_yields_each_entry_with_the_provenance_info_gives(
    storage: Storage,
) -> None:
    await storage.insert_many([(b"%04d" % i, b"v%d" % i) for i in range(0, 10, 2)])
    await storage.insert_many([(b"%04d" % i, b"v%d" % i) for i in range(1, 10, 2)], IMPORTED)
    scanned = [item async for item in storage.scan_with_info(batch_size=3)]
    assert [(k, v) for k, v, _ in scanned] == [item async for item in storage.scan()]
    assert [info for _, _, info in scanned] == [await storage.info(k) for k, _, _ in scanned]
    assert {info.origin for _, _, info in scanned} == {Origin.LOCAL, IMPORTED}


async def test_scan_rejects_a_batch_size_below_one(storage: Storage) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        async for _ in storage.scan(batch_size=0):
            pass


async def test_purge_removes_only_this_namespace(storage: Storage) -> None:
    await storage.insert_many([(b"a", b"1"), (b"b", b"2")])
    assert await storage.purge() == Purged(2)
    assert [item async for item in storage.scan()] == []


async def test_purge_key_removes_one_key(storage: Storage) -> None:
    await storage.insert_many([(b"a", b"1"), (b"b", b"2")])
    assert await storage.purge_key(b"a") == Purged(1)
    assert await storage.purge_key(b"a") == Purged(0)
    assert await storage.get(b"a") is None
    assert await storage.get(b"b") == b"2"


async def test_summary_counts_entries_and_bytes(storage: Storage) -> None:
    await storage.insert_many([(b"ab", b"123"), (b"c", b"4")])
    assert await storage.summary() == NamespaceSummary(storage.namespace, entries=2, bytes=7)


async def test_describe_names_the_backend_and_namespace(storage: Storage) -> None:
    assert storage.namespace in storage.describe()


@pytest.mark.parametrize("outcome", [Stored(), Conflict(b"x"), Failed("disk full")])
def test_an_insert_outcome_is_never_read_as_a_bool(outcome: Stored | Conflict | Failed) -> None:
    with pytest.raises(
        TypeError, match=r"cannot be used as a bool; .*isinstance\(result, Stored\)"
    ):
        bool(outcome)


async def test_a_failed_insert_cannot_pass_an_if(storage: Storage) -> None:
    result = await storage.insert(b"k", b"v")
    with pytest.raises(TypeError, match="isinstance"):
        if result:
            pass


def test_a_namespace_takes_the_applications_version() -> None:
    ns = Namespace("myapp", "kernels", "2.1")
    assert str(ns) == "myapp/2.1/kernels"
    assert Namespace("myapp", "kernels", version="2.1") == ns


def test_a_namespace_without_a_version_is_refused() -> None:
    with pytest.raises(TypeError, match="version"):
        Namespace("myapp", "kernels")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"needs a version: pass your application's own"):
        Namespace("myapp", "kernels", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"version of namespace 'myapp' must not be empty"):
        Namespace("myapp", "kernels", "")
