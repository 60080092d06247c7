"""The trust boundary: what was verified is what is imported; no file can hang or crash us.

Each test pins one defect found in 0.1 (issue 9) and fails on that code.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from conftest import KERNELS, env_contents, sample_entries
from helpers import run_python
from warmenv import Environment, Failed, Stored, WarmenvWarning, open_environment
from warmenv.bundle import (
    BundleFormat,
    CorruptBundleError,
    InvalidSourceError,
    NotABundleError,
    export_bundle,
    import_bundle,
    importing,
    open_bundle,
    preflight,
)

pytestmark = pytest.mark.anyio


async def _other_bundle(root: Path, out: Path, fmt: str) -> dict[str, dict[bytes, bytes]]:
    """A valid bundle with the same keys as `sample_entries()` but other values."""
    other = {
        ns: {k: b"OTHER-" + v for k, v in items.items()} for ns, items in sample_entries().items()
    }
    async with open_environment("other", root=root) as env:
        for namespace, items in other.items():
            await env.storage(namespace).insert_many(items.items())
        await export_bundle(env, out, name="other", version="1", format=fmt)
    return other


async def test_a_path_swapped_mid_import_imports_only_the_verified_bundle(
    bundle_path: Path, bundle_format: str, cold_env: Environment, tmp_path: Path
) -> None:
    swap_in = tmp_path / f"swap.{bundle_format}"
    await _other_bundle(tmp_path / "other-root", swap_in, bundle_format)
    async with importing(bundle_path, cold_env, batch_size=16) as progress:
        async for _ in progress:
            if swap_in.exists():
                os.replace(swap_in, bundle_path)
    assert progress.report.imported == sum(len(v) for v in sample_entries().values())
    assert await env_contents(cold_env) == sample_entries()


async def test_an_open_bundle_whose_path_is_swapped_imports_what_it_verified(
    bundle_path: Path, bundle_format: str, cold_env: Environment, tmp_path: Path
) -> None:
    swap_in = tmp_path / f"swap.{bundle_format}"
    await _other_bundle(tmp_path / "other-root", swap_in, bundle_format)
    async with open_bundle(bundle_path) as bundle:
        os.replace(swap_in, bundle_path)
        await import_bundle(bundle, cold_env)
    assert await env_contents(cold_env) == sample_entries()


_REWRITE_MID_IMPORT = """
import json, os, sys, anyio
from warmenv import open_environment
from warmenv.bundle import importing, CorruptBundleError

path, root, backend, how = sys.argv[1:5]

async def main():
    async with open_environment("cold", root=root) as env:
        try:
            async with importing(path, env, batch_size=16) as progress:
                async for _ in progress:
                    if how == "truncate":
                        os.truncate(path, 64)
                    else:
                        with open(path, "r+b") as handle:
                            handle.seek(200)
                            handle.write(os.urandom(os.path.getsize(path) - 200))
            print(json.dumps({"imported": progress.report.imported}))
        except CorruptBundleError as exc:
            print(json.dumps({"corrupt": str(exc)}))

anyio.run(main, backend=backend)
"""


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_a_bundle_truncated_or_rewritten_mid_import_never_crashes_the_process(
    bundle_path: Path, tmp_path: Path, how: str, backend_name: str
) -> None:
    # A child process, so a SIGBUS (flat bundles were read through a mapping) is a failure.
    result = run_python(
        _REWRITE_MID_IMPORT, str(bundle_path), str(tmp_path / "r"), backend_name, how
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    outcome = json.loads(result.stdout)
    assert outcome == {"imported": sum(len(v) for v in sample_entries().values())}


_READ_AFTER_TRUNCATION = """
import json, os, sys, anyio
from warmenv.bundle.open import open_snapshot

async def main():
    path, verified = sys.argv[1], sys.argv[3] == "verified"
    async with open_snapshot(path, verified=verified) as bundle:
        os.truncate(path, 64)
        entries = 0
        for summary in await bundle.namespaces():
            async for _ in bundle.scan(summary.namespace):
                entries += 1
        await bundle.verify()
    print(json.dumps({"entries": entries}))

anyio.run(main, backend=sys.argv[2])
"""


@pytest.mark.parametrize("verified", ["verified", "checked at open"])
def test_a_snapshot_reads_whole_after_its_file_is_truncated(
    bundle_path: Path, backend_name: str, verified: str
) -> None:
    # What `warmenv inspect`, `verify`, `check` and `import` open: a private copy. A
    # child process, so a SIGBUS (a mapping of the truncated file) is a failure.
    result = run_python(_READ_AFTER_TRUNCATION, str(bundle_path), backend_name, verified)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert json.loads(result.stdout) == {"entries": sum(len(v) for v in sample_entries().values())}


@pytest.fixture(params=["fifo", "directory", "device"])
def not_a_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "fifo":
        path = tmp_path / "pipe.bundle"
        os.mkfifo(path)
        return path
    if request.param == "directory":
        path = tmp_path / "dir.bundle"
        path.mkdir()
        return path
    return Path("/dev/zero")


async def test_a_fifo_device_or_directory_is_refused_at_once(
    not_a_file: Path, cold_env: Environment
) -> None:
    with anyio.fail_after(10):
        with pytest.raises(NotABundleError, match="not a bundle file"):
            async with open_bundle(not_a_file):
                pass
        with pytest.raises(NotABundleError, match="not a bundle file"):
            await import_bundle(not_a_file, cold_env)
        with pytest.raises(NotABundleError, match="not a bundle file"):
            await preflight(not_a_file)


async def test_a_fifo_as_export_target_is_refused_at_once(
    warm_env: Environment, tmp_path: Path
) -> None:
    fifo = tmp_path / "out.bundle"
    os.mkfifo(fifo)
    with anyio.fail_after(10), pytest.raises(FileExistsError, match="FIFO"):
        await export_bundle(warm_env, fifo, name="x", version="1")


async def test_a_failed_commit_is_rolled_back_and_the_connection_stays_usable(
    env: Environment,
) -> None:
    db = env.database
    assert db is not None

    def arm(conn: sqlite3.Connection) -> None:
        # A deferred foreign key fails at COMMIT, not at the INSERT.
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE child (id INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.execute(
            "CREATE TRIGGER fail_commit AFTER INSERT ON entries "
            "WHEN new.key = X'626164' BEGIN INSERT INTO child VALUES (42); END"
        )

    await db.run(arm)
    storage = env.storage(KERNELS)
    failed = await storage.insert(b"bad", b"value")
    assert isinstance(failed, Failed) and "FOREIGN KEY" in failed.reason
    assert await storage.get(b"bad") is None
    assert await storage.insert(b"good", b"value") == Stored()
    assert await storage.get(b"good") == b"value"
    summary = await storage.insert_many([(b"bad", b"v"), (b"more", b"v")])
    assert summary.failed == 2
    assert await storage.insert(b"more", b"v") == Stored()


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("", "non-empty name"),
        ("x" * 10_000, "longer than 4096"),
        ("bad \udcff name", "not valid text"),
    ],
)
async def test_export_refuses_a_name_no_reader_accepts(
    warm_env: Environment, out_dir: Path, name: str, match: str
) -> None:
    out = out_dir / "refused.bundle"
    with pytest.raises(ValueError, match=match):
        await export_bundle(warm_env, out, name=name, version="1")
    assert list(out_dir.iterdir()) == []


def test_bundle_format_is_a_str_enum() -> None:
    assert BundleFormat("flat") is BundleFormat.FLAT
    assert str(BundleFormat.SQLITE) == "sqlite"


@pytest.mark.parametrize("fmt", list(BundleFormat))
async def test_exporting_from_a_database_file_leaves_no_wal_or_shm_beside_it(
    warm_env: Environment, out_dir: Path, fmt: BundleFormat
) -> None:
    # One format per test: an export in one format must not hide what the other leaves.
    path = warm_env.path
    await warm_env.close()
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    await export_bundle(
        path, out_dir / f"from-file.{fmt}", name="from file", version="1", format=fmt
    )
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


async def test_a_namespace_that_is_not_utf8_is_listed_and_left_out_of_exports(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    path = warm_env.path
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO entries (namespace, key, value, origin) "
            "VALUES (CAST(X'ff2f61' AS TEXT), X'6b', X'76', 0)"
        )
    conn.close()
    listed = [s.namespace for s in await warm_env.namespaces()]
    assert "\udcff/a" in listed
    out = out_dir / "skips.bundle"
    report = await export_bundle(warm_env, out, name="skips", version="1", format=bundle_format)
    assert report.entries == sum(len(v) for v in sample_entries().values())
    async with open_bundle(out) as bundle:
        await bundle.verify()


async def test_an_empty_namespace_is_left_out_of_exports_so_readers_accept_the_bundle(
    warm_env: Environment, out_dir: Path, cold_env: Environment, bundle_format: str
) -> None:
    # Written by something else: no warmenv API makes an empty namespace, and no reader takes one.
    with sqlite3.connect(warm_env.path) as conn:
        conn.execute(
            "INSERT INTO entries (namespace, key, value, origin) VALUES ('', X'6b', X'76', 0)"
        )
    conn.close()
    out = out_dir / "skips-empty.bundle"
    report = await export_bundle(warm_env, out, name="skips", version="1", format=bundle_format)
    assert report.entries == sum(len(v) for v in sample_entries().values())
    async with open_bundle(out) as bundle:
        await bundle.verify()
    await import_bundle(out, cold_env)
    assert await env_contents(cold_env) == sample_entries()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 320 KiB file system of its own (tmpfs), to fill up for real."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"full-disk tests mount a tmpfs (run as root): {done.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_an_export_onto_a_full_disk_is_an_oserror_and_leaves_nothing(
    warm_env: Environment, tiny_disk: Path, bundle_format: str
) -> None:
    storage = warm_env.storage(KERNELS)
    await storage.insert_many((b"big%04d" % i, os.urandom(1024)) for i in range(600))
    out = tiny_disk / "full.bundle"
    with pytest.raises(OSError) as caught:
        await export_bundle(warm_env, out, name="full", version="1", format=bundle_format)
    assert not isinstance(caught.value, sqlite3.Error)
    assert "No space left" in str(caught.value)
    assert list(tiny_disk.iterdir()) == []


_EXPORT_AS_NOBODY = """
import sys, anyio
from warmenv.bundle import export_bundle

async def main():
    try:
        await export_bundle(sys.argv[1], sys.argv[2], name="n", version="1", format=sys.argv[3])
    except PermissionError as exc:
        print("PermissionError", exc.filename)

anyio.run(main)
"""


def test_an_export_into_an_unwritable_directory_is_a_permission_error(
    shared_tmp: Path, bundle_format: str
) -> None:
    from helpers import unprivileged_user

    source = shared_tmp / "env.db"

    async def environment() -> None:  # a real one: export proves its source is ours
        async with open_environment(file=source) as env:
            await env.storage("a/1/b").insert(b"\x01", b"\x02")

    anyio.run(environment)
    source.chmod(0o644)
    locked = shared_tmp / "locked"
    locked.mkdir(mode=0o755)
    result = run_python(
        _EXPORT_AS_NOBODY,
        str(source),
        str(locked / "out.bundle"),
        bundle_format,
        user=unprivileged_user(),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("PermissionError"), result.stdout
    assert list(locked.iterdir()) == []


async def test_a_corrupt_bundle_fails_verify(bundle_path: Path) -> None:
    data = bytearray(bundle_path.read_bytes())
    data[-5] ^= 0xFF
    bundle_path.write_bytes(bytes(data))
    with pytest.raises(CorruptBundleError):
        async with open_bundle(bundle_path) as bundle:
            await bundle.verify()


async def test_an_environment_file_that_is_a_fifo_degrades_to_memory_at_once(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    with anyio.fail_after(10), pytest.warns(WarmenvWarning, match="FIFO"):
        async with open_environment(file=fifo) as env:
            assert env.in_memory


async def test_a_fifo_as_export_source_is_refused_at_once(tmp_path: Path, out_dir: Path) -> None:
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    with anyio.fail_after(10), pytest.raises(InvalidSourceError, match="FIFO"):
        await export_bundle(fifo, out_dir / "x.bundle", name="x", version="1")


async def test_a_socket_is_refused_as_not_a_bundle_file(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "sock.bundle"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(NotABundleError, match="socket"):
            async with open_bundle(path):
                pass


async def test_an_environment_behind_a_dangling_symlink_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "target.db"
    (tmp_path / "root").mkdir()
    link = tmp_path / "root" / "dangling.db"
    link.symlink_to(target)
    named = f"{link} is a symlink to a missing path ({target})"
    with pytest.warns(WarmenvWarning, match=re.escape(named)):
        async with open_environment("dangling", root=tmp_path / "root") as env:
            assert env.in_memory
    assert not target.parent.exists()


async def test_inspection_and_import_read_the_same_bytes_of_a_wal_mode_bundle(
    warm_env: Environment, out_dir: Path, cold_env: Environment
) -> None:
    path = out_dir / "wal.bundle"
    await export_bundle(warm_env, path, name="wal", version="1", format=BundleFormat.SQLITE)
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("UPDATE entries SET value = X'00'")  # lands in -wal, left uncheckpointed
    writer.commit()
    try:
        before = sorted(p.name for p in out_dir.iterdir())
        async with open_bundle(path) as bundle:
            await bundle.verify()  # the main file alone, as an import reads it
        await import_bundle(path, cold_env)
        assert await env_contents(cold_env) == sample_entries()
        assert sorted(p.name for p in out_dir.iterdir()) == before
    finally:
        writer.close()


async def test_no_room_beside_the_environment_puts_the_private_copy_in_the_temp_directory(
    tiny_disk: Path,
    tmp_path: Path,
    bundle_path: Path,
    bundle_format: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    async with open_environment("small", root=tiny_disk) as env:
        # Fill the file system so the bundle's copy cannot go beside the environment.
        filler = os.open(tiny_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):
                while True:
                    os.write(filler, b"\0" * 4096)
        finally:
            os.close(filler)
        seen: list[str] = []
        async with importing(bundle_path, env) as progress:
            async for _ in progress:
                seen += [p.name for p in temp.iterdir()]
        report = progress.report
    total = sum(len(v) for v in sample_entries().values())
    assert report.imported + report.skipped + report.failed == total
    # (A flat copy loses its name once mapped, so only a SQLite copy can be seen there.)
    if bundle_format == "sqlite":
        assert any(name.startswith(".warmenv-import.") for name in seen)
    assert list(temp.iterdir()) == []
    assert not [p for p in tiny_disk.iterdir() if p.name.startswith(".warmenv-import.")]


async def test_a_dead_import_s_private_copy_is_removed_by_the_next_import(
    bundle_path: Path, cold_env: Environment
) -> None:
    stale = cold_env.path.parent / ".warmenv-import.999999999.abc"
    stale.mkdir()
    (stale / "bundle.sqlite").write_bytes(b"x" * 1000)
    await import_bundle(bundle_path, cold_env)
    assert not stale.exists()
