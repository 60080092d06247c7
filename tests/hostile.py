"""A corpus of malformed and hostile bundles, generated from valid ones.

Every case is (name, bytes). The categories follow what attackers and bad
disks produce: random bytes, truncation at every section boundary, flipped
bytes, manifests of the wrong shape or absurd size, headers that claim
billions of entries, offsets past the end, unsorted indexes, duplicate keys,
SQLite files with missing tables, extra columns, wrong types or a manifest
that is not JSON, and (format 2) what entries carry set to NaNs, infinities,
negatives and absurd sizes under a correct digest. Valid bundles of format 2
come from export; their format-1 forms are rebuilt here from the spec
(docs/bundle-format.md), which is also how every digest here is computed.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
import struct
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from warmenv.bundle.manifest import DIGEST_PLACEHOLDER

U32 = struct.Struct("<I")
F64 = struct.Struct("<d")
Case = tuple[str, bytes]
UNKNOWN = bytes.fromhex("000000000000f87f")  # the NaN an unknown written_at or cost is
# f64 values an entry may carry that a reader must not believe (or must take as they are).
HOSTILE_F64: dict[str, bytes] = {
    "nan-negative": bytes.fromhex("000000000000f8ff"),
    "nan-payload": bytes.fromhex("010000000000f87f"),
    "nan-signalling": bytes.fromhex("010000000000f07f"),
    "inf": F64.pack(float("inf")),
    "minus-inf": F64.pack(float("-inf")),
    "minus-one": F64.pack(-1.0),
    "minus-zero": F64.pack(-0.0),
    "huge": F64.pack(1e300),
    "max-double": F64.pack(1.7976931348623157e308),
    "cost-limit": F64.pack(2.0**32),
    "year-10000": F64.pack(253402300800.0),
    "subnormal": F64.pack(5e-324),
    "zero": F64.pack(0.0),
}


def flat_sections(blob: bytes) -> dict[str, int]:
    """The offset where each section of a valid flat bundle (format 1 or 2) starts."""
    at = {"version": 8, "manifest_length": 12}
    (version,) = U32.unpack_from(blob, 8)
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
    data = pos + 4 + 20 * entries
    if version == 2:
        at["carried"] = data
        for i in range(entries):
            at[f"carried_{i}"] = data + 16 * i
        data += 16 * entries
    at["data"] = data
    at["end"] = len(blob)
    return at


# --- digests and formats, from the spec ---------------------------------------------------


def entries_digest(entries: Iterable[tuple[str, bytes, bytes, bytes | None]], format: int) -> str:
    """The digest of entries in bundle order: (namespace, key, value, 16 carried bytes
    in format 2, None in format 1), as docs/bundle-format.md frames it."""
    person = b"warmenv-entries2" if format == 2 else b"warmenv-entries"
    digest = hashlib.blake2b(digest_size=32, person=person)
    for namespace, key, value, carried in entries:
        for part in (namespace.encode(), key, value):
            digest.update(len(part).to_bytes(8, "little") + part)
        if format == 2:
            assert carried is not None and len(carried) == 16
            digest.update(carried)
    return "blake2b-256:" + digest.hexdigest()


def flat_entries(
    blob: bytes,
) -> tuple[int, list[str], list[tuple[str, bytes, bytes, bytes | None]]]:
    """Version, namespaces and entries (in index order) of a valid flat bundle."""
    at = flat_sections(blob)
    (version,) = U32.unpack_from(blob, 8)
    names = []
    for i in range(U32.unpack_from(blob, at["namespace_count"])[0]):
        (length,) = U32.unpack_from(blob, at[f"namespace_{i}"])
        names.append(blob[at[f"namespace_{i}"] + 4 :][:length].decode())
    data = at["data"]
    entries: list[tuple[str, bytes, bytes, bytes | None]] = []
    for i in range(U32.unpack_from(blob, at["entry_count"])[0]):
        ns, k_off, k_len, v_off, v_len = struct.unpack_from("<5I", blob, at[f"entry_{i}"])
        carried = blob[at[f"carried_{i}"] :][:16] if version == 2 else None
        key = blob[data + k_off : data + k_off + k_len]
        entries.append((names[ns], key, blob[data + v_off : data + v_off + v_len], carried))
    return version, names, entries


def with_digest(blob: bytes, digest: str) -> bytes:
    """`blob` with its manifest's digest replaced (the digest has a fixed length)."""
    (manifest_len,) = U32.unpack_from(blob, 12)
    manifest = json.loads(blob[16 : 16 + manifest_len])
    return blob.replace(manifest["digest"].encode(), digest.encode(), 1)


def reseal_flat(blob: bytes) -> bytes:
    """`blob` (a flat bundle whose layout is valid) with the digest of what it holds."""
    version, _, entries = flat_entries(blob)
    return with_digest(blob, entries_digest(entries, version))


def flat_format_1(blob: bytes) -> bytes:
    """A flat bundle of format 2 rewritten in format 1 (nothing carried), resealed."""
    at = flat_sections(blob)
    count = U32.unpack_from(blob, at["entry_count"])[0]
    head = blob[:8] + U32.pack(1) + blob[12 : at["carried"]]
    assert len(head) == at["index"] + 20 * count
    return reseal_flat(head + blob[at["data"] :])


def set_carried(blob: bytes, entry: int, field: str, raw: bytes) -> bytes:
    """A format-2 flat bundle with one entry's written_at or cost set to 8 raw bytes."""
    at = flat_sections(blob)[f"carried_{entry}"] + (0 if field == "written_at" else 8)
    return blob[:at] + raw + blob[at + 8 :]


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
    # Well formed but over the 1 MiB limit, padded in a field no other limit bounds.
    padded = dict(good, environments=[{"label": "l", "devices": ["d" * (1 << 20)]}])
    yield "manifest-over-the-size-limit", json.dumps(padded).encode()
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
    if "carried" in sections:  # format 2: hostile values, sealed, reach the import
        for i in range(sum(name.startswith("carried_") for name in sections)):
            for field in ("written_at", "cost"):
                for name, raw in HOSTILE_F64.items():
                    hostile = reseal_flat(set_carried(valid, i, field, raw))
                    yield f"flat-carried-{i}-{field}-{name}", hostile
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


def sqlite_digest(conn: sqlite3.Connection) -> str | None:
    """The digest of a SQLite bundle's rows in key order (format from its columns), or
    None where a row cannot be framed (a type the spec does not allow)."""
    columns = [row[1] for row in conn.execute("PRAGMA table_info(entries)")]
    format = 2 if "cost" in columns else 1
    selected = "namespace, key, value" + (", written_at, cost" if format == 2 else "")
    entries: list[tuple[str, bytes, bytes, bytes | None]] = []
    for row in conn.execute(f"SELECT {selected} FROM entries"):
        carried = None
        if format == 2:
            if not all(v is None or type(v) is float for v in row[3:]):
                return None
            carried = b"".join(UNKNOWN if v is None else F64.pack(v) for v in row[3:])
        if type(row[0]) is not str or type(row[1]) is not bytes or type(row[2]) is not bytes:
            return None
        entries.append((row[0], row[1], row[2], carried))
    entries.sort(key=lambda e: (e[0].encode("utf-8", "surrogatepass"), e[1]))
    return entries_digest(entries, format)


def reseal_sqlite(conn: sqlite3.Connection) -> None:
    """Write the digest of what the bundle holds into its manifest, as anyone could."""
    digest = sqlite_digest(conn)
    if digest is not None:
        conn.execute(
            "UPDATE meta SET v = json_set(v, '$.digest', ?) WHERE k = 'manifest'", (digest,)
        )


def sqlite_format_1(valid: Path, tmp: Path) -> Path:
    """A SQLite bundle of format 2 rewritten in format 1 (nothing carried), resealed."""
    path = tmp / "format-1.db"
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        conn.execute(
            "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, "
            "value BLOB NOT NULL, origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))"
        )
        conn.execute("ATTACH DATABASE ? AS v", (str(valid),))
        conn.execute("INSERT INTO meta SELECT k, v FROM v.meta")
        conn.execute("UPDATE meta SET v = '1' WHERE k = 'schema_version'")
        conn.execute(
            "INSERT INTO entries SELECT namespace, key, value, origin FROM v.entries ORDER BY rowid"
        )
        conn.commit()
        conn.execute("DETACH DATABASE v")
        reseal_sqlite(conn)
        conn.commit()
    finally:
        conn.close()
    return path


def _sqlite_variant(
    valid: Path, tmp: Path, name: str, statements: list[str], reseal: bool = False
) -> Case:
    path = tmp / f"{name}.db"
    path.write_bytes(valid.read_bytes())
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        if reseal:
            reseal_sqlite(conn)
        conn.commit()
    finally:
        conn.close()
    return f"sqlite-{name}", path.read_bytes()


def sqlite_cases(valid: Path, rng: random.Random) -> Iterator[Case]:
    """Cases from a valid SQLite bundle, of format 2 (what export writes) or 1."""
    conn = sqlite3.connect(valid)
    try:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(entries)")]
    finally:
        conn.close()
    carrying = "cost" in columns
    table = (
        "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL"
        + (", written_at REAL, cost REAL" if carrying else "")
        + ", PRIMARY KEY (namespace, key))"
    )
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
            "manifest-over-the-size-limit-text": [
                "UPDATE meta SET v = json_set(v, '$.environments[0].devices', "
                "json_array(printf('%.*c', 2000000, 'd'))) WHERE k = 'manifest'"
            ],
            "manifest-over-the-size-limit-blob": [
                "UPDATE meta SET v = zeroblob(2000000) WHERE k = 'manifest'"
            ],
            "manifest-schema-2": [
                "UPDATE meta SET v = json_set(v, '$.schema', 2) WHERE k = 'manifest'"
            ],
            "manifest-name-number": [
                "UPDATE meta SET v = json_set(v, '$.name', 5) WHERE k = 'manifest'"
            ],
            "without-rowid": [
                *rebuild,
                table.replace("))", ")) WITHOUT ROWID"),
                "INSERT INTO entries SELECT * FROM e2",
                "DROP TABLE e2",
            ],
            "duplicate-keys": [
                *rebuild,
                table.replace(" NOT NULL", "").replace(", PRIMARY KEY (namespace, key)", ""),
                "INSERT INTO entries SELECT * FROM e2",
                "INSERT INTO entries SELECT * FROM e2",
                "DROP TABLE e2",
            ],
            "value-changed": ["UPDATE entries SET value = x'00' WHERE rowid = 1"],
            "row-added": [
                "INSERT INTO entries (namespace, key, value, origin) "
                "VALUES ('app/1/x', x'01', x'02', 1)"
            ],
            "row-removed": ["DELETE FROM entries WHERE rowid = 1"],
            # Valid, digest and all: rows 10^11 apart import in as many batches as dense.
            "sparse-rowids": ["UPDATE entries SET rowid = rowid * 100000000000"],
            "reversed-rows": [
                *rebuild,
                table,
                "INSERT INTO entries SELECT * FROM e2 ORDER BY namespace DESC, key DESC",
                "DROP TABLE e2",
            ],
        }
        for name, statements in variants.items():
            yield _sqlite_variant(valid, tmp, name, statements)
        if carrying:  # format 2: what entries carry, hostile, under a correct digest
            hostile: dict[str, object] = {
                "text": "'3.5'",
                "word": "'soon'",
                "blob": "x'000000000000f03f'",
                "negative": "-1.0",
                "inf": "9e999",
                "minus-inf": "-9e999",
                "huge": "1e300",
                "cost-limit": "4294967296.0",
                "year-10000": "253402300800.0",
                "integer": "7",
            }
            for column in ("written_at", "cost"):
                for name, value in hostile.items():
                    statement = f"UPDATE entries SET {column} = {value} WHERE rowid % 2 = 1"
                    yield _sqlite_variant(valid, tmp, f"{column}-{name}", [statement], reseal=True)
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
