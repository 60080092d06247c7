"""The manifest size limit: one limit (`MAX_MANIFEST_BYTES`) every reader and export enforce.

A flat bundle's u32 length field allowed a manifest of 4 GiB, and a SQLite
bundle's `meta` value any size: an untrusted file could make a reader
allocate that much before refusing it (a 200 MB manifest imported with
1.05 GB of memory). Each test here fails on the code before the limit.
"""

from __future__ import annotations

import json
import re
import sqlite3
import struct
import tracemalloc
from pathlib import Path

import attrs
import pytest

from conftest import env_contents
from helpers import run_python
from test_cli import warmenv
from test_cli_errors import assert_one_error_line
from warmenv import Environment
from warmenv.bundle import (
    BundleFormat,
    EnvironmentInfo,
    InvalidManifestError,
    NotABundleError,
    export_bundle,
    import_bundle,
    open_bundle,
    preflight,
)
from warmenv.bundle.manifest import MAX_MANIFEST_BYTES, BundleManifest

pytestmark = pytest.mark.anyio

U32 = struct.Struct("<I")
MIB = 1 << 20
HUGE = 64 * MIB  # far over the limit: a reader that read it first would show it


def _padded(manifest: BundleManifest, size: int) -> bytes:
    """`manifest` as JSON of exactly `size` bytes, padded in one device's name (which
    no per-field limit bounds)."""
    bare = attrs.evolve(manifest, environments=(EnvironmentInfo(label="pad", devices=("",)),))
    room = size - len(bare.to_json())
    assert room >= 0
    info = EnvironmentInfo(label="pad", devices=("d" * room,))
    document = attrs.evolve(manifest, environments=(info,)).to_json()
    assert len(document) == size
    return document


def _flat_with_manifest(path: Path, manifest: bytes, length: int | None = None) -> None:
    """Replace a flat bundle's manifest (and its length field, by default the true one)."""
    blob = path.read_bytes()
    (old,) = U32.unpack_from(blob, 12)
    claimed = len(manifest) if length is None else length
    path.write_bytes(blob[:12] + U32.pack(claimed) + manifest + blob[16 + old :])


def _sqlite_with_manifest(path: Path, manifest: bytes | str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE meta SET v = ? WHERE k = 'manifest'", (manifest,))
        conn.commit()
    finally:
        conn.close()


def refused(size: int, fmt: str = "flat") -> str:
    """The refusal of a manifest of `size` bytes, as a regex: a flat reader reads the
    size from the length field; SQLite before 3.43 cannot measure text (or a blob
    cast) without reading it, so it refuses it unread, knowing only that it is over."""
    measured = f"{size:,} bytes, "
    if fmt != "flat" and sqlite3.sqlite_version_info < (3, 43):
        measured = ""
    return f"the manifest is {measured}over the 1,048,576 bytes a reader accepts"


async def _manifest_of(path: Path) -> BundleManifest:
    async with open_bundle(path) as bundle:
        return bundle.manifest


def _with_manifest(path: Path, fmt: str, manifest: bytes) -> None:
    if fmt == "flat":
        _flat_with_manifest(path, manifest)
    else:
        _sqlite_with_manifest(path, manifest.decode("utf-8"))


async def test_a_manifest_over_the_limit_is_refused_without_reading_it(
    bundle_path: Path, bundle_format: str
) -> None:
    # Valid JSON of the right shape, 64 MiB: refused by its size before Python holds
    # any of it (tracemalloc sees Python's allocations, not SQLite's).
    manifest = _padded(await _manifest_of(bundle_path), HUGE)
    _with_manifest(bundle_path, bundle_format, manifest)
    del manifest
    tracemalloc.start()
    try:
        with pytest.raises(InvalidManifestError, match=refused(HUGE, bundle_format)):
            async with open_bundle(bundle_path):
                pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MIB, f"refusing it allocated {peak / MIB:.1f} MiB"


async def test_a_manifest_of_exactly_the_limit_is_read(
    bundle_path: Path, bundle_format: str, cold_env: Environment
) -> None:
    manifest = await _manifest_of(bundle_path)
    _with_manifest(bundle_path, bundle_format, _padded(manifest, MAX_MANIFEST_BYTES))
    assert len((await _manifest_of(bundle_path)).environments[0].devices[0]) > 1_000_000
    report = await import_bundle(bundle_path, cold_env)
    assert report.imported > 0


async def test_one_byte_over_the_limit_is_refused(
    bundle_path: Path, bundle_format: str, cold_env: Environment
) -> None:
    manifest = await _manifest_of(bundle_path)
    _with_manifest(bundle_path, bundle_format, _padded(manifest, MAX_MANIFEST_BYTES + 1))
    with pytest.raises(InvalidManifestError, match=refused(MAX_MANIFEST_BYTES + 1, bundle_format)):
        await import_bundle(bundle_path, cold_env)
    assert await env_contents(cold_env) == {}
    with pytest.raises(InvalidManifestError, match=str(bundle_path)):
        await preflight(bundle_path)


async def test_a_flat_length_field_claiming_4_gib_is_an_invalid_manifest(
    warm_env: Environment, tmp_path: Path
) -> None:
    path = tmp_path / "claims.bundle"
    await export_bundle(warm_env, path, name="claims", version="1", format=BundleFormat.FLAT)
    blob = path.read_bytes()
    (length,) = U32.unpack_from(blob, 12)
    _flat_with_manifest(path, blob[16 : 16 + length], length=0xFFFFFFFF)
    # Before the limit: "truncated", a CorruptBundleError, as if a damaged bundle.
    with pytest.raises(InvalidManifestError, match=refused(0xFFFFFFFF)):
        async with open_bundle(path):
            pass


async def test_a_sqlite_manifest_stored_as_a_huge_blob_is_refused_by_its_size(
    warm_env: Environment, tmp_path: Path
) -> None:
    path = tmp_path / "blob.bundle"
    await export_bundle(warm_env, path, name="blob", version="1", format=BundleFormat.SQLITE)
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE meta SET v = zeroblob(?) WHERE k = 'manifest'", (HUGE,))
        conn.commit()
    finally:
        conn.close()
    tracemalloc.start()
    try:
        with pytest.raises(InvalidManifestError, match=refused(HUGE, "sqlite")):
            async with open_bundle(path):
                pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MIB


@pytest.mark.parametrize("fmt", list(BundleFormat))
async def test_export_refuses_a_manifest_over_the_limit_and_writes_nothing(
    warm_env: Environment, tmp_path: Path, fmt: BundleFormat
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    devices = ("d" * MAX_MANIFEST_BYTES,)
    with pytest.raises(ValueError, match="over the 1,048,576 bytes a reader accepts"):
        await export_bundle(
            warm_env,
            out / "big.bundle",
            name="big",
            version="1",
            format=fmt,
            environments=[EnvironmentInfo(label="x", devices=devices)],
        )
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("fmt", list(BundleFormat))
async def test_export_just_under_the_limit_publishes_a_bundle_readers_accept(
    warm_env: Environment, tmp_path: Path, fmt: BundleFormat
) -> None:
    out = tmp_path / "near.bundle"
    # The placeholder digest has the final digest's length, so the size export checks
    # is the size written.
    room = MAX_MANIFEST_BYTES - 1_000
    info = EnvironmentInfo(label="x", devices=("d" * room,))
    report = await export_bundle(
        warm_env, out, name="near", version="1", format=fmt, environments=[info]
    )
    assert MAX_MANIFEST_BYTES - 1_000 < len(report.manifest.to_json()) <= MAX_MANIFEST_BYTES
    assert await _manifest_of(out) == report.manifest


def test_the_parser_refuses_an_oversized_document_before_parsing_it() -> None:
    # Nested arrays parse slowly and deeply; a size check after parsing would hang here.
    document = "[" * (MAX_MANIFEST_BYTES + 1)
    with pytest.raises(InvalidManifestError, match="over the"):
        BundleManifest.from_json(document)
    with pytest.raises(InvalidManifestError, match="over the"):
        BundleManifest.from_json(document.encode())
    # A str's limit is in UTF-8 bytes, not characters.
    wide = json.dumps({"name": "é" * (MAX_MANIFEST_BYTES // 2 + 1)}, ensure_ascii=False)
    assert len(wide) < MAX_MANIFEST_BYTES < len(wide.encode())
    with pytest.raises(InvalidManifestError, match="over the"):
        BundleManifest.from_json(wide)


@pytest.mark.parametrize("command", ["inspect", "verify", "check", "import"])
async def test_every_command_says_one_line_for_an_oversized_manifest(
    bundle_path: Path, bundle_format: str, root: Path, command: str
) -> None:
    manifest = await _manifest_of(bundle_path)
    _with_manifest(bundle_path, bundle_format, _padded(manifest, 2 * MIB))
    line = assert_one_error_line(warmenv(command, str(bundle_path), root=root), 1)
    assert re.search(refused(2 * MIB, bundle_format), line), line


async def test_a_second_manifest_row_over_the_limit_is_refused_too(
    warm_env: Environment, tmp_path: Path
) -> None:
    # A `meta` rebuilt without its primary key can hold 'manifest' twice: it is not
    # the table warmenv writes, so it is refused before any manifest row is read.
    path = tmp_path / "twice.bundle"
    await export_bundle(warm_env, path, name="twice", version="1", format=BundleFormat.SQLITE)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(
            "CREATE TABLE m2 AS SELECT * FROM meta; DROP TABLE meta; "
            "CREATE TABLE meta (k TEXT, v TEXT); INSERT INTO meta SELECT * FROM m2; "
            "DROP TABLE m2;"
        )
        conn.execute("INSERT INTO meta VALUES ('manifest', zeroblob(?))", (HUGE,))
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(NotABundleError, match="its table 'meta' is not as warmenv writes it"):
        async with open_bundle(path):
            pass


# The peak resident size of this process image (VmHWM: ru_maxrss would start at the
# parent's peak, which Linux carries over an exec), before and after the open, in KiB.
_OPEN_AND_MEASURE = """
import re, sys, anyio
from warmenv.bundle import BundleError, open_bundle

def peak():
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))

async def main():
    try:
        async with open_bundle(sys.argv[1]):
            pass
    except BundleError as exc:
        print(type(exc).__name__, exc, file=sys.stderr)

before = peak()
anyio.run(main)
print(peak() - before)
"""


@pytest.mark.parametrize(
    ("key", "value"),
    [("manifest", "printf('%.*c', ?, 'd')"), ("schema_version", "'2' || printf('%.*c', ?, ' ')")],
)
async def test_a_huge_sqlite_meta_text_costs_sqlite_no_memory_either(
    warm_env: Environment, tmp_path: Path, key: str, value: str
) -> None:
    # tracemalloc sees only Python's allocations: SQLite, asked to measure a 64 MiB text
    # manifest (before 3.43), read it whole into its own memory to do so, and a
    # schema_version of "2" and 64 MiB of spaces was read whole into Python (and taken).
    path = tmp_path / "text.bundle"
    await export_bundle(warm_env, path, name="text", version="1", format=BundleFormat.SQLITE)
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"UPDATE meta SET v = {value} WHERE k = ?", (HUGE, key))
        conn.commit()
    finally:
        conn.close()
    child = run_python(_OPEN_AND_MEASURE, str(path))
    assert child.returncode == 0, child.stderr
    grew_kib = int(child.stdout.strip())
    assert grew_kib < 16 * 1024, f"opening it grew the process by {grew_kib / 1024:.0f} MiB"
    if key == "manifest":
        assert "InvalidManifestError" in child.stderr, child.stderr
        assert "the manifest is" in child.stderr and "over the 1,048,576" in child.stderr
    else:  # refused by its length alone, unread: a claim no warmenv writes
        assert "NotABundleError" in child.stderr, child.stderr
        assert "its schema_version is over 64 bytes" in child.stderr, child.stderr
