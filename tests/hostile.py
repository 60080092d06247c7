"""A corpus of malformed and hostile bundles, generated from two valid ones.

Every case is (name, bytes). The categories follow what attackers and bad
disks produce: random bytes, truncation at every section boundary, flipped
bytes, manifests of the wrong shape or absurd size, headers that claim
billions of entries, offsets past the end, unsorted indexes, duplicate keys,
and SQLite files with missing tables, extra columns, wrong types or a
manifest that is not JSON.
"""

from __future__ import annotations

import json
import random
import sqlite3
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

from warmenv.bundle.manifest import DIGEST_PLACEHOLDER

U32 = struct.Struct("<I")
Case = tuple[str, bytes]


def flat_sections(blob: bytes) -> dict[str, int]:
    """The offset where each section of a valid flat bundle starts."""
    at = {"version": 8, "manifest_length": 12}
    (manifest_len,) = U32.unpack_from(blob, 12)
    at["manifest"] = 16
    at["namespace_count"] = 16 + manifest_len
    (count,) = U32.unpack_from(blob, at["namespace_count"])
    pos = at["namespace_count"] + 4
    for i in range(count):
        at[f"namespace_{i}"] = pos
        (length,) = U32.unpack_from(blob, pos)
        pos += 4 + length
    at["entry_count"] = pos
    (entries,) = U32.unpack_from(blob, pos)
    at["index"] = pos + 4
    for i in range(entries):
        at[f"entry_{i}"] = pos + 4 + 20 * i
    at["data"] = pos + 4 + 20 * entries
    at["end"] = len(blob)
    return at


def _set_u32(blob: bytes, offset: int, value: int) -> bytes:
    return blob[:offset] + U32.pack(value) + blob[offset + 4 :]


def _with_manifest(blob: bytes, manifest: bytes) -> bytes:
    (old,) = U32.unpack_from(blob, 12)
    return blob[:12] + U32.pack(len(manifest)) + manifest + blob[16 + old :]


def manifests() -> Iterator[tuple[str, bytes]]:
    good = {
        "schema": 1,
        "name": "n",
        "version": "1",
        "created": "c",
        "environments": [{"label": "l", "os": "linux", "arch": "x86_64", "devices": []}],
        "digest": DIGEST_PLACEHOLDER,
    }
    wrong_values: list[object] = [None, 1, 1.5, True, [], {}, "x" * 1_000_000, "\ud800"]
    for field in good:
        for value in wrong_values:
            document = dict(good)
            document[field] = value
            try:
                yield f"manifest-{field}-{type(value).__name__}", json.dumps(document).encode()
            except UnicodeEncodeError:
                continue
        document = dict(good)
        del document[field]
        yield f"manifest-missing-{field}", json.dumps(document).encode()
    for environment in ([1], [{"label": 1}], [{"label": "l", "devices": [1]}], ["x"]):
        yield (
            f"manifest-environments-{environment!r}",
            json.dumps(dict(good, environments=environment)).encode(),
        )
    yield "manifest-schema-2", json.dumps(dict(good, schema=2)).encode()
    yield "manifest-not-json", b"{not json"
    yield "manifest-not-utf8", b"\xff\xfe{}"
    yield "manifest-array", b"[]"
    yield "manifest-deeply-nested", b"[" * 100_000 + b"]" * 100_000
    yield "manifest-empty", b""


def flat_cases(valid: bytes, rng: random.Random) -> Iterator[Case]:
    sections = flat_sections(valid)
    for name, offset in sections.items():
        for delta in (-1, 0, 1, 2, 3):
            cut = offset + delta
            if 0 <= cut < len(valid):
                yield f"flat-truncated-at-{name}{delta:+d}", valid[:cut]
    for offset in range(sections["data"]):
        for xor in (0x01, 0x80, 0xFF):
            flipped = bytearray(valid)
            flipped[offset] ^= xor
            yield f"flat-flip-{offset}-{xor:02x}", bytes(flipped)
    for _ in range(200):
        flipped = bytearray(valid)
        flipped[rng.randrange(sections["data"], len(valid))] ^= rng.randrange(1, 256)
        yield "flat-flip-data", bytes(flipped)
    for name, manifest in manifests():
        yield f"flat-{name}", _with_manifest(valid, manifest)
    for field in ("manifest_length", "namespace_count", "entry_count", "namespace_0"):
        for value in (0xFFFFFFFF, 0x7FFFFFFF, 1_000_000_000, len(valid)):
            yield f"flat-claims-{field}-{value}", _set_u32(valid, sections[field], value)
    entries = [k for k in sections if k.startswith("entry_")]
    for entry in entries:
        base = sections[entry]
        for field, offset in (
            ("ns", 0),
            ("key_off", 4),
            ("key_len", 8),
            ("val_off", 12),
            ("val_len", 16),
        ):
            for value in (0xFFFFFFFF, len(valid), 0xFFFFFFF0):
                yield f"flat-{entry}-{field}-{value}", _set_u32(valid, base + offset, value)
    for i in range(len(entries) - 1):
        a, b = sections[entries[i]], sections[entries[i + 1]]
        swapped = valid[:a] + valid[b : b + 20] + valid[a : a + 20] + valid[b + 20 :]
        yield f"flat-unsorted-{i}", swapped
        duplicated = valid[:b] + valid[a : a + 20] + valid[b + 20 :]
        yield f"flat-duplicate-key-{i}", duplicated
    ns0, ns1 = sections["namespace_0"], sections.get("namespace_1")
    if ns1 is not None:
        (length,) = U32.unpack_from(valid, ns0)
        yield (
            "flat-namespace-not-utf8",
            valid[: ns0 + 4] + b"\xff" * length + valid[ns0 + 4 + length :],
        )
    for i in range(300):
        yield f"flat-random-{i}", b"WARMENV\x01" + rng.randbytes(rng.randrange(0, 400))


def _sqlite_variant(valid: Path, tmp: Path, name: str, statements: list[str]) -> Case:
    path = tmp / f"{name}.db"
    path.write_bytes(valid.read_bytes())
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()
    return f"sqlite-{name}", path.read_bytes()


def sqlite_cases(valid: Path, rng: random.Random) -> Iterator[Case]:
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        rebuild = [
            "CREATE TABLE e2 AS SELECT * FROM entries",
            "DROP TABLE entries",
        ]
        variants: dict[str, list[str]] = {
            "no-meta": ["DROP TABLE meta"],
            "no-entries": ["DROP TABLE entries"],
            "extra-column": ["ALTER TABLE entries ADD COLUMN extra TEXT"],
            "missing-column": [
                *rebuild,
                "CREATE TABLE entries (namespace TEXT, key BLOB, value BLOB)",
                "INSERT INTO entries SELECT namespace, key, value FROM e2",
                "DROP TABLE e2",
            ],
            "entries-a-view": [*rebuild, "CREATE VIEW entries AS SELECT * FROM e2"],
            "text-key": ["UPDATE entries SET key = 'text' WHERE rowid = 1"],
            "integer-value": ["UPDATE entries SET value = 7 WHERE rowid = 2"],
            "blob-namespace": ["UPDATE entries SET namespace = x'6170702f' WHERE rowid = 3"],
            "no-manifest": ["DELETE FROM meta WHERE k = 'manifest'"],
            "manifest-not-json": ["UPDATE meta SET v = '{oops' WHERE k = 'manifest'"],
            "manifest-blob": ["UPDATE meta SET v = x'00ff' WHERE k = 'manifest'"],
            "manifest-schema-2": [
                "UPDATE meta SET v = json_set(v, '$.schema', 2) WHERE k = 'manifest'"
            ],
            "manifest-name-number": [
                "UPDATE meta SET v = json_set(v, '$.name', 5) WHERE k = 'manifest'"
            ],
            "without-rowid": [
                *rebuild,
                "CREATE TABLE entries (namespace TEXT NOT NULL, key "
                "BLOB NOT NULL, value BLOB NOT NULL, origin INTEGER NOT NULL, "
                "PRIMARY KEY (namespace, key)) WITHOUT ROWID",
                "INSERT INTO entries SELECT * FROM e2",
                "DROP TABLE e2",
            ],
            "duplicate-keys": [
                *rebuild,
                "CREATE TABLE entries (namespace TEXT, key BLOB, value BLOB, origin INTEGER)",
                "INSERT INTO entries SELECT * FROM e2",
                "INSERT INTO entries SELECT * FROM e2",
                "DROP TABLE e2",
            ],
            "value-changed": ["UPDATE entries SET value = x'00' WHERE rowid = 1"],
            "row-added": ["INSERT INTO entries VALUES ('app/1/x', x'01', x'02', 1)"],
            "row-removed": ["DELETE FROM entries WHERE rowid = 1"],
            "reversed-rows": [
                *rebuild,
                "CREATE TABLE entries (namespace TEXT NOT NULL, key "
                "BLOB NOT NULL, value BLOB NOT NULL, origin INTEGER NOT NULL, "
                "PRIMARY KEY (namespace, key))",
                "INSERT INTO entries SELECT * FROM e2 ORDER BY namespace DESC, key DESC",
                "DROP TABLE e2",
            ],
        }
        for name, statements in variants.items():
            yield _sqlite_variant(valid, tmp, name, statements)
    data = valid.read_bytes()
    page = 4096
    for cut in sorted({*range(0, len(data), page), *(rng.randrange(len(data)) for _ in range(40))}):
        yield f"sqlite-truncated-{cut}", data[:cut]
    for _ in range(1500):
        flipped = bytearray(data)
        flipped[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        yield "sqlite-flip", bytes(flipped)
    for i in range(200):
        yield f"sqlite-random-{i}", b"SQLite format 3\x00" + rng.randbytes(rng.randrange(0, 8192))


def random_cases(rng: random.Random, count: int) -> Iterator[Case]:
    for i in range(count):
        yield f"random-{i}", rng.randbytes(rng.randrange(0, 2048))
