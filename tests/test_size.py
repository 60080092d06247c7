"""Bounded size: coarse recency, eviction to `max_bytes`, gc by age and version, vacuum."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

import warmenv.persistence.storage as storage_module
from warmenv import Environment, WarmenvWarning, open_environment
from warmenv.persistence import Purged

pytestmark = pytest.mark.anyio

NS = "app/1/kernels"


class Clock:
    """The wall clock provenance and recency read, set by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock(1_000_000.0)
    monkeypatch.setattr(storage_module, "_clock", clock)
    return clock


async def fill(env: Environment, clock: Clock, names: list[bytes], namespace: str = NS) -> None:
    """Each entry 100 bytes (key plus value), written one second apart."""
    for name in names:
        await env.storage(namespace).insert(name, b"v" * (100 - len(name)))
        clock.now += 1


async def keys(env: Environment, namespace: str = NS) -> set[bytes]:
    return {k async for k, _ in env.storage(namespace).scan()}


async def test_gc_to_a_size_evicts_never_hit_entries_first_then_the_least_recently_hit(
    any_env: Environment, clock: Clock
) -> None:
    await fill(any_env, clock, [b"e0", b"e1", b"e2", b"e3", b"e4", b"e5"])
    clock.now += 600
    assert await any_env.touch(NS, [b"e1"]) == 1
    clock.now += 600
    assert await any_env.touch(NS, [b"e0"]) == 1
    clock.now += 600
    assert await any_env.touch(NS, [b"e3"]) == 1
    # 600 bytes: the never-hit e2, e4, e5 go first (oldest written first).
    assert await any_env.gc(max_bytes=350) == Purged(3)
    assert await keys(any_env) == {b"e0", b"e1", b"e3"}
    # Then the least recently hit.
    assert await any_env.gc(max_bytes=200) == Purged(1)
    assert await keys(any_env) == {b"e0", b"e3"}
    assert await any_env.gc(max_bytes=200) == Purged(0)
    assert sum(s.bytes for s in await any_env.namespaces()) == 200


async def test_eviction_stops_as_soon_as_the_entries_fit(
    any_env: Environment, clock: Clock
) -> None:
    await fill(any_env, clock, [b"a", b"b", b"c", b"d"])
    assert await any_env.gc(max_bytes=301) == Purged(1)
    assert await keys(any_env) == {b"b", b"c", b"d"}
    assert await any_env.gc(max_bytes=0) == Purged(3)
    assert await any_env.namespaces() == []


async def test_a_bound_met_exactly_evicts_nothing_more(any_env: Environment, clock: Clock) -> None:
    await fill(any_env, clock, [b"a", b"b", b"c", b"d"])  # 400 bytes
    assert await any_env.gc(max_bytes=400) == Purged(0)
    assert await any_env.gc(max_bytes=300) == Purged(1)  # exactly what is left after one
    assert await keys(any_env) == {b"b", b"c", b"d"}
    assert await any_env.gc(max_bytes=199) == Purged(2)  # one byte short of keeping two
    assert await keys(any_env) == {b"d"}
    assert await any_env.gc(max_bytes=10**12) == Purged(0)


async def test_recency_is_written_at_most_once_a_minute_per_entry(
    any_env: Environment, clock: Clock
) -> None:
    clock.now = 6_000_000.0  # a whole minute
    await fill(any_env, clock, [b"a", b"b"])
    assert await any_env.touch(NS, [b"a", b"b", b"missing"]) == 2
    clock.now += 30
    assert await any_env.touch(NS, [b"a", b"b"]) == 0
    clock.now += 60
    assert await any_env.storage(NS).touch([b"a"]) == 1  # the storage's own door
    assert await any_env.storage(NS).touch([]) == 0


async def test_gc_older_than_drops_entries_neither_written_nor_hit_for_that_long(
    any_env: Environment, clock: Clock
) -> None:
    await fill(any_env, clock, [b"old", b"old-but-hit"])
    clock.now += 10_000
    await fill(any_env, clock, [b"new"])
    clock.now += 5_000
    await any_env.touch(NS, [b"old-but-hit"])
    clock.now += 5_000
    assert await any_env.gc(older_than=timedelta(seconds=15_000)) == Purged(1)
    assert await keys(any_env) == {b"old-but-hit", b"new"}
    assert await any_env.gc(older_than=1.0) == Purged(2)


async def test_gc_keep_versions_keeps_the_newest_written_versions_per_name_and_path(
    any_env: Environment, clock: Clock
) -> None:
    await fill(any_env, clock, [b"k"], "app/1/kernels")
    await fill(any_env, clock, [b"k"], "app/1/configs")
    await fill(any_env, clock, [b"k"], "app/2/kernels")
    await fill(any_env, clock, [b"k"], "app/3/kernels")
    await fill(any_env, clock, [b"k"], "other/1/kernels")
    assert await any_env.gc(keep_versions=2) == Purged(1)
    assert [s.namespace for s in await any_env.namespaces()] == [
        "app/1/configs",
        "app/2/kernels",
        "app/3/kernels",
        "other/1/kernels",
    ]
    assert await any_env.gc(keep_versions=1) == Purged(1)


async def test_gc_refuses_nonsense_bounds(any_env: Environment) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        await any_env.gc(max_bytes=-1)
    with pytest.raises(ValueError, match="keep_versions"):
        await any_env.gc(keep_versions=0)
    with pytest.raises(ValueError, match="older_than"):
        await any_env.gc(older_than="a week")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes"):
        async with open_environment("bad", max_bytes=-5):
            pass


async def test_max_bytes_is_enforced_on_close_keeping_the_recently_hit(
    root: Path, clock: Clock
) -> None:
    async with open_environment("bounded", root=root, max_bytes=1_000) as env:
        assert env.max_bytes == 1_000
        names = [b"%03d" % i for i in range(30)]
        await fill(env, clock, names)
        clock.now += 120
        await env.touch(NS, names[:5])
        assert sum(s.bytes for s in await env.namespaces()) == 3_000  # not before close
    async with open_environment("bounded", root=root) as env:
        left = await keys(env)
        assert len(left) == 10
        assert set(names[:5]) <= left


async def test_gc_without_a_bound_uses_the_environments_own(root: Path, clock: Clock) -> None:
    async with open_environment("bounded", root=root, max_bytes=500) as env:
        await fill(env, clock, [b"%02d" % i for i in range(8)])
        assert await env.gc() == Purged(3)
        assert await env.gc(max_bytes=100) == Purged(4)


async def test_vacuum_gives_the_space_of_purged_entries_back(env: Environment) -> None:
    storage = env.storage(NS)
    await storage.insert_many((b"%05d" % i, b"x" * 4096) for i in range(1_000))
    await storage.purge()
    before, after = await env.vacuum()
    assert before > 4_000_000
    assert after < 200_000
    assert after == env.path.stat().st_size + (
        Path(f"{env.path}-wal").stat().st_size if Path(f"{env.path}-wal").exists() else 0
    )


async def test_an_environment_in_memory_vacuums_to_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(WarmenvWarning, match="in memory"):
        async with open_environment("s", root=blocker / "sub") as env:
            assert env.in_memory
            assert await env.vacuum() == (0, 0)


async def test_entries_from_before_the_upgrade_age_from_the_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    conn.execute(
        "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, "
        "value BLOB NOT NULL, origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))"
    )
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.execute("INSERT INTO entries VALUES ('app/1/kernels', x'01', x'02', 0)")
    conn.close()
    async with open_environment(file=path) as env:
        assert await env.gc(older_than=3600) == Purged(0)
        assert await env.gc(older_than=0) == Purged(1)


async def test_vacuum_of_a_read_only_environment_says_where_to_run_it(tmp_path: Path) -> None:
    from warmenv import WarmenvError
    from warmenv.bundle import export_bundle

    async with open_environment(file=tmp_path / "src.db") as source:
        await source.storage(NS).insert(b"k", b"v")
        await export_bundle(source, tmp_path / "b.bundle", name="b", version="1", format="sqlite")
    async with open_environment(file=tmp_path / "b.bundle") as env:
        assert env.read_only
        with pytest.raises(WarmenvError, match="read-only; vacuum it where it is writable"):
            await env.vacuum()
