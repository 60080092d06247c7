"""Bundle format 2: each entry carries its written_at and cost to the next machine.

A hit on an imported entry counts the seconds its computation took where it
was computed. Both formats carry the two values (SQLite columns, a flat
section), the digest covers them, readers of format 1 bundles keep working,
and values no reader would believe are recorded as unknown.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import time
from pathlib import Path

import pytest

from fuzz import sealed_digest, write_flat
from hostile import (
    HOSTILE_F64,
    entries_digest,
    flat_format_1,
    flat_sections,
    reseal_flat,
    reseal_sqlite,
    set_carried,
    sqlite_format_1,
    with_digest,
)
from warmenv import Environment, open_environment
from warmenv.bundle import (
    CorruptBundleError,
    NotABundleError,
    UnsupportedSchemaError,
    export_bundle,
    import_bundle,
    open_bundle,
)
from warmenv.bundle.sqlite.schema import COLUMNS
from warmenv.persistence import Origin
from warmenv.persistence.carried import (
    CLOCK_SKEW,
    COST_LIMIT,
    WRITTEN_AT_LIMIT,
    as_of,
    as_of_sql,
    believed,
    believed_sql,
    received_sql,
)
from warmenv.persistence.sqlite.schema import ENTRY_COLUMNS
from warmenv.persistence.store import Store

pytestmark = pytest.mark.anyio

NS = "app/1/kernels"
FORMATS = ["sqlite", "flat"]
MANIFEST = {
    "schema": 1,
    "name": "hand made",
    "version": "1",
    "created": "2026-01-01T00:00:00+00:00",
    "environments": [{"label": "l", "os": "linux", "arch": "x86_64", "devices": []}],
}


async def busy_square(n: int) -> int:
    """A computation that takes measurable time without sleeping: a fixed busy loop."""
    for _ in range(300_000):
        pass
    return n * n


async def computed_bundle(tmp_path: Path, format: str) -> tuple[Path, float, float]:
    """A bundle exported from environment A, where `k` was computed and timed:
    the path, the cost and the written_at A recorded."""
    async with open_environment("a", root=tmp_path / "a") as a:
        store: Store[str, int] = await a.store(NS)
        assert await store.get_or_compute("k", busy_square, 7) == 49
        info = await a.storage(NS).info(b'"k"')
        assert info is not None and info.cost is not None and info.written_at is not None
        out = tmp_path / f"a.{format}"
        await export_bundle(a, out, name="machine A", version="1", format=format)
    return out, info.cost, info.written_at


def format_1_flat(entries: dict[bytes, bytes]) -> bytes:
    """A flat bundle of format 1 (as 0.1 wrote them), built from the spec."""
    ordered = [(NS, k, v, None) for k, v in sorted(entries.items())]
    manifest = json.dumps(dict(MANIFEST, digest=entries_digest(ordered, 1))).encode()
    return write_flat({NS: entries}, manifest)


def format_1_sqlite(path: Path, entries: dict[bytes, bytes]) -> Path:
    """A SQLite bundle of format 1 (as 0.1 wrote them), built from the spec."""
    ordered = [(NS, k, v, None) for k, v in sorted(entries.items())]
    manifest = json.dumps(dict(MANIFEST, digest=entries_digest(ordered, 1)))
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    conn.execute(
        "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))"
    )
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('manifest', ?)", (manifest,))
    conn.executemany("INSERT INTO entries VALUES (?, ?, ?, 1)", [e[:3] for e in ordered])
    conn.commit()
    conn.close()
    return path


def format_1_bundle(tmp_path: Path, format: str, entries: dict[bytes, bytes]) -> Path:
    out = tmp_path / f"old.{format}"
    if format == "flat":
        out.write_bytes(format_1_flat(entries))
        return out
    return format_1_sqlite(out, entries)


# --- what a hit on an imported entry saved -------------------------------------------------


@pytest.mark.parametrize("format", FORMATS)
async def test_a_hit_on_an_imported_entry_saves_the_cost_recorded_where_it_was_computed(
    tmp_path: Path, format: str, any_env: Environment
) -> None:
    bundle, cost, _ = await computed_bundle(tmp_path, format)
    assert cost > 0
    async with open_bundle(bundle) as opened:
        digest = opened.manifest.digest
    await import_bundle(bundle, any_env)
    store: Store[str, int] = await any_env.store(NS)
    assert await store.get("k") == 49
    stats = await any_env.statistics()
    (kernels,) = stats.namespaces
    assert kernels.hits_by_origin == {Origin.IMPORTED: 1}
    assert kernels.computes == 0
    assert kernels.saved_seconds == pytest.approx(cost, rel=1e-12)
    (imported,) = stats.bundles
    assert (imported.name, imported.digest, imported.hits) == ("machine A", digest, 1)
    assert imported.saved_seconds == pytest.approx(cost, rel=1e-12)


@pytest.mark.parametrize("format", FORMATS)
async def test_an_imported_entry_keeps_the_written_at_and_cost_it_carries(
    tmp_path: Path, format: str, any_env: Environment
) -> None:
    bundle, cost, written_at = await computed_bundle(tmp_path, format)
    await import_bundle(bundle, any_env)
    info = await any_env.storage(NS).info(b'"k"')
    assert info is not None
    assert (info.origin, info.cost, info.written_at) == (Origin.IMPORTED, cost, written_at)


@pytest.mark.parametrize("format", FORMATS)
async def test_an_import_checked_entry_by_entry_keeps_what_entries_carry(
    tmp_path: Path, format: str
) -> None:
    """`validate` takes the scan path, also for a SQLite bundle into a SQLite environment."""
    bundle, cost, written_at = await computed_bundle(tmp_path, format)
    async with open_environment("b", root=tmp_path / "b") as env:
        report = await import_bundle(bundle, env, validate=lambda ns, k, v: True)
        assert report.imported == 1
        info = await env.storage(NS).info(b'"k"')
        assert info is not None and (info.cost, info.written_at) == (cost, written_at)


@pytest.mark.parametrize("format", FORMATS)
async def test_a_format_1_bundle_still_imports_with_its_cost_unknown(
    tmp_path: Path, format: str, any_env: Environment
) -> None:
    path = format_1_bundle(tmp_path, format, {b'"k"': b"49", b'"j"': b"4"})
    async with open_bundle(path) as bundle:
        assert bundle.format_version == 1
        await bundle.verify()
    report = await import_bundle(path, any_env)
    assert report.imported == 2
    info = await any_env.storage(NS).info(b'"k"')
    assert info is not None and info.bundle is not None
    assert (info.origin, info.cost, info.bundle.name) == (Origin.IMPORTED, None, "hand made")
    # Of unknown age, never re-dated to the import (a ttl counts it a miss; gc ages
    # it from its bundle's import): format 1 carries no write time.
    assert info.written_at is None
    store: Store[str, int] = await any_env.store(NS)
    assert await store.get("k") == 49
    (kernels,) = (await any_env.statistics()).namespaces
    assert kernels.hits_by_origin == {Origin.IMPORTED: 1}
    assert kernels.saved_seconds == 0


# --- what export writes --------------------------------------------------------------------


async def test_both_formats_carry_the_same_values_under_the_same_digest(tmp_path: Path) -> None:
    async with open_environment("a", root=tmp_path / "a") as a:
        await a.storage(NS).insert(b"timed", b"1", cost=1.25)
        await a.storage(NS).insert(b"untimed", b"2")
        digests = set()
        served = []
        for format in FORMATS:
            report = await export_bundle(a, tmp_path / format, name="n", version="1", format=format)
            digests.add(report.manifest.digest)
            async with open_bundle(tmp_path / format) as bundle:
                assert bundle.format_version == 2
                await bundle.verify()
                served.append([entry async for entry in bundle.scan_with_provenance(NS)])
    assert len(digests) == 1
    assert served[0] == served[1]
    (_, _, _, timed_cost), (_, _, untimed_written, untimed_cost) = served[0]
    assert (timed_cost, untimed_cost) == (1.25, None)
    assert untimed_written is not None


async def test_a_sqlite_bundle_of_format_2_has_the_two_columns_and_says_so(
    tmp_path: Path,
) -> None:
    async with open_environment("a", root=tmp_path / "a") as a:
        await a.storage(NS).insert(b"k", b"v", cost=0.5)
        await export_bundle(a, tmp_path / "b.sqlite", name="n", version="1")
    with sqlite3.connect(tmp_path / "b.sqlite") as conn:
        columns = [(r[1], r[2]) for r in conn.execute("PRAGMA table_info(entries)")]
        version = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()[0]
        row = conn.execute("SELECT cost, typeof(written_at) FROM entries").fetchone()
    assert (columns, version, row) == (COLUMNS[2], "2", (0.5, "real"))


@pytest.mark.parametrize("format", FORMATS)
async def test_several_sources_merge_with_what_their_entries_carry(
    tmp_path: Path, format: str
) -> None:
    """Two sources take the merging path of export (one SQLite source is copied in SQLite)."""
    paths = []
    for name, cost in (("first", 1.5), ("second", 2.5)):
        async with open_environment(name, root=tmp_path / name) as env:
            await env.storage(NS).insert(b"shared", name.encode(), cost=cost)
            await env.storage(NS).insert(name.encode(), b"own", cost=cost)
            paths.append(env.path)
    out = tmp_path / "merged"
    await export_bundle(paths, out, name="n", version="1", format=format)
    async with open_bundle(out) as bundle:
        await bundle.verify()
        carried = {k: (v, c) async for k, v, _, c in bundle.scan_with_provenance(NS)}
    assert carried == {
        b"first": (b"own", 1.5),
        b"second": (b"own", 2.5),
        b"shared": (b"first", 1.5),  # the first source wins, with what its entry carries
    }


@pytest.mark.parametrize("format", FORMATS)
async def test_a_cost_no_reader_would_believe_is_exported_as_unknown(
    tmp_path: Path, format: str
) -> None:
    async with open_environment("a", root=tmp_path / "a") as a:
        # The storage takes a finite cost of any size; readers believe one under COST_LIMIT.
        await a.storage(NS).insert(b"forever", b"v", cost=COST_LIMIT * 2)
        await export_bundle(a, tmp_path / "b", name="n", version="1", format=format)
    async with open_bundle(tmp_path / "b") as bundle:
        ((_, _, written_at, cost),) = [e async for e in bundle.scan_with_provenance(NS)]
    assert cost is None and written_at is not None


@pytest.mark.parametrize("format", FORMATS)
async def test_an_environment_of_schema_1_exports_entries_that_carry_nothing(
    tmp_path: Path, format: str
) -> None:
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        conn.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        conn.execute(
            "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB "
            "NOT NULL, origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))"
        )
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute("INSERT INTO entries VALUES (?, x'01', x'02', 0)", (NS,))
    await export_bundle(old, tmp_path / "b", name="n", version="1", format=format)
    async with open_bundle(tmp_path / "b") as bundle:
        await bundle.verify()
        entries = [e async for e in bundle.scan_with_provenance(NS)]
    assert entries == [(b"\x01", b"\x02", None, None)]


# --- the digest covers what entries carry ----------------------------------------------------


async def test_a_format_1_digest_is_the_digest_of_the_entries_alone(tmp_path: Path) -> None:
    """A known value: format 1 hashes exactly as before format 2 existed."""
    path = format_1_bundle(tmp_path, "flat", {b"k": b"v"})
    async with open_bundle(path) as bundle:
        digest = await bundle.compute_digest()
    assert digest == sealed_digest({NS: {b"k": b"v"}})
    # The value warmenv computed for this entry before format 2 existed.
    assert digest == "blake2b-256:" + (
        "1a54dc6cbe42eb97ce12bf6001a071ea0ad65747715b37a1adf93a59723a8c7d"
    )


async def test_a_changed_cost_in_a_flat_bundle_fails_the_digest(tmp_path: Path) -> None:
    bundle, _, _ = await computed_bundle(tmp_path, "flat")
    tampered = set_carried(bundle.read_bytes(), 0, "cost", struct.pack("<d", 3600.0))
    bundle.write_bytes(tampered)
    async with open_environment("b", root=tmp_path / "b") as env:
        with pytest.raises(CorruptBundleError, match="does not match its digest"):
            await import_bundle(bundle, env)
        assert await env.namespaces() == []


async def test_a_changed_cost_in_a_sqlite_bundle_fails_the_digest(tmp_path: Path) -> None:
    bundle, _, _ = await computed_bundle(tmp_path, "sqlite")
    with sqlite3.connect(bundle) as conn:
        conn.execute("UPDATE entries SET cost = 3600.0")
    async with open_environment("b", root=tmp_path / "b") as env:
        with pytest.raises(CorruptBundleError, match="does not match its digest"):
            await import_bundle(bundle, env)
        assert await env.namespaces() == []


@pytest.mark.parametrize("format", FORMATS)
async def test_a_format_2_bundle_passed_off_as_format_1_fails_the_digest(
    tmp_path: Path, format: str
) -> None:
    """Dropping what entries carry while keeping the manifest's digest is caught."""
    bundle, _, _ = await computed_bundle(tmp_path, format)
    async with open_bundle(bundle) as opened:
        digest = opened.manifest.digest
    if format == "flat":
        downgraded = with_digest(flat_format_1(bundle.read_bytes()), digest)
        bundle.write_bytes(downgraded)
    else:
        old = sqlite_format_1(bundle, tmp_path)
        with sqlite3.connect(old) as conn:
            conn.execute(
                "UPDATE meta SET v = json_set(v, '$.digest', ?) WHERE k = 'manifest'", (digest,)
            )
        bundle = old
    async with open_environment("b", root=tmp_path / "b") as env:
        with pytest.raises(CorruptBundleError, match="does not match its digest"):
            await import_bundle(bundle, env)


# --- hostile values: recorded as unknown, never believed ------------------------------------


@pytest.mark.parametrize("value", sorted(HOSTILE_F64))
@pytest.mark.parametrize("field", ["written_at", "cost"])
async def test_a_flat_bundle_carrying_a_value_out_of_range_imports_it_as_unknown(
    tmp_path: Path, field: str, value: str
) -> None:
    bundle, cost, written_at = await computed_bundle(tmp_path, "flat")
    bundle.write_bytes(reseal_flat(set_carried(bundle.read_bytes(), 0, field, HOSTILE_F64[value])))
    (raw,) = struct.unpack("<d", HOSTILE_F64[value])
    limit = WRITTEN_AT_LIMIT if field == "written_at" else COST_LIMIT
    believed = raw + 0.0 if 0 <= raw < limit else None
    async with open_environment("b", root=tmp_path / "b") as env:
        before = time.time()
        assert (await import_bundle(bundle, env)).imported == 1
        info = await env.storage(NS).info(b'"k"')
    assert info is not None
    if field == "cost":
        assert (info.cost, info.written_at) == (believed, written_at)
    else:
        assert info.cost == cost
        if believed is None or believed > before + CLOCK_SKEW:  # unknown or in the future
            assert info.written_at is None  # recorded as unknown, never as the import's time
        elif believed > before:  # a clock a little ahead: believed, as now
            assert info.written_at is not None and before <= info.written_at <= time.time()
        else:
            assert info.written_at == believed


@pytest.mark.parametrize("now", [1.7e9, WRITTEN_AT_LIMIT - CLOCK_SKEW / 2])
def test_the_copys_one_case_records_a_written_at_as_believed_then_as_of_do(now: float) -> None:
    # The bulk copy reads a carried written_at through one CASE (`received_sql`)
    # instead of `as_of_sql` over `believed_sql`: the same value for every kind of
    # column value a file can hold, the year-10000 edge included.
    numbers = [-1.0, -0.0, 0.0, 0, 1, 2.5, now - 1, now, now + 1, now + CLOCK_SKEW]
    numbers += [now + CLOCK_SKEW + 1e-3, now + 60, WRITTEN_AT_LIMIT - 1, WRITTEN_AT_LIMIT]
    numbers += [1e300, float("inf"), float("-inf"), 2**62]
    values: list[object] = [None, "text", "", b"", b"\x00", "1", *numbers]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (i INTEGER PRIMARY KEY, w)")
    conn.executemany("INSERT INTO t (w) VALUES (?)", [(v,) for v in values])
    one = received_sql("w", now)
    composed = as_of_sql(believed_sql("w", WRITTEN_AT_LIMIT), now)
    rows = conn.execute(f"SELECT w, {one}, {composed}, typeof({one}) FROM t ORDER BY i")
    for value, got, expected, kind in rows:
        assert got == expected == as_of(believed(value, WRITTEN_AT_LIMIT), now), value
        assert kind == ("null" if got is None else "real")


@pytest.mark.parametrize("format", ["flat", "sqlite"])
@pytest.mark.parametrize("ahead", [1.0, 60.0, 86400.0 * 365 * 1000])
async def test_an_entry_carrying_a_written_at_in_the_future_is_of_unknown_age(
    tmp_path: Path, format: str, ahead: float, any_env: Environment
) -> None:
    # A wrong clock, or a bundle made to look newest so that gc keeps its
    # version forever and evicts the live one (or a ttl serves it for ever):
    # recorded as unknown, never later than the import. A clock a little ahead
    # (at most `CLOCK_SKEW`) is a fleet's clock difference: believed, as now.
    bundle, cost, _ = await computed_bundle(tmp_path, format)
    future = time.time() + ahead
    if format == "flat":
        raw = struct.pack("<d", future)
        bundle.write_bytes(reseal_flat(set_carried(bundle.read_bytes(), 0, "written_at", raw)))
    else:
        with sqlite3.connect(bundle) as conn:
            conn.execute("UPDATE entries SET written_at = ?", (future,))
            reseal_sqlite(conn)
    before = time.time()
    assert (await import_bundle(bundle, any_env)).imported == 1
    after = time.time()
    info = await any_env.storage(NS).info(b'"k"')
    assert info is not None and info.cost == cost
    if ahead > CLOCK_SKEW:
        assert info.written_at is None
    else:  # its own time if that has come by the import, else the import's
        assert info.written_at is not None and min(future, before) <= info.written_at <= after


@pytest.mark.parametrize(
    ("sql", "believed"),
    [
        ("-1.0", None),
        ("9e999", None),
        ("-9e999", None),
        ("1e300", None),
        ("4294967296.0", None),
        ("4294967295.5", None),
        ("604800.0", None),  # a week: carried.COST_LIMIT
        ("604799.5", 604799.5),
        ("7", 7.0),
    ],
)
async def test_a_sqlite_bundle_carrying_a_cost_out_of_range_imports_it_as_unknown(
    tmp_path: Path, sql: str, believed: float | None, any_env: Environment
) -> None:
    bundle, _, _ = await computed_bundle(tmp_path, "sqlite")
    with sqlite3.connect(bundle) as conn:
        conn.execute(f"UPDATE entries SET cost = {sql}")
        reseal_sqlite(conn)
    assert (await import_bundle(bundle, any_env)).imported == 1
    info = await any_env.storage(NS).info(b'"k"')
    assert info is not None and info.cost == believed


async def test_a_huge_blob_in_the_cost_column_is_one_row_of_the_wrong_type(tmp_path: Path) -> None:
    bundle, _, _ = await computed_bundle(tmp_path, "sqlite")
    with sqlite3.connect(bundle) as conn:
        conn.execute("UPDATE entries SET cost = zeroblob(50000000)")
        reseal_sqlite(conn)
    with pytest.raises(CorruptBundleError, match=r": 1 row has a namespace, .* of the wrong type$"):
        async with open_bundle(bundle):
            pass
    async with open_environment("b", root=tmp_path / "b") as env:
        with pytest.raises(CorruptBundleError, match="written_at or cost not REAL or NULL"):
            await import_bundle(bundle, env)
        assert await env.namespaces() == []


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("value", ["'soon'", "x'00'"])
async def test_a_sqlite_bundle_whose_cost_is_not_a_number_is_corrupt(
    tmp_path: Path, verify: bool, value: str
) -> None:
    bundle, _, _ = await computed_bundle(tmp_path, "sqlite")
    with sqlite3.connect(bundle) as conn:
        conn.execute(f"UPDATE entries SET cost = {value}")
    async with open_environment("b", root=tmp_path / "b") as env:
        with pytest.raises(CorruptBundleError, match="cost"):
            await import_bundle(bundle, env, verify=verify)
        assert await env.namespaces() == []


async def test_a_flat_bundle_too_short_for_what_its_entries_carry_is_corrupt(
    tmp_path: Path,
) -> None:
    blob = write_flat({NS: {b"k": b"v"}}, _manifest(), {})
    sections = flat_sections(blob)
    cut = blob[: sections["carried"] + 8]  # the index is whole, the carried bytes are not
    with pytest.raises(CorruptBundleError, match="more than the file holds"):
        async with open_bundle(_write(tmp_path / "cut.flat", cut)):
            pass


# --- versions ------------------------------------------------------------------------------


async def test_a_flat_bundle_of_a_newer_format_asks_for_an_upgrade(tmp_path: Path) -> None:
    blob = bytearray(write_flat({NS: {b"k": b"v"}}, _manifest(), {}))
    struct.pack_into("<I", blob, 8, 3)
    with pytest.raises(UnsupportedSchemaError, match=r"version 3 .*upgrade warmenv"):
        async with open_bundle(_write(tmp_path / "new.flat", bytes(blob))):
            pass


async def test_a_sqlite_bundle_of_a_newer_format_asks_for_an_upgrade(tmp_path: Path) -> None:
    bundle, _, _ = await computed_bundle(tmp_path, "sqlite")
    with sqlite3.connect(bundle) as conn:
        conn.execute("UPDATE meta SET v = '3' WHERE k = 'schema_version'")
        conn.execute("ALTER TABLE entries ADD COLUMN future BLOB")
    with pytest.raises(UnsupportedSchemaError, match=r"format 3.*upgrade warmenv"):
        async with open_bundle(bundle):
            pass


async def test_a_manifest_over_an_environment_table_is_not_a_bundle(tmp_path: Path) -> None:
    """An environment's columns include written_at and cost, unverified by any digest."""
    async with open_environment("a", root=tmp_path / "a") as a:
        await a.storage(NS).insert(b"k", b"v", cost=1.0)
        path = a.path
    bundle, _, _ = await computed_bundle(tmp_path, "sqlite")
    with sqlite3.connect(bundle) as conn:
        manifest = conn.execute("SELECT v FROM meta WHERE k = 'manifest'").fetchone()[0]
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO meta VALUES ('manifest', ?)", (manifest,))
    conn.commit()
    conn.execute("PRAGMA journal_mode=DELETE")  # into the main file, which bundles are read from
    conn.close()
    with pytest.raises(NotABundleError, match="environment's entries table"):
        async with open_bundle(path):
            pass


async def test_a_format_1_sqlite_bundle_opened_as_an_environment_is_read(
    tmp_path: Path,
) -> None:
    path = format_1_sqlite(tmp_path / "old.bundle", {b"k": b"v"})
    async with open_environment(file=path) as env:
        assert env.read_only
        assert await env.storage(NS).get(b"k") == b"v"
    with sqlite3.connect(path) as conn:
        columns = [(r[1], r[2]) for r in conn.execute("PRAGMA table_info(entries)")]
    assert columns == ENTRY_COLUMNS


def _manifest() -> bytes:
    return json.dumps(dict(MANIFEST, digest="blake2b-256:" + "0" * 64)).encode()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
