from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import textwrap
from pathlib import Path

import anyio
import pytest

from conftest import CONFIGS, KERNELS, OTHER_APP, env_contents, sample_entries
from helpers import backend_label, json_lines, one_trial, run_python, unprivileged_user
from warmenv import Environment, Namespace, Origin, Stored, open_environment
from warmenv.bundle import (
    BundleError,
    BundleFormat,
    CorruptBundleError,
    EnvironmentInfo,
    Finished,
    FlatBundle,
    ImportReport,
    InvalidManifestError,
    NotABundleError,
    Progress,
    SqliteBundle,
    Started,
    UnsupportedSchemaError,
    export_bundle,
    exporting,
    import_bundle,
    importing,
    open_bundle,
    preflight,
)
from warmenv.persistence.sqlite.storage import SqliteStorage

pytestmark = pytest.mark.anyio

TOTAL = sum(len(items) for items in sample_entries().values())


async def test_import_fills_the_environment_and_the_bundle_can_then_be_deleted(
    bundle_path: Path, cold_env: Environment
) -> None:
    report = await import_bundle(bundle_path, cold_env)
    bundle_path.unlink()
    assert report.imported == TOTAL
    assert (report.skipped, report.failed, report.rejected) == (0, 0, 0)
    assert await env_contents(cold_env) == sample_entries()


async def test_imported_entries_have_origin_imported(
    bundle_path: Path, cold_env: Environment
) -> None:
    await import_bundle(bundle_path, cold_env)
    storage = cold_env.storage(KERNELS)
    assert isinstance(storage, SqliteStorage)
    info = await storage.info(b"k000")
    assert info is not None and info.origin is Origin.IMPORTED


async def test_import_is_idempotent(bundle_path: Path, cold_env: Environment) -> None:
    await import_bundle(bundle_path, cold_env)
    again = await import_bundle(bundle_path, cold_env)
    assert (again.imported, again.skipped) == (0, TOTAL)
    assert await env_contents(cold_env) == sample_entries()


async def test_import_never_overwrites_a_local_value(
    bundle_path: Path, cold_env: Environment
) -> None:
    await cold_env.storage(KERNELS).insert(b"k000", b"computed here")
    report = await import_bundle(bundle_path, cold_env)
    assert report.skipped == 1
    assert await cold_env.storage(KERNELS).get(b"k000") == b"computed here"


async def test_a_local_value_replaces_a_stale_imported_one(
    bundle_path: Path, cold_env: Environment
) -> None:
    await import_bundle(bundle_path, cold_env)
    assert await cold_env.storage(KERNELS).insert(b"k000", b"fresh") == Stored()
    assert await cold_env.storage(KERNELS).get(b"k000") == b"fresh"


async def test_the_report_counts_entries_and_bytes_per_namespace(
    bundle_path: Path, cold_env: Environment
) -> None:
    report = await import_bundle(bundle_path, cold_env)
    expected = {
        ns: (len(items), sum(len(k) + len(v) for k, v in items.items()))
        for ns, items in sample_entries().items()
    }
    assert {s.namespace: (s.entries, s.bytes) for s in report.namespaces} == expected
    assert report.bytes == sum(b for _, b in expected.values())


async def test_import_prefixes_match_whole_segments(
    bundle_path: Path, cold_env: Environment
) -> None:
    report = await import_bundle(bundle_path, cold_env, namespaces=["app"])
    contents = await env_contents(cold_env)
    assert set(contents) == {str(KERNELS), str(CONFIGS)}  # not app2
    assert report.imported == TOTAL - 1


async def test_import_with_a_validate_callback_rejects_entries(
    bundle_path: Path, cold_env: Environment
) -> None:
    def only_configs(namespace: str, key: bytes, value: bytes) -> bool:
        return namespace == str(CONFIGS)

    report = await import_bundle(bundle_path, cold_env, validate=only_configs)
    assert report.imported == 30
    assert report.rejected == TOTAL - 30
    assert set(await env_contents(cold_env)) == {str(CONFIGS)}


async def test_import_events_are_started_cumulative_progress_then_finished(
    bundle_path: Path, cold_env: Environment
) -> None:
    async with importing(bundle_path, cold_env, batch_size=16) as progress:
        events = [event async for event in progress]
    assert isinstance(events[0], Started)
    assert events[0].total_entries == TOTAL
    assert isinstance(events[-1], Finished)
    assert events[-1].report == progress.report
    steps = [e for e in events if isinstance(e, Progress)]
    assert len(steps) >= TOTAL // 16
    done = [s.entries_done for s in steps]
    assert done == sorted(done)
    assert done[-1] == TOTAL
    assert steps[-1].bytes_done == steps[-1].total_bytes


@pytest.mark.parametrize("batch", [1, 7, 16, 1024])
async def test_a_bulk_import_counts_each_namespace_whether_a_batch_lies_in_one_or_spans_several(
    warm_env: Environment, cold_env: Environment, out_dir: Path, batch: int
) -> None:
    # The SQLite bundle is copied in bulk, batch by batch of rowids, and each batch's
    # totals are exact (a flat bundle's partly skipped batches are estimated).
    bundle_path = out_dir / "bulk.bundle"
    await export_bundle(warm_env, bundle_path, name="b", version="1", format="sqlite")
    # Three entries already there: those batches are partly skipped.
    present = [(b"k000", b"local"), (b"k050", b"local"), (b"k119", b"local")]
    await cold_env.storage(KERNELS).insert_many(present)
    report = await import_bundle(bundle_path, cold_env, batch_size=batch)
    expected = {
        namespace: (len(items), sum(len(k) + len(v) for k, v in items.items()))
        for namespace, items in sample_entries().items()
    }
    expected[str(KERNELS)] = (
        expected[str(KERNELS)][0] - 3,
        expected[str(KERNELS)][1]
        - sum(len(k) + len(b"kernel-%d" % int(k[1:])) for k, _ in present),
    )
    assert {s.namespace: (s.entries, s.bytes) for s in report.namespaces} == expected
    assert (report.imported, report.skipped) == (TOTAL - 3, 3)
    assert report.bytes == sum(size for _, size in expected.values())


async def test_bulk_imports_space_out_checkpoints_while_they_run_and_checkpoint_at_the_end(
    warm_env: Environment, cold_env: Environment, out_dir: Path
) -> None:
    from warmenv.persistence.sqlite.bulk import BULK_CHECKPOINT_PAGES

    bundle_path = out_dir / "bulk.bundle"
    await export_bundle(warm_env, bundle_path, name="b", version="1", format="sqlite")
    db = cold_env.database
    assert db is not None

    def spacing(conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])

    def unwritten_pages(conn: sqlite3.Connection) -> int:
        # Pages the database file lacks: still only in the WAL (not checkpointed).
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        return int(pages - os.stat(db.path).st_size // size)

    assert await db.run(spacing) == 1000
    # Two imports overlapping: the spacing holds until the last one ends.
    async with importing(bundle_path, cold_env, batch_size=16) as first:
        events = aiter(first)
        # Started, the digest's steps, then one batch.
        while not isinstance(await anext(events), Progress):
            pass
        assert await db.run(spacing) == BULK_CHECKPOINT_PAGES
        await import_bundle(bundle_path, cold_env, batch_size=16)
        assert await db.run(spacing) == BULK_CHECKPOINT_PAGES
        async for _ in events:
            pass
    assert first.report.complete
    assert await db.run(spacing) == 1000
    assert await db.run(unwritten_pages) == 0


async def test_an_open_bundle_can_be_imported(bundle_path: Path, cold_env: Environment) -> None:
    async with open_bundle(bundle_path) as bundle:
        report = await import_bundle(bundle, cold_env)
        assert await bundle.get(KERNELS, b"k001") == b"kernel-1"  # still open
    assert report.imported == TOTAL


async def test_both_formats_serve_the_same_entries(warm_env: Environment, tmp_path: Path) -> None:
    served = []
    for fmt in (BundleFormat.SQLITE, BundleFormat.FLAT):
        out = tmp_path / f"b.{fmt}"
        await export_bundle(warm_env, out, name="b", version="1", format=fmt)
        async with open_bundle(out) as bundle:
            namespaces = await bundle.namespaces()
            scanned = {
                s.namespace: [item async for item in bundle.scan(s.namespace, batch_size=7)]
                for s in namespaces
            }
            probes = [
                await bundle.get(KERNELS, b"k050"),
                await bundle.get(KERNELS, b"nope"),
                await bundle.get("no/such/ns", b"k050"),
                await bundle.get(OTHER_APP, b"x"),
            ]
            served.append((namespaces, scanned, probes, bundle.manifest.digest))
    assert served[0] == served[1]
    assert served[0][2] == [b"kernel-50", None, None, b"other"]


async def test_export_merges_sources_first_source_winning(
    warm_env: Environment, root: Path, tmp_path: Path, bundle_format: str
) -> None:
    async with open_environment("second", root=root) as second:
        await second.storage(KERNELS).insert(b"k000", b"from second")
        await second.storage(KERNELS).insert(b"only-second", b"v")
        out = tmp_path / "merged.bundle"
        report = await export_bundle(
            [warm_env, second], out, name="m", version="1", format=bundle_format
        )
    assert report.entries == TOTAL + 1
    async with open_bundle(out) as bundle:
        assert await bundle.get(KERNELS, b"k000") == b"kernel-0"
        assert await bundle.get(KERNELS, b"only-second") == b"v"


async def test_export_sources_may_be_files_and_roots(
    warm_env: Environment, root: Path, tmp_path: Path
) -> None:
    by_file = await export_bundle(warm_env.path, tmp_path / "f.bundle", name="f", version="1")
    by_root = await export_bundle(root, tmp_path / "r.bundle", name="r", version="1")
    assert by_file.entries == by_root.entries == TOTAL
    assert by_file.manifest.digest == by_root.manifest.digest


async def test_export_prefixes_match_whole_segments_without_wildcards(
    warm_env: Environment, tmp_path: Path, bundle_format: str
) -> None:
    await warm_env.storage("a_p/1/x").insert(b"k", b"v")
    await warm_env.storage("app%/1/x").insert(b"k", b"v")
    out = tmp_path / "p.bundle"
    await export_bundle(
        warm_env, out, name="p", version="1", format=bundle_format, namespaces=["app"]
    )
    async with open_bundle(out) as bundle:
        assert {s.namespace for s in await bundle.namespaces()} == {str(KERNELS), str(CONFIGS)}
    await export_bundle(
        warm_env, out, name="p", version="1", format=bundle_format, namespaces=["a_p"]
    )
    async with open_bundle(out) as bundle:
        assert {s.namespace for s in await bundle.namespaces()} == {"a_p/1/x"}


async def test_export_report_and_manifest(
    warm_env: Environment, tmp_path: Path, bundle_format: str
) -> None:
    info = EnvironmentInfo(label="H100 Linux", os="linux", arch="x86_64", devices=("H100",))
    out = tmp_path / "m.bundle"
    report = await export_bundle(
        warm_env, out, name="H100 Linux", format=bundle_format, environments=[info], version="2.0"
    )
    assert report.entries == TOTAL
    assert report.path == out
    assert {s.namespace for s in report.namespaces} == set(sample_entries())
    async with open_bundle(out) as bundle:
        assert bundle.manifest == report.manifest
        assert bundle.manifest.environments == (info,)
        assert bundle.manifest.version == "2.0"
        assert bundle.manifest.digest.startswith("blake2b-256:")


async def test_os_and_arch_are_filled_in_automatically() -> None:
    info = EnvironmentInfo(label="here")
    assert info.os and info.arch


async def test_reexport_replaces_the_previous_bundle(
    warm_env: Environment, tmp_path: Path, bundle_format: str
) -> None:
    out = tmp_path / "b.bundle"
    await export_bundle(warm_env, out, name="first", version="1", format=bundle_format)
    await export_bundle(warm_env, out, name="second", version="1", format=bundle_format)
    async with open_bundle(out) as bundle:
        assert bundle.manifest.name == "second"


async def test_a_foreign_file_at_out_survives_byte_for_byte(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    out = out_dir / "precious.txt"
    out.write_bytes(b"not a bundle\x00\x01")
    said = "not a warmenv bundle; it was left as it is: choose another path for the bundle"
    with pytest.raises(FileExistsError, match=said) as refused:
        await export_bundle(warm_env, out, name="x", version="1", format=bundle_format)
    assert "remove" not in str(refused.value)  # not ours: never advised away
    assert out.read_bytes() == b"not a bundle\x00\x01"
    assert sorted(p.name for p in out_dir.iterdir()) == ["precious.txt"]


async def test_an_environment_database_at_out_is_not_replaced(
    warm_env: Environment, root: Path, tmp_path: Path
) -> None:
    before = warm_env.path.read_bytes()
    with pytest.raises(FileExistsError) as refused:
        await export_bundle(warm_env, warm_env.path, name="x", version="1")
    said = f"is environment {warm_env.name!r} (a warmenv environment database), not a bundle"
    assert said in str(refused.value) and "remove" not in str(refused.value)
    assert warm_env.path.read_bytes() == before


async def test_a_failed_export_leaves_the_previous_bundle_alone(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    out = out_dir / "b.bundle"
    await export_bundle(warm_env, out, name="previous", version="1", format=bundle_format)
    before = out.read_bytes()
    with pytest.raises(BundleError):
        await export_bundle([warm_env, out_dir / "missing.db"], out, name="x", version="1")
    assert out.read_bytes() == before
    assert sorted(p.name for p in out_dir.iterdir()) == ["b.bundle"]


async def test_a_cancelled_export_leaves_the_previous_bundle_and_no_staging_file(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    await warm_env.storage("big/1/x").insert_many((b"%06d" % i, b"v" * 100) for i in range(5000))
    out = out_dir / "b.bundle"
    await export_bundle(warm_env, out, name="previous", version="1", format=bundle_format)
    before = out.read_bytes()
    async with exporting(warm_env, out, name="new", version="1", format=bundle_format) as progress:
        async for event in progress:
            if isinstance(event, Progress):
                break
    assert out.read_bytes() == before
    assert sorted(p.name for p in out_dir.iterdir()) == ["b.bundle"]
    with anyio.move_on_after(0.01):
        await export_bundle(warm_env, out, name="new", version="1", format=bundle_format)
    assert sorted(p.name for p in out_dir.iterdir()) == ["b.bundle"]
    async with open_bundle(out) as bundle:
        assert bundle.manifest.name in ("previous", "new")


async def test_the_next_export_removes_staging_files_a_killed_one_left(
    warm_env: Environment, out_dir: Path
) -> None:
    out = out_dir / "b.bundle"
    dead_pid = 2**22 + 12345  # above the default pid_max, so no such process
    leftover = out_dir / f".b.bundle.{dead_pid}.deadbeef.warmenv-staging"
    leftover.write_bytes(b"half a bundle")
    unrelated = out_dir / ".other.bundle.1.x.warmenv-staging"
    unrelated.write_bytes(b"not ours")
    await export_bundle(warm_env, out, name="b", version="1")
    assert not leftover.exists()
    assert unrelated.exists()


async def test_a_digest_mismatch_imports_nothing(
    bundle_path: Path, cold_env: Environment, bundle_format: str
) -> None:
    _tamper(bundle_path, bundle_format)
    with pytest.raises(CorruptBundleError, match="does not match its digest"):
        await import_bundle(bundle_path, cold_env)
    assert await cold_env.namespaces() == []


async def test_verify_false_skips_the_digest_check(
    bundle_path: Path, cold_env: Environment, bundle_format: str
) -> None:
    _tamper(bundle_path, bundle_format)
    report = await import_bundle(bundle_path, cold_env, verify=False)
    assert report.imported == TOTAL


def _tamper(path: Path, fmt: str) -> None:
    """Change one value's content, keeping the structure valid."""
    if fmt == BundleFormat.SQLITE:
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE entries SET value = x'00' WHERE key = ?", (b"k007",))
        conn.close()
    else:
        data = bytearray(path.read_bytes())
        at = data.rindex(b"kernel-7")
        data[at] ^= 0x20
        path.write_bytes(bytes(data))


async def test_cancelling_an_import_leaves_whole_batches_and_a_rerun_completes_it(
    bundle_path: Path, cold_env: Environment
) -> None:
    batch = 10
    async with importing(bundle_path, cold_env, batch_size=batch) as progress:
        async for event in progress:
            if isinstance(event, Progress) and event.entries_done >= 3 * batch:
                break
    partial = sum(s.entries for s in await cold_env.namespaces())
    assert 0 < partial < TOTAL
    report = await import_bundle(bundle_path, cold_env)
    assert report.imported + report.skipped == TOTAL
    assert report.skipped == partial
    assert await env_contents(cold_env) == sample_entries()


async def test_a_bundle_in_a_read_only_directory_imports_completely(
    warm_env: Environment,
    shared_tmp: Path,
    bundle_format: str,
    backend_name: str,
    anyio_backend: object,
) -> None:
    with one_trial(
        f"{bundle_format} bundle in a read-only directory, as nobody "
        f"({backend_label(anyio_backend)})",
        f"all {TOTAL} entries imported; nothing created beside the bundle",
    ):
        shipped = shared_tmp / "site-packages"
        shipped.mkdir()
        out = shipped / "warm.bundle"
        await export_bundle(warm_env, out, name="shipped", version="1", format=bundle_format)
        out.chmod(0o444)
        shipped.chmod(0o555)
        target = shared_tmp / "target"
        target.mkdir()
        target.chmod(0o1777)  # sticky: a root others may write without the bit is refused
        child = run_python(
            _IMPORT_CHILD, str(out), str(target), backend_name, user=unprivileged_user()
        )
        [report] = json_lines(child)
        assert report == {"imported": TOTAL, "failed": 0}
        assert sorted(p.name for p in shipped.iterdir()) == ["warm.bundle"]


_IMPORT_CHILD = textwrap.dedent(
    """
    import json, sys, anyio
    from warmenv import open_environment
    from warmenv.bundle import import_bundle

    async def main():
        async with open_environment("target", root=sys.argv[2]) as env:
            report = await import_bundle(sys.argv[1], env)
            print(json.dumps({"imported": report.imported, "failed": report.failed}))

    anyio.run(main, backend=sys.argv[3])
    """
)


async def test_open_bundle_rejects_what_is_not_a_bundle(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(NotABundleError):
        async with open_bundle(text):
            pass
    with pytest.raises(FileNotFoundError):
        async with open_bundle(tmp_path / "missing"):
            pass


async def test_a_sqlite_file_that_is_not_a_bundle_is_not_a_bundle_rather_than_corrupt(
    warm_env: Environment, tmp_path: Path
) -> None:
    # Open, its tables may still be in the -wal ("not a warmenv bundle") or already in
    # the file ("an environment, not a bundle"): never a corrupt bundle either way.
    with pytest.raises(NotABundleError, match=r"not a warmenv bundle|an environment, not a bundle"):
        async with open_bundle(warm_env.path):
            pass
    await warm_env.close()
    with pytest.raises(NotABundleError, match="without a manifest"):
        async with open_bundle(warm_env.path):
            pass
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(NotABundleError, match="no 'entries' or 'meta' table"):
        async with SqliteBundle.open(empty):
            pass
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE meta (k, v)")
        conn.execute("CREATE TABLE entries (a, b)")
    conn.close()
    with pytest.raises(NotABundleError, match="not warmenv's"):
        async with open_bundle(other):
            pass


async def test_a_large_sqlite_bundle_is_written_with_large_pages_and_a_small_one_is_not(
    warm_env: Environment, cold_env: Environment, out_dir: Path
) -> None:
    from warmenv.bundle.sqlite.staging import LARGE_BUNDLE, LARGE_PAGE

    small = out_dir / "small.bundle"
    await export_bundle(warm_env, small, name="s", version="1", format=BundleFormat.SQLITE)
    big_ns = Namespace("app", "big", version="1")
    values = [(b"b%05d" % i, bytes([i % 251]) * 4096) for i in range(LARGE_BUNDLE // 4096 + 1)]
    await warm_env.storage(big_ns).insert_many(values)
    large = out_dir / "large.bundle"
    await export_bundle(warm_env, large, name="l", version="1", format=BundleFormat.SQLITE)
    for path, page_size in ((small, 4096), (large, LARGE_PAGE)):
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA page_size").fetchone()[0] == page_size
    report = await import_bundle(large, cold_env)
    assert report.imported == TOTAL + len(values)
    assert await cold_env.storage(big_ns).get(values[-1][0]) == values[-1][1]


async def test_rows_whose_key_or_value_is_not_a_blob_are_malformed(
    warm_env: Environment, out_dir: Path
) -> None:
    # Only the SQLite format has typed columns to get wrong.
    bundle_path = out_dir / "typed.bundle"
    await export_bundle(
        warm_env, bundle_path, name="typed", version="1", format=BundleFormat.SQLITE
    )
    with sqlite3.connect(bundle_path) as conn:
        conn.execute("UPDATE entries SET value = 'text' WHERE key = ?", (b"k001",))
    conn.close()
    with pytest.raises(CorruptBundleError, match="wrong type"):
        async with open_bundle(bundle_path):
            pass


async def test_an_unknown_manifest_schema_is_unsupported(
    bundle_path: Path, bundle_format: str
) -> None:
    _rewrite_manifest(bundle_path, bundle_format, {"schema": 2})
    with pytest.raises(UnsupportedSchemaError, match="schema 2"):
        async with open_bundle(bundle_path):
            pass


async def test_a_manifest_with_a_wrong_field_names_the_field(
    bundle_path: Path, bundle_format: str
) -> None:
    _rewrite_manifest(bundle_path, bundle_format, {"name": 7})
    with pytest.raises(InvalidManifestError, match="'name'"):
        async with open_bundle(bundle_path):
            pass


def _rewrite_manifest(path: Path, fmt: str, changes: dict[str, object]) -> None:
    if fmt == BundleFormat.SQLITE:
        with sqlite3.connect(path) as conn:
            document = json.loads(
                conn.execute("SELECT v FROM meta WHERE k='manifest'").fetchone()[0]
            )
            document.update(changes)
            conn.execute("UPDATE meta SET v = ? WHERE k = 'manifest'", (json.dumps(document),))
        conn.close()
        return
    data = path.read_bytes()
    length = int.from_bytes(data[12:16], "little")
    document = json.loads(data[16 : 16 + length])
    document.update(changes)
    new = json.dumps(document).encode()
    path.write_bytes(data[:12] + len(new).to_bytes(4, "little") + new + data[16 + length :])


async def test_a_flat_header_claiming_billions_of_entries_fails_before_allocating() -> None:
    from warmenv.bundle.manifest import DIGEST_PLACEHOLDER

    manifest = json.dumps(
        {
            "schema": 1,
            "name": "n",
            "version": "1",
            "created": "c",
            "environments": [],
            "digest": DIGEST_PLACEHOLDER,
        }
    ).encode()
    blob = b"WARMENV\x01" + (1).to_bytes(4, "little") + len(manifest).to_bytes(4, "little")
    blob += manifest + (0).to_bytes(4, "little") + (4_000_000_000).to_bytes(4, "little")
    with pytest.raises(CorruptBundleError, match="more than the file holds"):
        FlatBundle.from_bytes(blob)


async def test_a_flat_bundle_reads_from_bytes(warm_env: Environment, out_dir: Path) -> None:
    bundle_path = out_dir / "flat.bundle"
    await export_bundle(warm_env, bundle_path, name="flat", version="1", format=BundleFormat.FLAT)
    bundle = FlatBundle.from_bytes(bundle_path.read_bytes())
    assert await bundle.get(KERNELS, b"k010") == b"kernel-10"
    assert await bundle.compute_digest() == bundle.manifest.digest
    await bundle.aclose()


@pytest.mark.parametrize("kind", [bytearray, memoryview])
async def test_a_flat_bundle_over_another_buffer_reads_bytes(
    warm_env: Environment, out_dir: Path, kind: type[bytearray | memoryview]
) -> None:
    bundle_path = out_dir / "flat.bundle"
    await export_bundle(warm_env, bundle_path, name="flat", version="1", format=BundleFormat.FLAT)
    bundle = FlatBundle.from_bytes(kind(bundle_path.read_bytes()))
    value = await bundle.get(KERNELS, b"k010")
    assert type(value) is bytes and value == b"kernel-10"
    async for key, value, _, _ in bundle.scan_with_provenance(KERNELS):
        assert type(key) is bytes and type(value) is bytes
    assert await bundle.compute_digest() == bundle.manifest.digest
    await bundle.aclose()
    with pytest.raises(ValueError):
        await bundle.get(KERNELS, b"k010")  # its view is released


async def test_a_loop_of_lookups_in_a_cancelled_scope_ends(bundle_path: Path) -> None:
    # A flat lookup checks for cancellation only now and then (it never
    # waits); a loop of them must still end when its scope is cancelled.
    async with open_bundle(bundle_path) as bundle:
        calls = 0
        with anyio.CancelScope() as scope:
            scope.cancel()
            while calls < 10_000:
                calls += 1
                await bundle.get(KERNELS, b"k010")
        assert scope.cancelled_caught
        assert calls <= 64


async def test_preflight_says_the_bundle_can_hit_here(bundle_path: Path) -> None:
    report = await preflight(bundle_path, version="1")
    assert report.ok
    assert "can hit" in str(report)


async def test_preflight_explains_another_platform(warm_env: Environment, tmp_path: Path) -> None:
    elsewhere = EnvironmentInfo(label="Mac M3", os="macos", arch="riscv128")
    out = tmp_path / "b.bundle"
    await export_bundle(warm_env, out, name="mac", version="1", environments=[elsewhere])
    report = await preflight(out)
    assert not report.ok
    assert "'Mac M3' (macos riscv128)" in str(report)
    assert "will not hit" in str(report)


async def test_preflight_lists_namespaces_of_another_version(bundle_path: Path) -> None:
    report = await preflight(bundle_path, version="2")
    assert not report.ok
    assert set(report.other_versions) == set(sample_entries())
    assert "re-export" in str(report)


async def test_preflight_of_another_version_says_which_versions_the_bundle_holds(
    env: Environment, tmp_path: Path
) -> None:
    for version in ("1", "1.5"):
        await env.storage(Namespace("app", "kernels", version=version)).insert(b"k", b"v")
    await export_bundle(env, tmp_path / "b.bundle", name="b", version="1")
    report = await preflight(tmp_path / "b.bundle", version="2")
    assert (
        "no namespace is for version '2' (the bundle holds versions '1' and '1.5'); "
        "re-export it from this version"
    ) in report.reasons
    await env.storage(Namespace("app", "kernels", version="1.5")).purge()
    await export_bundle(env, tmp_path / "one.bundle", name="one", version="1")
    report = await preflight(tmp_path / "one.bundle", version="2")
    assert "(the bundle holds version '1')" in report.reasons[-1]


async def test_preflight_of_an_empty_bundle_claims_nothing_of_its_namespaces(
    tmp_path: Path,
) -> None:
    async with open_environment("empty", root=tmp_path, remote="") as env:
        await export_bundle(env, tmp_path / "b.bundle", name="empty", version="1")
    report = await preflight(tmp_path / "b.bundle", version="1")
    assert not report.ok
    assert report.reasons[1:] == ("the bundle holds no entries",)  # not "all 0 namespaces"


async def test_namespace_prefix_helpers_match_whole_segments() -> None:
    from warmenv.persistence.namespace import matches_prefix

    assert matches_prefix("app/1/x", "app")
    assert matches_prefix("app/1/x", "app/1/")
    assert not matches_prefix("app2/1/x", "app")
    assert Namespace.raw("app/1/x/y").path == "x/y"


async def test_import_report_is_a_frozen_value() -> None:
    report = ImportReport((), 0, 0, 0, 0, 0, 0.0)
    with pytest.raises(AttributeError):
        report.imported = 1  # type: ignore[misc]


async def test_a_sqlite_bundle_whose_rows_are_not_in_key_order_still_verifies(
    warm_env: Environment, out_dir: Path, cold_env: Environment
) -> None:
    out = out_dir / "shuffled.bundle"
    await export_bundle(warm_env, out, name="shuffled", version="1")
    with sqlite3.connect(out) as conn:
        conn.execute("CREATE TABLE t AS SELECT * FROM entries ORDER BY namespace DESC, key DESC")
        conn.execute("DELETE FROM entries")
        conn.execute("INSERT INTO entries SELECT * FROM t")
        conn.execute("DROP TABLE t")
    conn.close()
    report = await import_bundle(out, cold_env)
    assert report.imported == TOTAL
    assert await env_contents(cold_env) == sample_entries()


async def test_two_imports_into_one_environment_may_overlap(
    warm_env: Environment, out_dir: Path, cold_env: Environment
) -> None:
    first, second = out_dir / "a.bundle", out_dir / "b.bundle"
    await export_bundle(warm_env, first, name="a", version="1", namespaces=["app"])
    await export_bundle(warm_env, second, name="b", version="1", namespaces=["app2"])
    reports: list[ImportReport] = []

    async def run(path: Path) -> None:
        reports.append(await import_bundle(path, cold_env, batch_size=8))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, first)
        tg.start_soon(run, second)
    assert sum(r.imported for r in reports) == TOTAL
    assert await env_contents(cold_env) == sample_entries()


async def test_an_import_cancelled_at_once_leaves_the_environment_importable(
    bundle_path: Path, cold_env: Environment
) -> None:
    for _ in range(5):
        with anyio.CancelScope() as scope:
            scope.cancel()
            await import_bundle(bundle_path, cold_env)
        with anyio.move_on_after(0.001):
            await import_bundle(bundle_path, cold_env)
    report = await import_bundle(bundle_path, cold_env)
    assert report.imported + report.skipped == TOTAL
    assert await env_contents(cold_env) == sample_entries()
