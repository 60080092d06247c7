"""Provenance per entry (origin, written_at, cost, bundle) and quarantine by bundle."""

from __future__ import annotations

import math
import sqlite3
import struct
import time
from pathlib import Path

import pytest

from helpers import one_trial
from hostile import reseal_flat, reseal_sqlite, set_carried
from test_cli_stats import _AMBIGUOUS_PURGE
from warmenv import Environment, Namespace, Store, WarmenvError, open_environment
from warmenv.bundle import export_bundle, import_bundle
from warmenv.persistence import Origin, Purged, Storage
from warmenv.persistence.storage import BundleRef, EntryInfo

pytestmark = pytest.mark.anyio

A = BundleRef("H100 Linux", "blake2b-256:" + "a" * 64)
B = BundleRef("A100 Linux", "blake2b-256:" + "b" * 64)
NS = "app/1/kernels"


async def test_a_local_insert_records_when_and_its_cost(storage: Storage) -> None:
    before = time.time()
    await storage.insert(b"timed", b"v", cost=1.5)
    await storage.insert(b"untimed", b"v")
    after = time.time()
    timed = await storage.info(b"timed")
    assert timed is not None
    assert timed.origin == Origin.LOCAL and timed.cost == 1.5 and timed.bundle is None
    assert timed.written_at is not None and before <= timed.written_at <= after
    untimed = await storage.info(b"untimed")
    assert untimed is not None and untimed.cost is None


async def test_a_missing_key_has_no_info(storage: Storage) -> None:
    assert await storage.info(b"nope") is None


async def test_insert_many_records_the_cost_and_the_bundle(storage: Storage) -> None:
    await storage.insert_many([(b"a", b"1"), (b"b", b"2")], cost=0.25)
    await storage.insert_many([(b"c", b"3")], Origin.IMPORTED, bundle=A)
    info_a = await storage.info(b"a")
    assert info_a is not None and (info_a.origin, info_a.cost, info_a.bundle) == (
        Origin.LOCAL,
        0.25,
        None,
    )
    info_c = await storage.info(b"c")
    assert info_c is not None and (info_c.origin, info_c.bundle) == (Origin.IMPORTED, A)


async def test_a_local_value_replacing_an_imported_one_drops_the_bundle(storage: Storage) -> None:
    await storage.insert_many([(b"k", b"stale")], Origin.IMPORTED, bundle=A)
    await storage.insert(b"k", b"fresh", cost=3.0)
    assert await storage.info(b"k") == EntryInfo(
        origin=Origin.LOCAL,
        written_at=(await storage.info(b"k")).written_at,  # type: ignore[union-attr]
        cost=3.0,
        bundle=None,
    )


async def test_a_conflicting_import_keeps_the_local_provenance(storage: Storage) -> None:
    await storage.insert(b"k", b"local", cost=1.0)
    await storage.insert_many([(b"k", b"imported")], Origin.IMPORTED, bundle=A)
    info = await storage.info(b"k")
    assert info is not None and (info.origin, info.cost, info.bundle) == (Origin.LOCAL, 1.0, None)


async def test_a_bundle_for_a_local_value_or_a_negative_cost_is_refused(storage: Storage) -> None:
    with pytest.raises(ValueError, match="only IMPORTED"):
        await storage.insert_many([(b"k", b"v")], Origin.LOCAL, bundle=A)
    with pytest.raises(ValueError, match="cost"):
        await storage.insert(b"k", b"v", cost=-1.0)
    assert await storage.get(b"k") is None


@pytest.mark.parametrize("cost", [math.inf, math.nan, -math.inf])
async def test_a_cost_that_is_not_a_finite_duration_is_refused(
    storage: Storage, cost: float
) -> None:
    # An infinite cost once went in, then `warmenv stats` printed "saved inf h" and
    # its --json wrote `Infinity`, which is not JSON.
    with pytest.raises(ValueError, match="finite"):
        await storage.insert(b"k", b"v", cost=cost)
    assert await storage.get(b"k") is None


# --- environments: bulk copy and quarantine ------------------------------------------


async def test_purge_bundle_removes_only_that_bundles_still_imported_entries(
    any_env: Environment,
) -> None:
    storage = any_env.storage(NS)
    other = any_env.storage("app/1/configs")
    await storage.insert_many(
        [(b"a1", b"x"), (b"a2", b"x"), (b"shared", b"x")], Origin.IMPORTED, bundle=A
    )
    await other.insert_many([(b"a3", b"x")], Origin.IMPORTED, bundle=A)
    await storage.insert_many([(b"b1", b"y")], Origin.IMPORTED, bundle=B)
    await storage.insert(b"shared", b"computed here")  # replaces A's value
    await storage.insert(b"mine", b"local")
    assert await any_env.purge_bundle(A.digest) == Purged(3)
    assert await storage.get_many([b"a1", b"a2", b"shared", b"b1", b"mine"]) == {
        b"shared": b"computed here",
        b"b1": b"y",
        b"mine": b"local",
    }
    assert await other.get(b"a3") is None
    assert await any_env.purge_bundle(A.digest) == Purged(0)


async def test_purge_bundle_accepts_the_name_or_the_bare_digest(any_env: Environment) -> None:
    storage = any_env.storage(NS)
    await storage.insert_many([(b"a", b"x")], Origin.IMPORTED, bundle=A)
    await storage.insert_many([(b"b", b"y")], Origin.IMPORTED, bundle=B)
    assert await any_env.purge_bundle("H100 Linux") == Purged(1)
    assert await any_env.purge_bundle("b" * 64) == Purged(1)
    assert await any_env.purge_bundle("no such bundle") == Purged(0)
    with pytest.raises(ValueError, match="digest or name"):
        await any_env.purge_bundle("")


async def test_a_name_two_bundles_share_is_refused_listing_their_digests(
    any_env: Environment,
) -> None:
    with one_trial(*_AMBIGUOUS_PURGE):
        rebuilt = BundleRef(A.name, "blake2b-256:" + "c" * 64)  # the same name, other contents
        storage = any_env.storage(NS)
        await storage.insert_many([(b"a", b"x")], Origin.IMPORTED, bundle=A)
        await storage.insert_many([(b"c", b"y")], Origin.IMPORTED, bundle=rebuilt)
        with pytest.raises(WarmenvError, match="names 2 bundles") as refused:
            await any_env.purge_bundle(A.name)
        assert A.digest in str(refused.value) and rebuilt.digest in str(refused.value)
        assert await storage.get_many([b"a", b"c"]) == {b"a": b"x", b"c": b"y"}  # nothing deleted
        assert await any_env.purge_bundle(rebuilt.digest) == Purged(1)
        assert await any_env.purge_bundle(A.name) == Purged(1)  # one bundle of that name now


async def test_a_bulk_copy_records_the_bundle_and_purge_bundle_takes_it_back(
    tmp_path: Path,
) -> None:
    async with open_environment("src", root=tmp_path) as source:
        await source.storage(NS).insert_many([(b"k1", b"v1"), (b"k2", b"v2")])
        written = await source.storage(NS).info(b"k1")
        assert written is not None and written.written_at is not None
        bundle_file = tmp_path / "b.bundle"
        await export_bundle(source, bundle_file, name="b", version="1", format="sqlite")
    ref = BundleRef("b", "blake2b-256:" + "c" * 64)
    async with open_environment("dst", root=tmp_path) as env:
        await env.storage(NS).insert(b"k2", b"local")
        copier = env.bulk_copy(bundle_file, None, 1, bundle=ref)
        assert copier is not None
        imported = [c for batch in [b async for b in copier] for _, c, _ in batch.imported]
        assert sum(imported) == 1
        info = await env.storage(NS).info(b"k1")
        assert info is not None and (info.origin, info.cost, info.bundle) == (
            Origin.IMPORTED,
            None,
            ref,
        )
        # The bundle (format 2) carries when the entry was written on the source.
        assert info.written_at == written.written_at
        assert await env.purge_bundle(ref.digest) == Purged(1)
        assert await env.storage(NS).get_many([b"k1", b"k2"]) == {b"k2": b"local"}


async def test_a_bulk_copy_keeps_the_written_at_and_cost_a_source_carries(tmp_path: Path) -> None:
    source = tmp_path / "carrying.db"
    conn = sqlite3.connect(source)
    conn.execute(
        "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, written_at REAL, cost REAL, PRIMARY KEY (namespace, key))"
    )
    conn.execute(f"INSERT INTO entries VALUES ('{NS}', x'01', x'02', 1, 1234.5, 6.5)")
    conn.execute(f"INSERT INTO entries VALUES ('{NS}', x'03', x'04', 1, NULL, NULL)")
    conn.commit()
    conn.close()
    async with open_environment("dst", root=tmp_path) as env:
        copier = env.bulk_copy(source, None, 10, bundle=A)
        assert copier is not None
        assert len([batch async for batch in copier]) == 1
        carried = await env.storage(NS).info(b"\x01")
        assert carried == EntryInfo(Origin.IMPORTED, 1234.5, 6.5, A)
        plain = await env.storage(NS).info(b"\x03")
        # Unknown stays unknown: never re-dated to the import (a ttl would count it fresh).
        assert plain == EntryInfo(Origin.IMPORTED, None, None, A)


@pytest.mark.parametrize("format", ["sqlite", "flat"])
async def test_an_import_records_its_bundle_and_purge_bundle_removes_only_its_entries(
    tmp_path: Path, format: str
) -> None:
    from warmenv.bundle import export_bundle, import_bundle

    ns = Namespace("app", "kernels", "1")
    async with open_environment("ci", root=tmp_path / "ci") as ci:
        await ci.storage(ns).insert_many([(b"a", b"1"), (b"b", b"2")])
    bundle = tmp_path / "b.bundle"
    report = await export_bundle(ci.path, bundle, name="H100 Linux", version="1", format=format)
    async with open_environment("app", root=tmp_path / "app") as env:
        await import_bundle(bundle, env)
        info = await env.storage(ns).info(b"a")
        assert info is not None and info.bundle is not None
        assert (info.bundle.name, info.bundle.digest) == ("H100 Linux", report.manifest.digest)
        await env.storage(ns).insert(b"b", b"local")  # a local value replaces the imported one
        purged = await env.purge_bundle("H100 Linux")
        assert isinstance(purged, Purged) and purged.count == 1
        assert await env.storage(ns).get(b"a") is None
        assert await env.storage(ns).get(b"b") == b"local"


WEEK = 7 * 86400.0


@pytest.mark.parametrize("format", ["flat", "sqlite"])
@pytest.mark.parametrize(
    ("cost", "believed"),
    [(WEEK - 1, WEEK - 1), (WEEK, None), (30 * 86400.0, None), (2.0**32 - 1, None)],
)
async def test_a_carried_cost_of_a_week_or_more_is_unknown_and_a_hit_saves_nothing(
    tmp_path: Path, format: str, cost: float, believed: float | None, any_env: Environment
) -> None:
    # Every hit counts the entry's cost as saved: a hostile bundle claiming
    # years a hit would make "seconds saved" meaningless.
    async with open_environment("ci", root=tmp_path / "ci") as ci:
        await ci.storage(NS).insert(b'"k"', b"1", cost=1.0)
    bundle = tmp_path / f"b.{format}"
    await export_bundle(ci.path, bundle, name="H100 Linux", version="1", format=format)
    if format == "flat":
        raw = struct.pack("<d", cost)
        bundle.write_bytes(reseal_flat(set_carried(bundle.read_bytes(), 0, "cost", raw)))
    else:
        conn = sqlite3.connect(bundle)
        with conn:
            conn.execute("UPDATE entries SET cost = ?", (cost,))
            reseal_sqlite(conn)
        conn.close()
    assert (await import_bundle(bundle, any_env)).imported == 1
    info = await any_env.storage(NS).info(b'"k"')
    assert info is not None and info.origin == Origin.IMPORTED and info.cost == believed
    store: Store[str, int] = await any_env.store(NS)
    assert await store.get("k") == 1
    stats = await any_env.statistics()
    (kernels,) = stats.namespaces
    (imported,) = stats.bundles
    assert kernels.hits_by_origin == {Origin.IMPORTED: 1}
    assert kernels.saved_seconds == imported.saved_seconds == (believed or 0.0)


@pytest.mark.parametrize("format", ["flat", "sqlite"])
async def test_a_local_cost_of_a_week_or_more_is_kept_but_exported_as_unknown(
    tmp_path: Path, format: str
) -> None:
    async with open_environment("ci", root=tmp_path / "ci") as ci:
        await ci.storage(NS).insert(b'"k"', b"1", cost=WEEK)
        kept = await ci.storage(NS).info(b'"k"')
    assert kept is not None and kept.cost == WEEK  # measured here: believed here
    bundle = tmp_path / f"b.{format}"
    await export_bundle(ci.path, bundle, name="H100 Linux", version="1", format=format)
    async with open_environment("app", root=tmp_path / "app") as env:
        await import_bundle(bundle, env)
        info = await env.storage(NS).info(b'"k"')
    assert info is not None and info.cost is None
