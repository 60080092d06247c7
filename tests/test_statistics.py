"""Statistics: hits by origin, misses, computes, seconds saved; batched, kept, added up."""

from __future__ import annotations

import gc
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

import warmenv.persistence.sqlite.statistics as sqlite_statistics
import warmenv.persistence.statistics as statistics_module
from warmenv import Environment, open_environment
from warmenv.config import ConfigError, load_config
from warmenv.persistence import BytesCodec, JsonCodec, Origin
from warmenv.persistence.sqlite.database import SqliteDatabase
from warmenv.persistence.sqlite.opening import APPLICATION_ID
from warmenv.persistence.statistics import Batch, Cursor, Pending
from warmenv.persistence.storage import BundleRef, Stored
from warmenv.persistence.store import CacheMode, Store

pytestmark = pytest.mark.anyio

NS = "app/1/kernels"
BUNDLE = BundleRef("H100 Linux", "blake2b-256:" + "ab" * 32)


def stored_counts(path: Path) -> dict[str, tuple[int, int, int]]:
    """(hits, misses, computes) per namespace, as the database itself holds them."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT namespace, sum(hits), sum(misses), sum(computes) FROM statistics "
            "GROUP BY namespace"
        ).fetchall()
    return {ns: (int(h), int(m), int(c)) for ns, h, m, c in rows}


async def slow_square(n: int) -> int:
    await anyio.sleep(0.05)
    return n * n


async def test_get_or_compute_records_the_computation_time_as_cost(any_env: Environment) -> None:
    store: Store[str, int] = await any_env.store(NS)
    assert await store.get_or_compute("k", slow_square, 3) == 9
    info = await any_env.storage(NS).info(b'"k"')
    assert info is not None and info.cost is not None
    assert 0.04 <= info.cost < 5  # uvloop may wake a millisecond early


async def test_get_many_counts_each_key_as_get_does(any_env: Environment) -> None:
    store: Store[str, int] = await any_env.store(NS)
    await store.insert("held", 1)
    await any_env.storage(NS).insert(b'"stored"', b"2")  # not yet in the store's memory
    found = await store.get_many(["held", "stored", "absent", "gone", "held"])
    assert found == {"held": 1, "stored": 2}
    assert await store.get_many([]) == {}
    stats = await any_env.statistics()
    (kernels,) = [s for s in stats.namespaces if s.namespace == NS]
    assert (kernels.hits, kernels.misses, kernels.computes) == (2, 2, 0)
    assert kernels.hits_by_origin == {Origin.LOCAL: 2}


async def test_hits_misses_and_computes_are_counted_per_namespace(any_env: Environment) -> None:
    store: Store[str, int] = await any_env.store(NS)
    other: Store[str, int] = await any_env.store("app/1/other")
    await store.get_or_compute("a", slow_square, 2)  # a miss, computed
    for _ in range(3):
        assert await store.get_or_compute("a", slow_square, 2) == 4
    assert await store.get("a") == 4
    assert await store.get("absent") is None
    assert await other.get("nothing") is None
    stats = await any_env.statistics()
    by_ns = {s.namespace: s for s in stats.namespaces}
    kernels = by_ns[NS]
    assert (kernels.hits, kernels.misses, kernels.computes) == (4, 2, 1)
    assert kernels.hits_by_origin == {Origin.LOCAL: 4}
    assert kernels.compute_seconds >= 0.04
    # Four hits on one entry: its cost saved once (this process's cold start).
    assert kernels.saved_seconds == pytest.approx(kernels.compute_seconds, rel=0.01)
    assert (kernels.entries, kernels.bytes) == (1, len(b'"a"') + len(b"4"))
    assert (by_ns["app/1/other"].hits, by_ns["app/1/other"].misses) == (0, 1)


async def test_hits_on_imported_entries_count_by_origin_and_bundle(any_env: Environment) -> None:
    storage = any_env.storage(NS)
    codec: JsonCodec[str, int] = JsonCodec()
    items = [(codec.encode_key(f"k{i}"), codec.encode_value(i)) for i in range(3)]
    await storage.insert_many(items, Origin.IMPORTED, cost=2.5, bundle=BUNDLE)
    store: Store[str, int] = await any_env.store(NS)
    for _ in range(2):
        assert await store.get("k0") == 0
    assert await store.get("k1") == 1
    await store.get_or_compute("local", slow_square, 1)
    assert await store.get("local") == 1
    stats = await any_env.statistics()
    (kernels,) = stats.namespaces
    assert kernels.hits_by_origin == {Origin.LOCAL: 1, Origin.IMPORTED: 3}
    assert kernels.saved_seconds >= 2 * 2.5  # k0 (hit twice) and k1, once each
    (bundle,) = stats.bundles
    assert (bundle.name, bundle.digest, bundle.entries, bundle.hits) == (
        BUNDLE.name,
        BUNDLE.digest,
        3,
        3,
    )
    assert bundle.distinct_hits == 2
    assert bundle.saved_seconds == pytest.approx(5.0)


async def test_statistics_include_counts_not_yet_flushed_and_no_hit_writes(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        store: Store[str, int] = await env.store(NS)
        await store.insert("k", 1)
        for _ in range(5):
            await store.get("k")
        # Nothing reached the database: no write per hit.
        assert stored_counts(env.path) == {}
        (kernels,) = (await env.statistics()).namespaces
        assert kernels.hits == 5


async def test_counts_survive_a_restart(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        store: Store[str, int] = await env.store(NS)
        await store.get_or_compute("k", slow_square, 4)
        await store.get("k")
    async with open_environment("e", root=root) as env:
        store = await env.store(NS)
        await store.get("k")
        (kernels,) = (await env.statistics()).namespaces
    assert (kernels.hits, kernels.misses, kernels.computes) == (2, 1, 1)


async def test_a_closed_store_flushes_its_counts(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        opened: Store[str, int] = await env.store(NS)
        async with opened as store:
            await store.insert("k", 1)
            await store.get("k")
            await store.get("gone")
        assert stored_counts(env.path) == {NS: (1, 1, 0)}


async def test_a_store_dropped_without_close_loses_no_counts(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        store: Store[str, int] = await env.store(NS)
        await store.insert("k", 1)
        await store.get("k")
        await store.get("k")
        del store
        gc.collect()
        path = env.path
    assert stored_counts(path) == {NS: (2, 0, 0)}


async def test_a_flush_records_the_hit_keys_recency(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        store: Store[bytes, bytes] = await env.store(NS, codec=BytesCodec())
        await store.insert(b"hit", b"v")
        await store.insert(b"cold", b"v")
        await store.get(b"hit")
        with sqlite3.connect(env.path) as conn:
            before = dict(conn.execute("SELECT key, last_hit FROM entries").fetchall())
        assert before == {b"hit": None, b"cold": None}
        assert await env.flush_statistics()
        with sqlite3.connect(env.path) as conn:
            after = dict(conn.execute("SELECT key, last_hit FROM entries").fetchall())
    assert after[b"cold"] is None and after[b"hit"] is not None


async def test_the_background_flush_writes_counts_while_the_block_runs(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statistics_module, "FLUSH_INTERVAL", 0.01)
    flushed = anyio.Event()
    counted = False  # a flush begun before the hit was counted (during the insert) is not it
    original = statistics_module.Recorder.flush

    async def flush_and_tell(recorder: statistics_module.Recorder) -> bool:
        after_the_hit = counted
        written = await original(recorder)
        if after_the_hit:
            flushed.set()
        return written

    monkeypatch.setattr(statistics_module.Recorder, "flush", flush_and_tell)
    async with open_environment("e", root=root) as env:
        store: Store[str, int] = await env.store(NS)
        await store.insert("k", 1)
        await store.get("k")
        counted = True
        with anyio.fail_after(10):
            await flushed.wait()  # no close, no statistics(): only the background task flushes
        assert stored_counts(env.path) == {NS: (1, 0, 0)}


async def test_statistics_can_be_turned_off(root: Path) -> None:
    async with open_environment("e", root=root, statistics=False) as env:
        store: Store[str, int] = await env.store(NS)
        await store.insert("k", 1)
        await store.get("k")
        await store.get("absent")
        (kernels,) = (await env.statistics()).namespaces
    assert (kernels.hits, kernels.misses) == (0, 0)
    assert stored_counts(root / "e.db") == {}


async def test_an_error_in_the_block_leaves_it_unwrapped(root: Path) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with open_environment("e", root=root):
            raise KeyError("mine")


async def test_a_lazy_store_counts_reads_through_as_hits(any_env: Environment) -> None:
    await any_env.storage(NS).insert(b'"k"', b"1")
    store: Store[str, int] = await any_env.store(NS, mode=CacheMode.LAZY)
    assert await store.get("k") == 1
    assert await store.get_or_compute("k", slow_square, 1) == 1
    (kernels,) = (await any_env.statistics()).namespaces
    assert (kernels.hits, kernels.misses, kernels.computes) == (2, 0, 0)


async def test_askers_sharing_one_read_each_count_a_hit(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        store: Store[str, int] = await env.store(NS)
        await env.storage(NS).insert(b'"k"', b"1")  # after the store opened: read through
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(store.get_or_compute, "k", slow_square, 1)
        (kernels,) = (await env.statistics()).namespaces
    assert (kernels.hits, kernels.misses, kernels.computes) == (5, 0, 0)


async def test_askers_sharing_one_computation_each_count_a_miss(root: Path) -> None:
    gate = anyio.Event()

    async def tune() -> int:
        await gate.wait()
        return 1

    async with open_environment("e", root=root) as env:
        store: Store[str, int] = await env.store(NS)
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(store.get_or_compute, "k", tune)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        (kernels,) = (await env.statistics()).namespaces
    assert (kernels.hits, kernels.misses, kernels.computes) == (0, 5, 1)


async def test_memoized_calls_sharing_one_run_each_count_a_miss(root: Path) -> None:
    gate = anyio.Event()

    async with open_environment("e", root=root) as env:
        store: Store[list[int], int] = await env.store(NS)

        @store.memoize
        async def tune(n: int) -> int:
            await gate.wait()
            return n

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(tune, 3)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        assert await tune(3) == 3
        (kernels,) = (await env.statistics()).namespaces
    assert (kernels.hits, kernels.misses, kernels.computes) == (1, 5, 1)


async def test_a_key_served_by_get_and_by_a_read_through_counts_as_one_entry(
    any_env: Environment,
) -> None:
    # get_or_compute reading through holds the key's encoding, get its str: the
    # flush sees the same entry in both forms and must add them up as one.
    storage = any_env.storage(NS)
    await storage.insert_many([(b'"k"', b"1")], Origin.IMPORTED, cost=2.5, bundle=BUNDLE)
    store: Store[str, int] = await any_env.store(NS, mode=CacheMode.LAZY)
    assert await store.get_or_compute("k", slow_square, 1) == 1
    assert await store.get("k") == 1
    assert await any_env.flush_statistics()
    stats = await any_env.statistics()
    (kernels,) = stats.namespaces
    assert kernels.hits_by_origin == {Origin.IMPORTED: 2}
    assert kernels.saved_seconds == pytest.approx(2.5)
    (bundle,) = stats.bundles
    assert (bundle.hits, bundle.distinct_hits) == (2, 1)
    assert bundle.saved_seconds == pytest.approx(2.5)


async def test_an_entry_served_as_its_str_and_as_its_encoding_in_one_slice_saves_once(
    root: Path,
) -> None:
    # A JSON store holds a key under its str, or under its encoding when spelled
    # otherwise: should one slice carry the same entry in both forms, its hits
    # add up and its saving counts once (the SQL adds savings without grouping
    # per entry; `cut` makes the two forms one row).
    async with open_environment("e", root=root) as env:
        await env.storage(NS).insert_many(
            [(b'"k"', b"1"), (b'"j"', b"2")], Origin.IMPORTED, cost=2.5, bundle=BUNDLE
        )
        path = env.path
    batch = Batch()
    batch.add(NS, ["k", b'"k"', "k", b'"j"'], 1, 0, 0.0)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert sqlite_statistics.flush(batch, statistics_module.START, 0, conn) == batch.end
        stats = sqlite_statistics.read(Batch(), 2, conn)
    finally:
        conn.close()
    (kernels,) = stats.namespaces
    assert (kernels.hits_by_origin, kernels.misses) == ({Origin.IMPORTED: 4}, 1)
    assert kernels.saved_seconds == pytest.approx(2 * 2.5)
    (bundle,) = stats.bundles
    assert (bundle.hits, bundle.distinct_hits) == (4, 2)
    assert bundle.saved_seconds == pytest.approx(2 * 2.5)


async def test_a_flush_larger_than_one_statement_counts_every_namespace(root: Path) -> None:
    # 1,200 namespaces and 2,400 hit keys: the batch goes into SQLite in several
    # statements; every count, origin, saving and recency must still land.
    count = 1200
    names = [f"app/{i}/kernels" for i in range(count)]
    async with open_environment("e", root=root) as env:
        stores: list[Store[str, int]] = []
        for i, name in enumerate(names):
            await env.storage(name).insert_many(
                [(b'"a"', b"1"), (b'"b"', b"2"), (b'"cold"', b"3")],
                Origin.IMPORTED if i % 2 else Origin.LOCAL,
                cost=1.0,
                bundle=BUNDLE if i % 2 else None,
            )
            stores.append(await env.store(name))
        for store in stores:
            assert await store.get("a") == 1
            assert await store.get("a") == 1
            assert await store.get("b") == 2
            assert await store.get("absent") is None
        assert await env.flush_statistics()
        stats = await env.statistics()
        path = env.path
    by_ns = {s.namespace: s for s in stats.namespaces}
    for i, name in enumerate(names):
        kernels = by_ns[name]
        origin = Origin.IMPORTED if i % 2 else Origin.LOCAL
        assert (kernels.hits, kernels.misses, kernels.hits_by_origin) == (3, 1, {origin: 3})
        assert kernels.saved_seconds == pytest.approx(2.0)  # a and b, once each
    (bundle,) = stats.bundles
    assert (bundle.entries, bundle.hits, bundle.saved_seconds) == (1800, 1800, 1200.0)
    assert bundle.distinct_hits == 1200
    assert stored_counts(path) == {name: (3, 1, 0) for name in names}
    with sqlite3.connect(path) as conn:
        recency = conn.execute(
            "SELECT key, count(*), count(last_hit) FROM entries GROUP BY key ORDER BY key"
        ).fetchall()
    assert recency == [(b'"a"', count, count), (b'"b"', count, count), (b'"cold"', count, 0)]


_CHILD = textwrap.dedent(
    """
    import sys
    import anyio
    from warmenv import open_environment

    async def main() -> None:
        async with open_environment("shared", root=sys.argv[1]) as env:
            store = await env.store("app/1/kernels")
            await store.insert("k", 1)  # a conflict in all but one: same value
            for _ in range(250):
                await store.get("k")
            for i in range(7):
                await store.get(f"absent-{i}")
            await store.aclose()
            for _ in range(50):
                await store.get("k")

    anyio.run(main, backend=sys.argv[2])
    """
)


async def test_counts_of_four_processes_add_up(root: Path, backend_name: str) -> None:
    root.mkdir(parents=True)
    async with open_environment("shared", root=root):
        pass  # created once, so the children race on counting, not on creating

    def run_children() -> list[subprocess.CompletedProcess[str]]:
        children = [
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(root), backend_name],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        results = []
        for child in children:
            out, err = child.communicate(timeout=120)
            results.append(subprocess.CompletedProcess(child.args, child.returncode, out, err))
        return results

    for result in await anyio.to_thread.run_sync(run_children):
        assert result.returncode == 0, result.stderr
    async with open_environment("shared", root=root) as env:
        (kernels,) = (await env.statistics()).namespaces
    assert (kernels.hits, kernels.misses) == (4 * 300, 4 * 7)
    assert kernels.hits_by_origin == {Origin.LOCAL: 1200}


def test_config_max_bytes_takes_a_size(tmp_path: Path) -> None:
    (tmp_path / "warmenv.toml").write_text('max_bytes = "2KiB"\n')
    assert load_config(tmp_path).max_bytes == 2048
    (tmp_path / "warmenv.toml").write_text("max_bytes = 5000\n")
    assert load_config(tmp_path).max_bytes == 5000


def test_a_bad_config_max_bytes_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "warmenv.toml").write_text('max_bytes = "lots"\n')
    with pytest.raises(ConfigError, match="max_bytes"):
        load_config(tmp_path)


async def test_open_environment_applies_the_configured_max_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "warmenv.toml").write_text('max_bytes = "1KiB"\n')
    monkeypatch.chdir(tmp_path)
    async with open_environment("e", root=tmp_path / "root") as env:
        assert env.max_bytes == 1024
    async with open_environment("e", root=tmp_path / "root", max_bytes=10) as env:
        assert env.max_bytes == 10


async def test_a_read_only_environment_still_shows_this_process_counts(tmp_path: Path) -> None:
    from warmenv.bundle import export_bundle

    async with open_environment(file=tmp_path / "src.db") as source:
        await source.storage(NS).insert(b'"k"', b"1")
        await export_bundle(source, tmp_path / "b.bundle", name="b", version="1", format="sqlite")
    before = (tmp_path / "b.bundle").read_bytes()
    async with open_environment(file=tmp_path / "b.bundle") as env:
        assert env.read_only
        store: Store[str, int] = await env.store(NS)
        assert await store.get("k") == 1
        assert await store.get("absent") is None
        assert not await env.flush_statistics()  # nowhere to keep them
        (kernels,) = (await env.statistics()).namespaces
        assert (kernels.hits, kernels.misses, kernels.entries) == (1, 1, 1)
    assert (tmp_path / "b.bundle").read_bytes() == before


async def test_leaving_the_block_in_a_cancelled_scope_is_not_a_checkpoint(root: Path) -> None:
    left = False
    with anyio.CancelScope() as scope:
        async with open_environment("e", root=root) as env:
            store: Store[str, int] = await env.store(NS)
            await store.insert("k", 1)
            await store.get("k")
            scope.cancel()
        left = True  # the background flusher's exit did not raise the cancellation here
    assert left
    assert stored_counts(root / "e.db") == {NS: (1, 0, 0)}  # and close still flushed


ODD_KEYS = ["plain", "ключ", 'a "quote" and a \\', "tab\tnew\nline", "\x00", "\x7f", "😀"]


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16le"])
async def test_a_hit_on_any_str_key_counts_what_its_entry_saved(
    tmp_path: Path, encoding: str
) -> None:
    # The flush finds each hit key's entry in SQL: a key that is not ASCII,
    # or that JSON escapes, and a file whose text is not UTF-8, all resolve.
    root = tmp_path / "root"
    async with open_environment("e", root=root) as env:
        path = env.path
    path.unlink()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA encoding = '{encoding}'")
        conn.execute("CREATE TABLE unrelated (x)")  # the encoding is fixed by the first table
        conn.execute("DROP TABLE unrelated")
        # Marked as an environment (empty): warmenv makes its tables in it. Unmarked,
        # it is not warmenv's and is refused (tests/test_ownership.py).
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.close()
    codec: JsonCodec[str, int] = JsonCodec()
    async with open_environment("e", root=root) as env:
        storage = env.storage(NS)
        items = [(codec.encode_key(k), codec.encode_value(i)) for i, k in enumerate(ODD_KEYS)]
        await storage.insert_many(items, Origin.IMPORTED, cost=2.0, bundle=BUNDLE)
        store: Store[str, int] = await env.store(NS)
        for i, key in enumerate(ODD_KEYS):
            assert await store.get(key) == i
            assert await store.get(key) == i
        assert await env.flush_statistics()
        (kernels,) = (await env.statistics()).namespaces
        (bundle,) = (await env.statistics()).bundles
    assert kernels.hits_by_origin == {Origin.IMPORTED: 2 * len(ODD_KEYS)}
    assert kernels.saved_seconds == bundle.saved_seconds == 2.0 * len(ODD_KEYS)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA encoding").fetchone()[0].lower() == encoding.lower()
    conn.close()


# --- a flush in slices ------------------------------------------------------------


async def quick(n: int) -> int:
    return n


def count_slices(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record how many served keys each slice written to SQLite took, one item a slice."""
    original = sqlite_statistics.flush
    slices: list[int] = []

    def counted(batch: Batch, start: Cursor, now: int, conn: sqlite3.Connection) -> Cursor:
        end = original(batch, start, now, conn)
        slices.append(end.served - start.served)
        return end

    monkeypatch.setattr(sqlite_statistics, "flush", counted)
    return slices


def stored_bundle_hits(path: Path) -> list[tuple[int, float]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT hits, saved_seconds FROM bundle_statistics").fetchall()
    conn.close()
    return [(int(h), float(s)) for h, s in rows]


async def many_namespaces(env: Environment, count: int) -> list[str]:
    """`count` namespaces, each hit 3 times on 2 keys and missed once (counts pending)."""
    names = [f"app/{i}/kernels" for i in range(count)]
    for name in names:
        await env.storage(name).insert_many([(b'"a"', b"1"), (b'"b"', b"2")])
        store: Store[str, int] = await env.store(name)
        assert await store.get("a") == 1
        assert await store.get("a") == 1
        assert await store.get("b") == 2
        assert await store.get("absent") is None
    return names


async def test_a_flush_in_many_slices_counts_every_namespace_exactly(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statistics_module, "SLICE_ROWS", 25)
    slices = count_slices(monkeypatch)
    names = [f"app/{i}/kernels" for i in range(120)]
    async with open_environment("e", root=root) as env:
        stores: list[Store[str, int]] = []
        for i, name in enumerate(names):
            await env.storage(name).insert_many(
                [(b'"a"', b"1"), (b'"b"', b"2"), (b'"cold"', b"3")],
                Origin.IMPORTED if i % 2 else Origin.LOCAL,
                cost=0.5 if i % 2 else 1.0,
                bundle=BUNDLE if i % 2 else None,
            )
            stores.append(await env.store(name))
        for i, store in enumerate(stores):
            assert await store.get("a") == 1
            assert await store.get("a") == 1
            assert await store.get("b") == 2
            assert await store.get("absent") is None
            if i % 3 == 0:
                assert await store.get_or_compute("c", quick, i) == i  # a miss, computed
        assert await env.flush_statistics()
        computed = {
            name: info.cost
            for name in names[::3]
            if (info := await env.storage(name).info(b'"c"')) is not None and info.cost is not None
        }
        stats = await env.statistics()
        path = env.path
    assert len(slices) >= 10  # sliced: 120 namespaces, 240 hit keys, 40 computed
    by_ns = {s.namespace: s for s in stats.namespaces}
    for i, name in enumerate(names):
        kernels = by_ns[name]
        origin, cost = (Origin.IMPORTED, 0.5) if i % 2 else (Origin.LOCAL, 1.0)
        computes = 1 if i % 3 == 0 else 0
        assert (kernels.hits, kernels.misses, kernels.computes) == (3, 1 + computes, computes)
        assert kernels.hits_by_origin == {origin: 3}
        assert kernels.saved_seconds == pytest.approx(2 * cost)  # a and b, once each
        assert kernels.compute_seconds == pytest.approx(computed.get(name, 0.0))
    assert len(computed) == 40
    (bundle,) = stats.bundles
    assert bundle.hits == 180 and bundle.saved_seconds == pytest.approx(60.0)
    assert stored_counts(path) == {
        name: (3, 2 if i % 3 == 0 else 1, 1 if i % 3 == 0 else 0) for i, name in enumerate(names)
    }
    with sqlite3.connect(path) as conn:
        recency = conn.execute(
            "SELECT key, count(*), count(last_hit) FROM entries WHERE key != ? "
            "GROUP BY key ORDER BY key",
            (b'"c"',),
        ).fetchall()
    conn.close()
    assert recency == [(b'"a"', 120, 120), (b'"b"', 120, 120), (b'"cold"', 120, 0)]


async def test_a_namespace_with_more_hits_than_a_slice_is_split_and_adds_up(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 60 distinct keys, one hit hundreds of times, in slices of 10 rows and 100
    # served keys: the namespace spans many slices, its misses go once, and the
    # bundle's hits, the seconds saved and every key's recency still add up.
    monkeypatch.setattr(statistics_module, "SLICE_ROWS", 10)
    monkeypatch.setattr(statistics_module, "SLICE_SERVED", 100)
    slices = count_slices(monkeypatch)
    codec: JsonCodec[str, int] = JsonCodec()
    async with open_environment("e", root=root) as env:
        storage = env.storage(NS)
        imported = [(codec.encode_key(f"i{n}"), codec.encode_value(n)) for n in range(40)]
        await storage.insert_many(imported, Origin.IMPORTED, cost=0.25, bundle=BUNDLE)
        local = [(codec.encode_key(f"l{n}"), codec.encode_value(n)) for n in range(20)]
        await storage.insert_many(local, cost=2.0)
        await storage.insert(codec.encode_key("cold"), codec.encode_value(0))
        store: Store[str, int] = await env.store(NS)
        for _ in range(300):
            assert await store.get("i0") == 0  # one hot key: few rows, many served
        for n in range(40):
            assert await store.get(f"i{n}") == n
        for n in range(20):
            for _ in range(3):
                assert await store.get(f"l{n}") == n
        for n in range(7):
            assert await store.get(f"absent-{n}") is None
        assert await store.get_or_compute("new", quick, 5) == 5
        info = await storage.info(codec.encode_key("new"))
        assert await env.flush_statistics()
        stats = await env.statistics()
        path = env.path
    assert len(slices) >= 6 and sum(slices) == 300 + 40 + 60
    (kernels,) = stats.namespaces
    assert kernels.hits_by_origin == {Origin.IMPORTED: 340, Origin.LOCAL: 60}
    assert (kernels.misses, kernels.computes) == (8, 1)
    assert info is not None and kernels.compute_seconds == pytest.approx(info.cost)
    assert kernels.saved_seconds == pytest.approx(40 * 0.25 + 20 * 2.0)  # once per entry
    (bundle,) = stats.bundles
    assert (bundle.entries, bundle.hits) == (40, 340)
    assert bundle.saved_seconds == pytest.approx(10.0)
    assert stored_counts(path) == {NS: (400, 8, 1)}
    ((hits, saved),) = stored_bundle_hits(path)
    assert hits == 340 and saved == pytest.approx(10.0)
    with sqlite3.connect(path) as conn:
        never_hit = conn.execute("SELECT key FROM entries WHERE last_hit IS NULL").fetchall()
    conn.close()
    assert sorted(never_hit) == [(b'"cold"',), (b'"new"',)]


def test_slices_of_a_batch_hold_each_count_once() -> None:
    # Whatever the bounds, the slices' rows add up to the whole batch's, each
    # namespace's misses come once, and no slice holds much more than its rows.
    batch = Batch()
    batch.add("quiet", [], 2, 1, 0.5)
    hot: list[bytes | str] = [b"h" for _ in range(500)]
    hot += [b"x", b"y"]
    wide: list[bytes | str] = [f"k{n}" for _ in range(2) for n in range(90)]
    batch.add("hot", hot, 3, 0, 0.0)
    batch.add("wide", wide, 0, 0, 0.0)
    batch.add("one", ["only"], 1, 0, 0.0)
    whole = statistics_module.hit_params(batch)
    keys = [bytes(key) for key in whole[1::3]]  # type: ignore[arg-type]
    expected = sorted(zip(whole[::3], keys, whole[2::3], strict=True))
    for rows, served in [(1, 1), (2, 5), (7, 64), (10, 100), (25, 10_000)]:
        got: list[tuple[Any, Any, Any]] = []
        misses, start = 0, statistics_module.START
        while not batch.written(start):
            piece = statistics_module.cut(batch, start, rows=rows, served=served)
            assert piece.end != start  # every slice moves on
            hits = len(piece.hits) // 3
            assert len(piece.namespaces) // 5 + hits <= rows + rows // 8 + 1
            got += zip(piece.hits[::3], piece.hits[1::3], piece.hits[2::3], strict=True)
            misses += sum(piece.namespaces[2::5])  # type: ignore[arg-type]
            start = piece.end
        merged: dict[tuple[object, bytes], int] = {}
        for i, key, n in got:
            merged[(i, bytes(key))] = merged.get((i, bytes(key)), 0) + int(n)
        assert sorted((i, k, n) for (i, k), n in merged.items()) == expected, (rows, served)
        assert misses == 6


def test_what_a_failed_slice_leaves_is_the_rest_of_the_batch() -> None:
    batch = Batch()
    batch.add("a", [b"1", b"2"], 1, 0, 0.0)
    batch.add("b", [b"3", b"4", b"5"], 2, 1, 0.5)
    batch.add("c", [], 4, 0, 0.0)
    assert list(batch.rest(Cursor(1, 3))) == [
        Pending("b", [b"4", b"5"], 0, 0, 0.0),  # its first part, misses too, was written
        Pending("c", [], 4, 0, 0.0),
    ]
    assert list(batch.rest(Cursor(1, 2))) == list(batch)[1:]
    assert list(batch.rest(statistics_module.START)) == list(batch)
    assert list(batch.rest(batch.end)) == []


async def test_a_failed_middle_slice_loses_nothing_and_counts_nothing_twice(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statistics_module, "SLICE_ROWS", 25)
    async with open_environment("e", root=root) as env:
        names = await many_namespaces(env, 120)
        db = env.database
        assert db is not None
        await db.run(
            lambda conn: conn.execute(
                "CREATE TRIGGER fail_one BEFORE INSERT ON statistics "
                "WHEN new.namespace = 'app/60/kernels' BEGIN SELECT RAISE(ABORT, 'injected'); END"
            )
        )
        assert not await env.flush_statistics()
        stored = stored_counts(env.path)
        # The slices before the failing one stay written; it and the rest do not.
        assert 0 < len(stored) < 60
        assert set(stored) <= set(names[:60])
        by_ns = {s.namespace: s for s in (await env.statistics()).namespaces}
        assert all((by_ns[n].hits, by_ns[n].misses) == (3, 1) for n in names)

        await db.run(lambda conn: conn.execute("DROP TRIGGER fail_one"))
        assert await env.flush_statistics()
        assert stored_counts(env.path) == {name: (3, 1, 0) for name in names}
        by_ns = {s.namespace: s for s in (await env.statistics()).namespaces}
    assert all((by_ns[n].hits, by_ns[n].misses) == (3, 1) for n in names)


async def test_a_failed_slice_inside_a_split_namespace_keeps_its_misses_once(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first slice writes the namespace's misses and the bundle's row; the
    # second fails on adding to that row: what goes back is the rest of the
    # hits, without the misses already written.
    monkeypatch.setattr(statistics_module, "SLICE_ROWS", 10)
    codec: JsonCodec[str, int] = JsonCodec()
    async with open_environment("e", root=root) as env:
        storage = env.storage(NS)
        items = [(codec.encode_key(f"k{n}"), codec.encode_value(n)) for n in range(40)]
        await storage.insert_many(items, Origin.IMPORTED, cost=0.5, bundle=BUNDLE)
        store: Store[str, int] = await env.store(NS)
        for n in range(40):
            assert await store.get(f"k{n}") == n
        for n in range(3):
            assert await store.get(f"absent-{n}") is None
        db = env.database
        assert db is not None
        await db.run(
            lambda conn: conn.execute(
                "CREATE TRIGGER fail_update BEFORE UPDATE ON bundle_statistics "
                "BEGIN SELECT RAISE(ABORT, 'injected'); END"
            )
        )
        assert not await env.flush_statistics()
        ((hits, misses, _),) = stored_counts(env.path).values()
        assert 0 < hits < 40 and misses == 3
        (kernels,) = (await env.statistics()).namespaces
        assert (kernels.hits, kernels.misses) == (40, 3)

        await db.run(lambda conn: conn.execute("DROP TRIGGER fail_update"))
        assert await env.flush_statistics()
        stats = await env.statistics()
        path = env.path
    assert stored_counts(path) == {NS: (40, 3, 0)}
    ((hits, saved),) = stored_bundle_hits(path)
    assert hits == 40 and saved == pytest.approx(20.0)
    (kernels,) = stats.namespaces
    (bundle,) = stats.bundles
    assert (kernels.hits, kernels.misses) == (40, 3)
    assert kernels.saved_seconds == bundle.saved_seconds == pytest.approx(20.0)
    assert bundle.hits == 40


async def test_a_read_during_a_flush_waits_for_one_slice_not_the_whole_flush(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Completions in order: a read asked for once the first slice is written
    # is queued behind at most the slice asked for then, never the whole flush.
    monkeypatch.setattr(statistics_module, "SLICE_ROWS", 20)
    done: list[str] = []
    first = anyio.Event()
    read_queued = anyio.Event()
    original = SqliteDatabase.flush_statistics
    original_run = SqliteDatabase.run

    async def telling(self: SqliteDatabase, batch: Batch, start: Cursor) -> Cursor | None:
        end = await original(self, batch, start)
        done.append("slice")
        if not first.is_set():
            first.set()
            # The next slice is asked for only once the read is queued: under load the
            # reader might otherwise be scheduled a slice or two late (what is tested
            # is the order the worker serves them in, not the scheduler's timing).
            await read_queued.wait()
        return end

    async def noting(self: SqliteDatabase, fn: Any) -> Any:
        if first.is_set() and not read_queued.is_set():
            read_queued.set()  # no checkpoint before run() queues the call
        return await original_run(self, fn)

    monkeypatch.setattr(SqliteDatabase, "flush_statistics", telling)
    monkeypatch.setattr(SqliteDatabase, "run", noting)
    async with open_environment("e", root=root) as env:
        await many_namespaces(env, 100)
        storage = env.storage("app/reader/kernels")
        assert isinstance(await storage.insert(b"k", b"v"), Stored)

        async def read_once_flushing() -> None:
            await first.wait()
            assert await storage.get(b"k") == b"v"
            done.append("read")

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_once_flushing)
            assert await env.flush_statistics()
        assert stored_counts(env.path)["app/99/kernels"] == (3, 1, 0)
    read = done.index("read")
    assert read <= 2, done  # behind the slice queued before it, at most
    assert done[read:].count("slice") >= 8, done  # the flush went on after it


async def test_a_flush_cancelled_while_a_slice_is_written_counts_it_once(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cancellation arrives as the second slice goes to the worker: that
    # slice still commits (and is known to have), the flush stops after it,
    # and the next flush writes the rest, nothing twice.
    monkeypatch.setattr(statistics_module, "SLICE_ROWS", 20)
    original = SqliteDatabase.flush_statistics
    calls = 0
    scope = anyio.CancelScope()

    async def cancelling(self: SqliteDatabase, batch: Batch, start: Cursor) -> Cursor | None:
        nonlocal calls
        calls += 1
        if calls == 2:
            scope.cancel()
        return await original(self, batch, start)

    monkeypatch.setattr(SqliteDatabase, "flush_statistics", cancelling)
    async with open_environment("e", root=root) as env:
        names = await many_namespaces(env, 50)
        with scope:
            await env.flush_statistics()
        assert scope.cancelled_caught and calls == 2
        assert 0 < len(stored_counts(env.path)) < 50
        assert await env.flush_statistics()
        assert stored_counts(env.path) == {name: (3, 1, 0) for name in names}


def test_an_origin_shows_as_its_name_for_json_keys_and_text() -> None:
    """`str()` of an origin is its name, so hits_by_origin keyed by it reads in JSON."""
    import json

    counts = {Origin.LOCAL: 1, Origin.IMPORTED: 4, Origin.REMOTE: 2}
    assert json.dumps({str(o): h for o, h in counts.items()}) == (
        '{"local": 1, "imported": 4, "remote": 2}'
    )
    assert f"{Origin.REMOTE} hits" == "remote hits"
    assert int(Origin.IMPORTED) == 1 and Origin(2) is Origin.REMOTE


async def test_repeat_hits_in_one_process_save_an_entry_once(root: Path) -> None:
    # Issue 21: 1,000 hits on 100 imported entries said "saved" 10 times their
    # recomputation. A saving is the cold start a hit avoided: once per entry per
    # process, however many flushes the repeats straddle; a new process saves again.
    codec: JsonCodec[str, int] = JsonCodec()
    items = [(codec.encode_key(f"k{i}"), codec.encode_value(i)) for i in range(100)]
    for run in range(2):
        async with open_environment("e", root=root) as env:
            if run == 0:
                await env.storage(NS).insert_many(items, Origin.IMPORTED, cost=0.5, bundle=BUNDLE)
            store: Store[str, int] = await env.store(NS)
            for round_ in range(10):
                for i in range(100):
                    assert await store.get(f"k{i}") == i
                if round_ % 3 == 0:  # repeats land in later flushes (slices) too
                    assert await env.flush_statistics()
            stats = await env.statistics()
        (kernels,) = stats.namespaces
        (bundle,) = stats.bundles
        assert kernels.hits == bundle.hits == 1000 * (run + 1)
        assert kernels.saved_seconds == bundle.saved_seconds == pytest.approx(50.0 * (run + 1))
        assert (bundle.entries, bundle.distinct_hits) == (100, 100)
