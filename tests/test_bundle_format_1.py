"""Export in format 1 on request, for fleets whose readers know only format 1.

warmenv 0.1 (and a reader written from the format-1 spec) refuses a bundle of
format 2: it checks the entries table's columns exactly, and the flat format
version. `format_version=1` writes exactly what 0.1 wrote, under the format-1
digest, and what entries carry (written_at, cost) is left out. The strongest
check runs 0.1's own reader, taken from the repository's history, on the file.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import anyio
import pytest

from conftest import sample_entries
from fuzz import sealed_digest
from warmenv import Environment, open_environment
from warmenv.bundle import export_bundle, exporting, import_bundle, open_bundle
from warmenv.persistence import Origin

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parent.parent
RELEASE_0_1 = "0b00651"  # the commit whose src/ is warmenv 0.1's reader and writer
NS = "app/1/kernels"


async def read_all(path: Path) -> dict[str, dict[bytes, bytes]]:
    async with open_bundle(path) as bundle:
        return {
            summary.namespace: {k: v async for k, v in bundle.scan(summary.namespace)}
            for summary in await bundle.namespaces()
        }


async def export_1(env: Environment, out: Path, format: str) -> Path:
    await export_bundle(env, out, name="for 0.1", version="1", format=format, format_version=1)
    return out


# --- what warmenv reads back ----------------------------------------------------------------


async def test_a_format_1_export_reads_back_as_format_1_with_the_same_entries(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    out = await export_1(warm_env, out_dir / f"b.{bundle_format}", bundle_format)
    async with open_bundle(out) as bundle:
        assert bundle.format_version == 1
        assert bundle.format == bundle_format
        await bundle.verify()
    assert await read_all(out) == sample_entries()


async def test_a_format_1_export_has_the_format_1_digest_of_its_entries(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    report = await export_bundle(
        warm_env, out_dir / "b", name="n", version="1", format=bundle_format, format_version=1
    )
    assert report.manifest.digest == sealed_digest(sample_entries())
    async with open_bundle(out_dir / "b") as bundle:
        assert bundle.manifest.digest == report.manifest.digest


async def test_both_formats_give_the_same_format_1_digest(
    warm_env: Environment, out_dir: Path
) -> None:
    digests = set()
    for format in ("sqlite", "flat"):
        report = await export_bundle(
            warm_env, out_dir / format, name="n", version="1", format=format, format_version=1
        )
        digests.add(report.manifest.digest)
    assert len(digests) == 1


async def test_a_format_1_export_imports_its_entries_carrying_nothing(
    tmp_path: Path, bundle_format: str
) -> None:
    async with open_environment("a", root=tmp_path / "a") as a:
        await a.storage(NS).insert(b"k", b"v", cost=4.2)
        out = await export_1(a, tmp_path / "b", bundle_format)
    async with open_environment("b", root=tmp_path / "b-root") as b:
        report = await import_bundle(out, b)
        assert report.imported == 1
        assert await b.storage(NS).get(b"k") == b"v"
        info = await b.storage(NS).info(b"k")
    assert info is not None
    assert info.origin == Origin.IMPORTED
    assert info.cost is None  # format 1 has no place for it: a hit saves nothing countable


async def test_several_sources_merge_into_a_format_1_bundle(
    tmp_path: Path, bundle_format: str
) -> None:
    async with (
        open_environment("a", root=tmp_path / "r") as a,
        open_environment("b", root=tmp_path / "r") as b,
    ):
        await a.storage(NS).insert(b"k1", b"from a", cost=1.0)
        await b.storage(NS).insert(b"k1", b"from b", cost=2.0)
        await b.storage(NS).insert(b"k2", b"only b")
        out = tmp_path / "merged"
        await export_bundle(
            [a, b], out, name="n", version="1", format=bundle_format, format_version=1
        )
    expected = {NS: {b"k1": b"from a", b"k2": b"only b"}}
    assert await read_all(out) == expected
    async with open_bundle(out) as bundle:
        assert bundle.format_version == 1
        assert await bundle.compute_digest() == sealed_digest(expected)


# --- the layout format 1 requires -------------------------------------------------------


async def test_a_format_1_sqlite_export_has_the_columns_and_schema_version_of_0_1(
    warm_env: Environment, out_dir: Path
) -> None:
    out = await export_1(warm_env, out_dir / "b.sqlite", "sqlite")
    conn = sqlite3.connect(out)
    try:
        columns = [(r[1], r[2], r[3], r[5]) for r in conn.execute("PRAGMA table_info(entries)")]
        version = conn.execute("SELECT v, typeof(v) FROM meta WHERE k = 'schema_version'")
        meta_keys = {k for (k,) in conn.execute("SELECT k FROM meta")}
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        (version_row,) = version.fetchall()
    finally:
        conn.close()
    # (name, declared type, NOT NULL, position in the primary key), exactly as 0.1 checks them.
    assert columns == [
        ("namespace", "TEXT", 1, 1),
        ("key", "BLOB", 1, 2),
        ("value", "BLOB", 1, 0),
        ("origin", "INTEGER", 1, 0),
    ]
    assert version_row == ("1", "text")
    assert meta_keys == {"schema_version", "manifest"}
    assert journal == "delete"


async def test_a_format_1_flat_export_has_version_1_and_no_carried_records(
    warm_env: Environment, out_dir: Path
) -> None:
    out = await export_1(warm_env, out_dir / "b.flat", "flat")
    blob = out.read_bytes()
    assert blob[:8] == b"WARMENV\x01"
    version, manifest_len = struct.unpack_from("<II", blob, 8)
    assert version == 1
    entries = sample_entries()
    names = sorted(entries, key=str.encode)
    count = sum(len(items) for items in entries.values())
    data = sum(len(k) + len(v) for items in entries.values() for k, v in items.items())
    # The v1 layout: magic, version, manifest, namespace table, 20-byte index, data.
    expected = 8 + 4 + 4 + manifest_len + 4 + sum(4 + len(n.encode()) for n in names)
    expected += 4 + 20 * count + data
    assert len(blob) == expected
    assert struct.unpack_from("<I", blob, expected - data - 20 * count - 4) == (count,)


# --- warmenv 0.1's own reader -----------------------------------------------------------


@pytest.fixture(scope="module")
def reader_0_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The src/ directory of warmenv 0.1, extracted from the repository's history.

    The suite runs from a clone (the README's command): without git or that
    history the test fails with the fix, as the Redis tests do, never skips.
    """
    if shutil.which("git") is None:
        pytest.fail("install git: this test extracts warmenv 0.1's reader from the history")
    archived = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", RELEASE_0_1, "src"],
        capture_output=True,
        timeout=60,
    )
    if archived.returncode != 0:  # not a git checkout, or a shallow clone without 0.1
        pytest.fail(
            f"cannot extract warmenv 0.1 ({RELEASE_0_1}) from {ROOT}: run the suite from a "
            f"full clone (git fetch --unshallow): {archived.stderr.decode().strip()}"
        )
    into = tmp_path_factory.mktemp("warmenv-0.1")
    with tarfile.open(fileobj=io.BytesIO(archived.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


# Run by 0.1: verify the digest, list the entries, import them into a 0.1 environment.
_READ_WITH_0_1 = """
import json, sys
from pathlib import Path
import anyio
import warmenv
from warmenv import open_environment
from warmenv.bundle import import_bundle, open_bundle
from warmenv.bundle.importing import content_digest

assert Path(warmenv.__file__).is_relative_to(sys.argv[1]), warmenv.__file__

async def main():
    async with open_bundle(sys.argv[2]) as bundle:
        verified = await content_digest(bundle) == bundle.manifest.digest
        entries = {}
        for summary in await bundle.namespaces():
            entries[summary.namespace] = {
                k.hex(): v.hex() async for k, v in bundle.scan(summary.namespace)
            }
    async with open_environment("old", root=sys.argv[3]) as env:
        report = await import_bundle(sys.argv[2], env)
    print(json.dumps({"verified": verified, "entries": entries, "imported": report.imported}))

anyio.run(main)
"""


async def run_0_1(src: Path, bundle: Path, root: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(src), "WARMENV_ROOT": str(root)}
    return await anyio.run_process(
        [sys.executable, "-c", _READ_WITH_0_1, str(src), str(bundle), str(root)],
        env=env,
        check=False,
    )


async def test_warmenv_0_1_reads_verifies_and_imports_a_format_1_export(
    warm_env: Environment, out_dir: Path, tmp_path: Path, bundle_format: str, reader_0_1: Path
) -> None:
    out = await export_1(warm_env, out_dir / f"b.{bundle_format}", bundle_format)
    completed = await run_0_1(reader_0_1, out, tmp_path / "old-root")
    assert completed.returncode == 0, completed.stderr.decode()
    result = json.loads(completed.stdout)
    assert result["verified"] is True
    assert result["entries"] == {
        ns: {k.hex(): v.hex() for k, v in items.items()} for ns, items in sample_entries().items()
    }
    assert result["imported"] == sum(len(items) for items in sample_entries().values())


async def test_warmenv_0_1_refuses_a_format_2_export(
    warm_env: Environment, out_dir: Path, tmp_path: Path, bundle_format: str, reader_0_1: Path
) -> None:
    """Why format 1 must be asked for: the reader of the test above refuses the default."""
    out = out_dir / f"b.{bundle_format}"
    await export_bundle(warm_env, out, name="n", version="1", format=bundle_format)
    completed = await run_0_1(reader_0_1, out, tmp_path / "old-root")
    assert completed.returncode != 0
    assert b"Error" in completed.stderr


# --- misuse -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 3, -1, "1", 1.0, True, None])
async def test_an_unknown_format_version_is_a_value_error_naming_it_and_the_choices(
    warm_env: Environment, out_dir: Path, bad: object
) -> None:
    out = out_dir / "b"
    with pytest.raises(ValueError, match=r"format version .*use 2 .* or 1") as raised:
        await export_bundle(warm_env, out, name="n", version="1", format_version=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(raised.value)
    assert not out.exists()


async def test_exporting_refuses_an_unknown_format_version_before_writing(
    warm_env: Environment, out_dir: Path
) -> None:
    with pytest.raises(ValueError, match="unknown bundle format version 7"):
        async with exporting(warm_env, out_dir / "b", name="n", version="1", format_version=7):
            pass  # pragma: no cover - the block is never entered
    assert list(out_dir.iterdir()) == []


async def test_exporting_writes_format_1_on_request(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    out = out_dir / "b"
    async with exporting(
        warm_env, out, name="n", version="1", format=bundle_format, format_version=1
    ) as progress:
        async for _ in progress:
            pass
    assert progress.report.manifest.digest == sealed_digest(sample_entries())
    async with open_bundle(out) as bundle:
        assert bundle.format_version == 1


def test_the_blocking_export_writes_format_1_on_request(tmp_path: Path) -> None:
    from warmenv import blocking

    async def fill() -> None:
        async with open_environment("a", root=tmp_path / "r") as env:
            await env.storage(NS).insert(b"k", b"v")

    async def version() -> int:
        async with open_bundle(tmp_path / "b") as bundle:
            return bundle.format_version

    anyio.run(fill)
    blocking.export_bundle(tmp_path / "r", tmp_path / "b", name="n", version="1", format_version=1)
    assert anyio.run(version) == 1
