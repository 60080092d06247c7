"""A store's time-to-live (`ttl=`): entries older than it are misses, recomputed and replaced.

The clock is the one every write and the ttl read (`storage.wall_clock`),
moved by the test instead of slept on; old entries are also made the way a
user gets them, through the real file (a row's `written_at`) and through a
real bundle whose entries carry their original write time.
"""

from __future__ import annotations

import datetime
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from redis_server import RedisServer, tolerating_coredis_streams
from warmenv import Namespace, open_environment
from warmenv.blocking import open_environment as open_blocking
from warmenv.bundle import export_bundle, import_bundle
from warmenv.persistence import CacheMode, Purged, Storage, Store
from warmenv.persistence import storage as storage_module
from warmenv.persistence.codec import JsonCodec
from warmenv.persistence.storage import EntryInfo

pytestmark = pytest.mark.anyio

NS = Namespace("app", "kernels", version="1")
HOUR = 3600.0


class Clock:
    """The wall clock, moved by hand."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    moved = Clock()
    monkeypatch.setattr(storage_module, "_clock", moved)
    yield moved


class Computes:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, value: int) -> int:
        self.calls += 1
        return value


def age_in_file(path: Path, seconds: float) -> None:
    """Make every entry of the environment file `seconds` old, as a row written then is."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE entries SET written_at = ?", (time.time() - seconds,))
    conn.close()


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_an_entry_is_a_hit_within_its_ttl_and_recomputed_after(
    storage: Storage, clock: Clock, mode: CacheMode
) -> None:
    store: Store[str, int] = await Store.open(storage, mode=mode, ttl=HOUR)
    compute = Computes()
    assert await store.get_or_compute("k", compute, 1) == 1
    clock.now += HOUR  # exactly ttl old: still fresh
    assert await store.get_or_compute("k", compute, 2) == 1
    assert compute.calls == 1

    clock.now += 1
    assert await store.get("k") is None  # older than ttl: a miss, held or stored
    assert await store.get_or_compute("k", compute, 2) == 2
    assert compute.calls == 2
    # The recomputed value replaced the old one (local over local) and is fresh.
    assert await storage.get(b'"k"') == b"2"
    info = await storage.info(b'"k"')
    assert info is not None and info.written_at == clock.now
    reopened: Store[str, int] = await Store.open(storage, mode=mode, ttl=HOUR)
    assert await reopened.get_or_compute("k", compute, 3) == 2
    assert compute.calls == 2


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_an_old_row_in_the_file_is_a_miss_only_for_a_store_with_a_ttl(
    root: Path, mode: CacheMode
) -> None:
    async with open_environment("test", root=root) as env:
        await (await env.store(NS)).insert("old", 1)
        path = env.path
    age_in_file(path, 2 * HOUR)
    async with open_environment("test", root=root) as env:
        fresh_only: Store[str, int] = await env.store(NS, mode=mode, ttl=HOUR)
        assert len(fresh_only) == 0
        assert await fresh_only.get("old") is None
        assert await fresh_only.get_many(["old"]) == {}
        assert await (await env.store(NS, mode=mode)).get("old") == 1  # no ttl: a hit
        assert (
            await (await env.store(NS, mode=mode, ttl=datetime.timedelta(hours=3))).get("old") == 1
        )
        compute = Computes()
        assert await fresh_only.get_or_compute("old", compute, 5) == 5
        assert compute.calls == 1
    async with open_environment("test", root=root) as env:
        assert await (await env.store(NS, mode=mode, ttl=HOUR)).get("old") == 5


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_len_counts_an_expired_value_held_in_memory_until_it_is_looked_up(
    storage: Storage, clock: Clock, mode: CacheMode
) -> None:
    # Decided and documented (docs/storage.md): len() is the values held in memory,
    # and never reads the clock; the lookup that finds one expired forgets it.
    store: Store[str, int] = await Store.open(storage, mode=mode, ttl=HOUR)
    await store.insert("old", 1)
    clock.now += 2 * HOUR
    await store.insert("new", 2)
    assert len(store) == 2  # "old" is past its ttl, still held
    assert await store.get("old") is None
    assert len(store) == 1
    assert await store.get("new") == 2


async def test_get_many_leaves_out_only_the_expired_entries(storage: Storage, clock: Clock) -> None:
    writer: Store[str, int] = await Store.open(storage)
    await writer.insert("old", 1)
    clock.now += 2 * HOUR
    await writer.insert("new", 2)
    store: Store[str, int] = await Store.open(storage, mode=CacheMode.LAZY, ttl=HOUR)
    assert await store.get_many(["old", "new", "absent"]) == {"new": 2}


@pytest.mark.parametrize("format", ["sqlite", "flat"])
async def test_an_imported_entry_keeps_its_original_write_time(
    tmp_path: Path, clock: Clock, format: str
) -> None:
    async with open_environment(file=tmp_path / "ci.db") as ci:
        await (await ci.store(NS)).insert("k", 1)  # written at the CI run's time
    bundle = tmp_path / "b.bundle"
    await export_bundle(tmp_path / "ci.db", bundle, name="ci", version="1", format=format)
    clock.now += 2 * HOUR  # the bundle is imported two hours later
    async with open_environment(file=tmp_path / "app.db") as app:
        report = await import_bundle(bundle, app)
        assert report.imported == 1
        assert await (await app.store(NS, ttl=HOUR)).get("k") is None
        assert await (await app.store(NS, ttl=3 * HOUR)).get("k") == 1


def test_the_blocking_face_recomputes_an_expired_entry(root: Path, clock: Clock) -> None:
    calls: list[int] = []

    def compute(value: int) -> int:
        calls.append(value)
        return value

    with open_blocking("test", root=root) as env:
        store = env.store(NS, ttl=HOUR)
        assert store.ttl == HOUR
        assert store.get_or_compute("k", compute, 1) == 1
        assert store.get_or_compute("k", compute, 2) == 1
        clock.now += HOUR + 1
        assert store.get("k") is None
        assert store.get_or_compute("k", compute, 3) == 3
        # A second face over the same file reads the row on its own thread
        # without a ttl, but judges it by its age with one.
        assert env.store(NS, mode=CacheMode.LAZY, ttl=HOUR).get("k") == 3
    assert calls == [1, 3]


def test_an_old_row_is_a_miss_for_the_blocking_face_reading_on_its_thread(root: Path) -> None:
    with open_blocking("test", root=root) as env:
        env.store(NS).insert("old", 1)
        path = env.path
    age_in_file(path, 2 * HOUR)
    with open_blocking("test", root=root) as env:
        assert env.store(NS, mode=CacheMode.LAZY).get("old") == 1
        assert env.store(NS, mode=CacheMode.LAZY, ttl=HOUR).get("old") is None


async def test_a_store_without_a_ttl_keeps_the_plain_hit_path(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: Store[str, int] = await Store.open(storage)
    await store.insert("k", 1)
    assert store.ttl is None
    assert store.hit_path == store.held.hit
    reads: list[float] = []

    def read() -> float:
        reads.append(time.time())
        return reads[-1]

    monkeypatch.setattr(storage_module, "_clock", read)
    assert await store.get("k") == 1
    assert reads == []  # no deadline check on the hot path
    timed: Store[str, int] = await Store.open(storage, ttl=HOUR)
    assert await timed.get("k") == 1  # held now (EAGER), with its deadline
    reads.clear()
    assert await timed.get("k") == 1
    assert len(reads) == 1  # a store with a ttl checks it on each hit


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_every_kind_of_key_expires_by_the_same_rule(
    storage: Storage, clock: Clock, mode: CacheMode
) -> None:
    # What a value is held under differs by key (a JSON store's str key as it is,
    # any other key encoded, a memoized call's arguments as their encoding): the
    # deadline is looked up under the same, for every one of them.
    store: Store[Any, Any] = await Store.open(storage, mode=mode, ttl=HOUR)
    calls: list[int] = []

    @store.memoize
    async def square(x: int) -> int:
        calls.append(x)
        return x * x

    @store.memoize(key=lambda x: ("cube", x))
    async def cube(x: int) -> int:
        calls.append(x)
        return x * x * x

    keys: list[Any] = ["text", 7, ("a", 1), None]
    for i, key in enumerate(keys):
        await store.insert(key, i)
    assert (await square(3), await cube(2)) == (9, 8)
    clock.now += HOUR  # exactly ttl old: every one still a hit
    assert [await store.get(key) for key in keys] == [0, 1, 2, 3]
    assert (await square(3), await cube(2)) == (9, 8)
    assert calls == [3, 2]

    clock.now += 1
    assert [await store.get(key, "expired") for key in keys] == ["expired"] * 4
    assert (await square(3), await cube(2)) == (9, 8)
    assert calls == [3, 2, 3, 2]  # recomputed, each once
    assert (await square(3), await cube(2)) == (9, 8)
    assert calls == [3, 2, 3, 2]


@pytest.mark.parametrize(
    ("ttl", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (datetime.timedelta(seconds=-5), ValueError),
        ("60", TypeError),  # a value of the wrong type is TypeError, as for version=
        (True, TypeError),
    ],
)
async def test_a_ttl_that_is_not_a_positive_duration_is_refused(
    storage: Storage, ttl: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=r"^ttl is seconds .* got ") as raised:
        await Store.open(storage, ttl=ttl)  # type: ignore[call-overload]
    assert type(raised.value) is error and "\n" not in str(raised.value)


class OwnStorage(Storage):
    """A storage written outside warmenv, over a real one: each read it implements, passed on."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner

    @property
    def namespace(self) -> str:
        return self.inner.namespace

    def describe(self) -> str:
        return f"own storage over {self.inner.describe()}"

    async def get(self, key: bytes) -> bytes | None:
        return await self.inner.get(key)

    async def info(self, key: bytes) -> EntryInfo | None:
        return await self.inner.info(key)


class OwnStorageWithDated(OwnStorage):
    async def dated(self, keys: Iterable[bytes]) -> dict[bytes, tuple[bytes, float | None]]:
        return await self.inner.dated(keys)


async def test_a_ttl_over_a_storage_without_dated_is_refused_at_the_open(
    storage: Storage, clock: Clock
) -> None:
    # Value and time in one read is the ttl's contract; `info` then `get` could pair a
    # replaced entry's time with another's value, so there is no two-read default.
    await (await Store.open(storage)).insert("k", 1)
    lacking = OwnStorage(storage)  # type: ignore[abstract]  # the mistake under test
    with pytest.raises(TypeError, match=r"^OwnStorage does not implement Storage\.dated") as raised:
        await Store.open(lacking, mode=CacheMode.LAZY, ttl=HOUR)
    assert "\n" not in str(raised.value)
    await Store.open(lacking, mode=CacheMode.LAZY)  # without a ttl it is never read
    store: Store[str, int] = await Store.open(
        OwnStorageWithDated(storage),  # type: ignore[abstract]  # only what a LAZY get reads
        mode=CacheMode.LAZY,
        ttl=HOUR,
    )
    assert await store.get("k") == 1


@tolerating_coredis_streams
async def test_a_fetched_value_past_the_ttl_is_computed_by_each_host(
    tmp_path: Path, clock: Clock, server: RedisServer
) -> None:
    compute = Computes()
    async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
        assert await (await a.store(NS)).get_or_compute("k", compute, 1) == 1
    clock.now += 2 * HOUR  # the fleet's copy in Redis is two hours old now
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
        assert await (await b.store(NS, ttl=3 * HOUR)).get("k") == 1  # fetched, fresh enough
    async with open_environment("fleet", root=tmp_path / "c", remote=server.url) as c:
        store: Store[str, int] = await c.store(NS, ttl=HOUR)
        assert await store.get("k") is None  # fetched with its write time: too old
        assert await store.get_or_compute("k", compute, 2) == 2
        assert await store.get_or_compute("k", compute, 3) == 2  # fresh here now
    assert compute.calls == 2
    # The shared copy is the first writer's still: a new host without a ttl gets it.
    async with open_environment("fleet", root=tmp_path / "d", remote=server.url) as d:
        assert await (await d.store(NS)).get("k") == 1


@pytest.mark.parametrize("mode", list(CacheMode))
async def test_the_deadlines_leave_memory_with_their_values(
    storage: Storage, clock: Clock, mode: CacheMode
) -> None:
    bound = 4
    filler: Store[str, int] = await Store.open(storage)
    for i in range(50):
        await filler.insert(f"stored{i}", i)
    store: Store[str, int] = await Store.open(storage, mode=mode, max_entries=bound, ttl=HOUR)
    compute = Computes()
    for i in range(50):  # computed, read one by one, read many at once, then dropped
        await store.get_or_compute(f"computed{i}", compute, i)
        await store.get(f"stored{i}")
        await store.get_many([f"stored{(i + 1) % 50}", f"stored{(i + 2) % 50}"])
        await store.purge_key(f"computed{i}")
        assert len(store._expiry) <= bound  # type: ignore[arg-type]  # bounded as the values are


class ReplacedAfterFirstRead:
    """A real storage whose row for `key` another writer replaces right after the first read."""

    def __init__(self, inner: Storage, key: bytes, value: bytes) -> None:
        self.inner, self.key, self.value, self.replaced = inner, key, value, False

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if name not in ("get", "get_many", "get_expecting_miss", "dated", "written"):
            return found

        async def read(*args: Any, **kwargs: Any) -> Any:
            answer = await found(*args, **kwargs)
            if not self.replaced:
                self.replaced = True
                await self.inner.replace(self.key, self.value)  # a new value, written now
            return answer

        return read


@pytest.mark.parametrize("many", [False, True])
async def test_a_value_is_judged_by_its_own_write_time_not_its_replacement_s(
    storage: Storage, clock: Clock, many: bool
) -> None:
    await (await Store.open(storage)).insert("k", 1)
    clock.now += 2 * HOUR  # 1 is expired when read; its replacement, 2, is not
    encoded = JsonCodec().encode_key("k")
    raced = ReplacedAfterFirstRead(storage, encoded, JsonCodec().encode_value(2))
    store: Store[str, int] = await Store.open(cast(Storage, raced), ttl=HOUR)
    first = (await store.get_many(["k"])).get("k") if many else await store.get("k")
    assert raced.replaced
    assert first is None  # the old value with the new time would have been a hit on 1
    assert await store.get("k") == 2


# Only a write time warmenv can believe makes an entry fresh: one unknown, NaN,
# infinite or after now is a miss under a ttl, whichever way the entry came.
YEAR = 365 * 86400.0
AHEAD = {"a year ahead": YEAR, "a minute ahead": 60.0}


@pytest.mark.parametrize("ahead", list(AHEAD))
@tolerating_coredis_streams
async def test_a_fetched_value_written_by_a_clock_ahead_is_never_fresh(
    tmp_path: Path, clock: Clock, server: RedisServer, ahead: str
) -> None:
    clock.now += AHEAD[ahead]  # host A's clock is ahead when it publishes
    async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
        await (await a.store(NS)).insert("k", 1)
    clock.now -= AHEAD[ahead]
    compute = Computes()
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
        store: Store[str, int] = await b.store(NS, ttl=HOUR)
        assert await store.get("k") is None  # fetched, its time unbelievable: a miss
        # Recorded here too, its time unknown, not the time it arrived.
        assert await (await b.store(NS, ttl=HOUR)).get("k") is None
        info = await b.storage(NS).info(JsonCodec().encode_key("k"))
        assert info is not None and info.written_at is None
        assert await store.get_or_compute("k", compute, 2) == 2
        clock.now += 2 * HOUR
        assert await store.get_or_compute("k", compute, 3) == 3  # its own deadline, not A's
    assert compute.calls == 2
    async with open_environment("fleet", root=tmp_path / "c", remote=server.url) as c:
        assert await (await c.store(NS)).get("k") == 1  # without a ttl, the value is used


@tolerating_coredis_streams
async def test_a_fetched_value_from_a_clock_a_second_ahead_is_fresh(
    tmp_path: Path, clock: Clock, server: RedisServer
) -> None:
    """A fleet's clocks differ a little (`carried.CLOCK_SKEW`): that is no reason to recompute."""
    clock.now += 1.0  # host A's clock is a second ahead when it publishes
    async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
        await (await a.store(NS)).insert("k", 1)
    clock.now -= 1.0
    compute = Computes()
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
        store: Store[str, int] = await b.store(NS, ttl=HOUR)
        assert await store.get_or_compute("k", compute, 2) == 1
        info = await b.storage(NS).info(JsonCodec().encode_key("k"))
        assert info is not None and info.written_at == clock.now  # believed, as now
        clock.now += 2 * HOUR
        assert await store.get_or_compute("k", compute, 3) == 3  # and it expires
    assert compute.calls == 1


UNBELIEVABLE_IN_FILE = {"in the future": time.time() + YEAR, "infinite": float("inf")}


@pytest.mark.parametrize("case", list(UNBELIEVABLE_IN_FILE))
async def test_a_row_of_the_file_dated_unbelievably_is_a_miss(
    tmp_path: Path, clock: Clock, case: str
) -> None:
    async with open_environment(file=tmp_path / "app.db") as app:
        await (await app.store(NS)).insert("k", 1)
    with sqlite3.connect(tmp_path / "app.db") as conn:
        conn.execute("UPDATE entries SET written_at = ?", (UNBELIEVABLE_IN_FILE[case],))
    conn.close()
    async with open_environment(file=tmp_path / "app.db") as app:
        for mode in CacheMode:
            assert await (await app.store(NS, mode=mode, ttl=HOUR)).get("k") is None
        assert await (await app.store(NS)).get("k") == 1


@pytest.mark.parametrize("format_version", [2, 1])
@pytest.mark.parametrize("format", ["sqlite", "flat"])
async def test_an_imported_entry_of_unbelievable_age_stays_a_miss(
    tmp_path: Path, clock: Clock, format: str, format_version: int
) -> None:
    codec = JsonCodec()
    async with open_environment(file=tmp_path / "ci.db") as ci:
        ci_store: Store[str, int] = await ci.store(NS)
        for value, key in enumerate(["unknown", "future", "old", "new"], 1):
            await ci_store.insert(key, value)
    with sqlite3.connect(tmp_path / "ci.db") as conn:
        for key, at in [
            ("unknown", None),
            ("future", clock.now + YEAR),
            ("old", clock.now - 86400),
        ]:
            conn.execute(
                "UPDATE entries SET written_at = ? WHERE key = ?", (at, codec.encode_key(key))
            )
    conn.close()
    bundle = tmp_path / "b.bundle"
    await export_bundle(
        tmp_path / "ci.db",
        bundle,
        name="ci",
        version="1",
        format=format,
        format_version=format_version,
    )
    clock.now += 60  # imported a minute later
    async with open_environment(file=tmp_path / "app.db") as app:
        assert (await import_bundle(bundle, app)).imported == 4
        fresh = {"new"} if format_version == 2 else set()  # format 1 carries no times
        for mode in CacheMode:
            store: Store[str, int] = await app.store(NS, mode=mode, ttl=HOUR)
            found = await store.get_many(["unknown", "future", "old", "new"])
            assert set(found) == fresh, mode
        clock.now += 2 * HOUR  # nothing was re-dated to the import: "new" expires too
        assert await (await app.store(NS, ttl=HOUR)).get_many(["new"]) == {}
        everything = await (await app.store(NS)).get_many(["unknown", "future", "old", "new"])
        assert everything == {"unknown": 1, "future": 2, "old": 3, "new": 4}  # no ttl: all kept
        for key in ("unknown", "future"):
            info = await app.storage(NS).info(codec.encode_key(key))
            assert info is not None and info.written_at is None, key


@pytest.mark.parametrize("format", ["sqlite", "flat"])
async def test_gc_ages_an_imported_entry_of_unknown_age_from_its_import(
    tmp_path: Path, clock: Clock, format: str
) -> None:
    async with open_environment(file=tmp_path / "ci.db") as ci:
        await (await ci.store(NS)).insert("k", 1)
    bundle = tmp_path / "b.bundle"
    await export_bundle(
        tmp_path / "ci.db", bundle, name="ci", version="1", format=format, format_version=1
    )
    clock.now += 30 * 86400  # a bundle carrying no write times, imported a month later
    async with open_environment(file=tmp_path / "app.db") as app:
        assert (await import_bundle(bundle, app)).imported == 1
        assert await (await app.store(NS, ttl=HOUR)).get("k") is None  # unknown: no ttl hit
        clock.now += HOUR
        assert await app.gc(older_than=datetime.timedelta(days=1)) == Purged(0)  # kept
        assert await (await app.store(NS)).get("k") == 1
        clock.now += 2 * 86400  # now neither imported nor hit for more than a day
        assert await app.gc(older_than=datetime.timedelta(days=1)) == Purged(1)
