"""Fuzzing the two bundle readers and the manifest parser.

The property: whatever the bytes, opening, reading, scanning, verifying and
importing a bundle either works or raises a `BundleError` (or `OSError`), and
parsing a manifest either gives a manifest that writes itself back unchanged
or raises a `BundleError`. Never another exception, never a hang or a crash.

Inputs are valid bundles of both formats damaged the ways disks and attackers
damage them (bit flips, truncation, splices, the flat format's length and
offset fields, SQLite's header and page fields, rows and schema edited in
SQL, manifests replaced, and in format 2 what entries carry set to NaNs,
infinities, negatives, absurd sizes and text) and random bytes, from seeds of
both bundle formats. The digest is no signature: anyone can recompute it, so
a damaged bundle is often *resealed* (its digest recomputed over what the
readers serve and written back) to carry the damage past verification into
the import. Whatever an imported entry carried, the environment must record
a written_at and cost a reader believes (in range) or none.

Used by tests/test_fuzz_readers.py (a short, derandomised form in the suite)
and benchmarks/fuzz_bundles.py (`nox -s fuzz`, a long randomised run).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import random
import shutil
import sqlite3
import struct
import tempfile
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio
import attrs
from hypothesis import strategies as st

from hostile import (
    HOSTILE_F64,
    UNKNOWN,
    entries_digest,
    flat_format_1,
    flat_sections,
    reseal_sqlite,
    sqlite_format_1,
)
from warmenv import Environment, Namespace, open_environment
from warmenv.bundle import (
    Bundle,
    BundleError,
    BundleFormat,
    BundleManifest,
    FlatBundle,
    SqliteBundle,
    export_bundle,
    import_bundle,
    open_bundle,
    preflight,
)
from warmenv.bundle.formats import sniff
from warmenv.persistence.carried import COST_LIMIT, WRITTEN_AT_LIMIT

ALLOWED = (BundleError, OSError)
FLAT_MAGIC = b"WARMENV\x01"
SQLITE_MAGIC = b"SQLite format 3\x00"
DIGEST_PREFIX = "blake2b-256:"


@attrs.frozen
class Case:
    """One input: how it was made (to report it) and its bytes."""

    kind: str
    steps: tuple[str, ...]
    data: bytes
    reseal: bool

    def describe(self) -> str:
        steps = "; ".join(self.steps) or "unchanged"
        return f"{self.kind}{' (resealed)' if self.reseal else ''}: {steps} ({len(self.data)} B)"


# --- defects the fuzz run found and that are not fixed yet ------------------------------------

# None today: the four the first run found are fixed, and their regression tests in
# tests/test_fuzz_readers.py pass. A new finding that cannot be fixed at once goes
# here (matched by exception type and message, so the short form keeps guarding
# everything else) with a regression test and an entry in docs/reliability.md.
KNOWN_DEFECTS: dict[str, tuple[type[BaseException], str]] = {}


def known_defect(exc: BaseException) -> str | None:
    """The KNOWN_DEFECTS entry `exc` is, if any."""
    for name, (kind, text) in KNOWN_DEFECTS.items():
        if type(exc) is kind and text in str(exc):
            return name
    return None


# --- valid bundles to start from ----------------------------------------------------------


@attrs.frozen
class Seeds:
    """Valid bundles: [0] and [1] of format 2 (as exported), [2] and [3] the same in format 1."""

    flat: tuple[bytes, ...]
    sqlite: tuple[bytes, ...]


async def _export_seeds(tmp: Path) -> Seeds:
    rng = random.Random(7)
    contents = {
        "tiny": {
            Namespace("app", "a", version="1"): [(b"\x00", b""), (b"k", b"v")],
            Namespace("app", "b/c", version="2"): [(b"only", b"one")],
        },
        "medium": {
            Namespace("app", "kernels", version="1"): [
                (b"k%03d" % i, rng.randbytes(rng.choice((0, 5, 300, 3000)))) for i in range(90)
            ],
            Namespace("app", "configs", version="1"): [
                (b"c%02d" % i, b"config-%d" % i) for i in range(25)
            ],
            Namespace("\u00e9t\u00e9", "\u6f22", version="1"): [(b"\xff" * 40, b"x" * 5000)],
        },
    }
    flat: list[bytes] = []
    sqlite: list[bytes] = []
    for label, namespaces in contents.items():
        async with open_environment(label, root=tmp / label) as env:
            for i, (namespace, items) in enumerate(namespaces.items()):
                # Some entries carry a cost, as computed ones do.
                await env.storage(namespace).insert_many(items, cost=None if i else 0.25 * 3)
            for fmt, into in ((BundleFormat.FLAT, flat), (BundleFormat.SQLITE, sqlite)):
                out = tmp / f"{label}.{fmt}"
                await export_bundle(env, out, name=f"seed {label} \u2603", version="1", format=fmt)
                into.append(out.read_bytes())
    flat += [flat_format_1(seed) for seed in flat]
    for i, seed in enumerate(list(sqlite)):
        (tmp / f"seed{i}.db").write_bytes(seed)
        sqlite.append(sqlite_format_1(tmp / f"seed{i}.db", tmp).read_bytes())
    return Seeds(flat=tuple(flat), sqlite=tuple(sqlite))


@functools.cache
def seed_bundles() -> Seeds:
    """Valid bundles of both formats, made once per process (on a thread of its own,
    since the caller may already be inside an event loop)."""

    def build() -> Seeds:
        with tempfile.TemporaryDirectory() as tmp:
            return anyio.run(_export_seeds, Path(tmp))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(build).result()


# --- manifests ----------------------------------------------------------------------------------

_GOOD_MANIFEST: dict[str, object] = {
    "schema": 1,
    "name": "n",
    "version": "1",
    "created": "2026-01-01T00:00:00+00:00",
    "environments": [{"label": "l", "os": "linux", "arch": "x86_64", "devices": ["gpu"]}],
    "digest": DIGEST_PREFIX + "0" * 64,
}

_json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text()
    | st.sampled_from(["", "\ud800", "\x1b[2J", "x" * 4096, "x" * 4097, DIGEST_PREFIX + "f" * 64])
)
json_values = st.recursive(
    _json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def _mutated_manifest(draw: st.DrawFn) -> str:
    document = json.loads(json.dumps(_GOOD_MANIFEST))
    for _ in range(draw(st.integers(1, 4))):
        target = document
        if draw(st.booleans()) and isinstance(document.get("environments"), list):
            environments = document["environments"]
            if environments and isinstance(environments[0], dict):
                target = environments[0]
        field = draw(st.sampled_from([*target, "extra"]) if target else st.just("extra"))
        if draw(st.integers(0, 4)) == 0:
            target.pop(field, None)
        else:
            target[field] = draw(json_values)
    return json.dumps(document, allow_nan=True)


def _encoded(text: str, encoding: str) -> bytes | str:
    if encoding == "str":
        return text
    return text.encode(encoding, "surrogatepass")


manifest_inputs: st.SearchStrategy[bytes | str] = st.one_of(
    st.builds(_encoded, _mutated_manifest(), st.sampled_from(["str", "utf-8", "utf-16"])),
    st.builds(lambda v: json.dumps(v, allow_nan=True), json_values),
    st.binary(max_size=300),
    st.text(max_size=300),
    (st.integers(1, 3000) | st.just(100_000)).map(lambda n: "[" * n + "]" * n),
    (st.integers(1, 3000) | st.just(100_000)).map(lambda n: '{"a":' * n + "1" + "}" * n),
)


def exercise_manifest(data: bytes | str) -> str:
    """Parse `data`; a manifest it accepts must write itself back unchanged."""
    try:
        manifest = BundleManifest.from_json(data)
    except BundleError as exc:
        return type(exc).__name__
    assert BundleManifest.from_json(manifest.to_json()) == manifest
    return "parsed"


# --- damaging bytes -------------------------------------------------------------------------------

_INTERESTING = (0, 1, 2, 3, 4, 7, 8, 20, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF)
_INTERESTING_32 = (0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFF0, 0xFFFFFFFE, 0xFFFFFFFF)


def _value(draw: st.DrawFn, size: int, original: int, length: int) -> int:
    top = (1 << (8 * size)) - 1
    choices = [*_INTERESTING, *(_INTERESTING_32 if size == 4 else ())]
    choices += [original - 1, original + 1, length - 1, length, length + 1]
    pick = draw(st.sampled_from(choices) | st.integers(0, top))
    return pick & top


def _flat_fields(seed: bytes) -> list[tuple[str, int, int, str]]:
    """(name, offset, size, byte order) of every length, count and offset field."""
    fields = []
    for name, offset in flat_sections(seed).items():
        if name.startswith("entry_"):
            for word, part in enumerate(("ns", "key_off", "key_len", "val_off", "val_len")):
                fields.append((f"{name}.{part}", offset + 4 * word, 4, "<"))
        elif name not in ("manifest", "index", "data", "end") and not name.startswith("carried"):
            fields.append((name, offset, 4, "<"))
    return fields


_carried_values = st.one_of(
    st.sampled_from([*HOSTILE_F64.values(), UNKNOWN]),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda v: struct.pack("<d", v)),
    st.binary(min_size=8, max_size=8),
)


@st.composite
def _carried_edits(draw: st.DrawFn, blob: bytearray, seed: bytes) -> list[str]:
    """Set what some entries of a format-2 flat bundle carry (written_at, cost) to f64s
    that are hostile, absurd or fine."""
    sections = flat_sections(seed)
    slots = [o for name, o in sections.items() if name.startswith("carried_")]
    steps = []
    for _ in range(draw(st.integers(0, 3)) if slots else 0):
        at = draw(st.sampled_from(slots)) + draw(st.sampled_from([0, 8]))
        if at + 8 > len(blob):
            continue
        raw = draw(_carried_values)
        steps.append(f"carried f64@{at}: {bytes(blob[at : at + 8]).hex()} -> {raw.hex()}")
        blob[at : at + 8] = raw
    return steps


_SQLITE_HEADER = [
    ("page_size", 16, 2),
    ("write_version", 18, 1),
    ("read_version", 19, 1),
    ("reserved", 20, 1),
    ("max_payload", 21, 1),
    ("min_payload", 22, 1),
    ("leaf_payload", 23, 1),
    ("change_counter", 24, 4),
    ("page_count", 28, 4),
    ("freelist_trunk", 32, 4),
    ("freelist_count", 36, 4),
    ("schema_cookie", 40, 4),
    ("schema_format", 44, 4),
    ("largest_root", 52, 4),
    ("text_encoding", 56, 4),
    ("incremental_vacuum", 64, 4),
    ("version_valid_for", 92, 4),
]


def _sqlite_fields(seed: bytes) -> list[tuple[str, int, int, str]]:
    fields = [(name, offset, size, ">") for name, offset, size in _SQLITE_HEADER]
    page_size = struct.unpack_from(">H", seed, 16)[0] or 65536
    for page in range(len(seed) // page_size):
        base = page * page_size + (100 if page == 0 else 0)
        kind = seed[base]
        fields += [
            (f"page{page + 1}.type", base, 1, ">"),
            (f"page{page + 1}.first_freeblock", base + 1, 2, ">"),
            (f"page{page + 1}.cells", base + 3, 2, ">"),
            (f"page{page + 1}.content_start", base + 5, 2, ">"),
            (f"page{page + 1}.fragmented", base + 7, 1, ">"),
            (f"page{page + 1}.next_or_first_word", page * page_size, 4, ">"),
        ]
        header = 12 if kind in (2, 5) else 8
        if kind in (2, 5):
            fields.append((f"page{page + 1}.right_child", base + 8, 4, ">"))
        if kind in (2, 5, 10, 13):
            cells = struct.unpack_from(">H", seed, base + 3)[0]
            fields += [
                (f"page{page + 1}.cell{i}", base + header + 2 * i, 2, ">")
                for i in range(min(cells, 6))
            ]
    return fields


_UNSIGNED = {1: "B", 2: "H", 4: "I"}


@st.composite
def _field_edits(
    draw: st.DrawFn, blob: bytearray, fields: list[tuple[str, int, int, str]]
) -> list[str]:
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        name, offset, size, order = draw(st.sampled_from(fields))
        if offset + size > len(blob):
            continue
        fmt = order + _UNSIGNED[size]
        original = struct.unpack_from(fmt, blob, offset)[0]
        value = _value(draw, size, original, len(blob))
        struct.pack_into(fmt, blob, offset, value)
        steps.append(f"{name}@{offset}: {original} -> {value}")
    return steps


@st.composite
def _byte_edits(draw: st.DrawFn, blob: bytearray, donor: bytes) -> list[str]:
    steps = []
    for _ in range(draw(st.integers(0, 4))):
        if not blob:
            break
        op = draw(st.sampled_from(["flip", "set", "truncate", "delete", "insert", "splice"]))
        at = draw(st.integers(0, len(blob) - 1))
        if op == "flip":
            bit = draw(st.integers(0, 7))
            blob[at] ^= 1 << bit
            steps.append(f"flip bit {bit} of byte {at}")
        elif op == "set":
            value = draw(st.integers(0, 255))
            steps.append(f"byte {at}: {blob[at]} -> {value}")
            blob[at] = value
        elif op == "truncate":
            steps.append(f"truncate to {at} of {len(blob)}")
            del blob[at:]
        elif op == "delete":
            size = draw(st.integers(1, 64))
            steps.append(f"delete {size} at {at}")
            del blob[at : at + size]
        elif op == "insert":
            extra = draw(st.binary(min_size=1, max_size=64))
            steps.append(f"insert {extra.hex()} at {at}")
            blob[at:at] = extra
        else:
            start = draw(st.integers(0, len(donor) - 1))
            size = draw(st.integers(1, 256))
            chunk = donor[start : start + size]
            overwrite = draw(st.booleans())
            steps.append(f"splice {len(chunk)} B from {start} of a seed over {at}")
            if overwrite:
                blob[at : at + len(chunk)] = chunk
            else:
                blob[at:at] = chunk
    return steps


@st.composite
def _page_edits(draw: st.DrawFn, blob: bytearray) -> list[str]:
    page_size = struct.unpack_from(">H", blob, 16)[0] or 65536
    pages = len(blob) // page_size
    steps = []
    for _ in range(draw(st.integers(0, 2))):
        if pages < 2:
            break
        op = draw(st.sampled_from(["zero", "swap", "copy", "cut"]))
        a, b = (draw(st.integers(1, pages - 1)) for _ in range(2))
        pa, pb = (
            slice(a * page_size, (a + 1) * page_size),
            slice(b * page_size, (b + 1) * page_size),
        )
        if op == "zero":
            blob[pa] = bytes(page_size)
        elif op == "swap":
            blob[pa], blob[pb] = blob[pb], blob[pa]
        elif op == "copy":
            blob[pb] = blob[pa]
        else:
            del blob[a * page_size :]
            pages = a
        steps.append(f"page {op} {a + 1}" + (f" {b + 1}" if op in ("swap", "copy") else ""))
    return steps


_NTH_ROW = "rowid = (SELECT rowid FROM entries LIMIT 1 OFFSET ?)"
_SQL_EDITS = {
    "manifest": "UPDATE meta SET v = ? WHERE k = 'manifest'",
    "value": f"UPDATE entries SET value = ? WHERE {_NTH_ROW}",
    "key": f"UPDATE entries SET key = ? WHERE {_NTH_ROW}",
    "namespace": f"UPDATE entries SET namespace = ? WHERE {_NTH_ROW}",
    "origin": f"UPDATE entries SET origin = ? WHERE {_NTH_ROW}",
    "written_at": f"UPDATE entries SET written_at = ? WHERE {_NTH_ROW}",
    "cost": f"UPDATE entries SET cost = ? WHERE {_NTH_ROW}",
    "delete": f"DELETE FROM entries WHERE {_NTH_ROW}",
    "insert": "INSERT OR REPLACE INTO entries (namespace, key, value, origin) VALUES (?, ?, ?, 1)",
}
_SQL_SCRIPTS = {
    "wal": "PRAGMA journal_mode=WAL",
    "extra column": "ALTER TABLE entries ADD COLUMN extra TEXT",
    "extra table": "CREATE TABLE extra (x)",
    "trigger": "CREATE TRIGGER t AFTER INSERT ON meta BEGIN SELECT 1; END",
    "view over entries": "ALTER TABLE entries RENAME TO e2; "
    "CREATE VIEW entries AS SELECT * FROM e2",
    "page size 512": "PRAGMA page_size=512; VACUUM",
    "page size 65536": "PRAGMA page_size=65536; VACUUM",
    "secure delete": "PRAGMA secure_delete=ON; DELETE FROM entries WHERE rowid % 3 = 0",
    "no index": "PRAGMA writable_schema=ON; "
    "UPDATE sqlite_master SET sql = replace(sql, 'PRIMARY KEY (namespace, key)', "
    "'CHECK (1)') WHERE name = 'entries'",
    # Rows out of key order (by a fixed rule: generation must not depend on chance).
    "unsorted rows": "CREATE TABLE e2 AS SELECT * FROM entries ORDER BY substr(key, 2), key DESC; "
    "DELETE FROM entries; INSERT INTO entries SELECT * FROM e2; DROP TABLE e2",
}
_sql_values = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40),
    st.integers(),
    st.floats(allow_nan=False),
    st.sampled_from(["", "\x00", "app", "app/1", "app//x", "\ud800"]),
    st.sampled_from([-1.0, float("inf"), float("-inf"), 1e300, 2.0**32, 253402300800.0, "3.5"]),
)


@st.composite
def _sql_edits(draw: st.DrawFn, seed: bytes) -> tuple[bytes, list[str]]:
    """Edits made through SQLite itself: a well-formed database holding the wrong things."""
    steps: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "edit.db"
        path.write_bytes(seed)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous = OFF")  # a scratch file: no fsync per edit
        try:
            for _ in range(draw(st.integers(1, 3))):
                what = draw(st.sampled_from([*_SQL_EDITS, *_SQL_SCRIPTS]))
                try:
                    if what in _SQL_SCRIPTS:
                        conn.executescript(_SQL_SCRIPTS[what])
                        steps.append(f"sql: {what}")
                        continue
                    if what == "manifest":
                        value: object = draw(manifest_inputs | _sql_values)
                        conn.execute(_SQL_EDITS[what], (value,))
                    elif what == "insert":
                        row = (draw(_sql_values), draw(_sql_values), draw(_sql_values))
                        conn.execute(_SQL_EDITS[what], row)
                        value = row
                    elif what == "delete":
                        value = draw(st.integers(0, 120))
                        conn.execute(_SQL_EDITS[what], (value,))
                    else:
                        value = draw(_sql_values)
                        conn.execute(_SQL_EDITS[what], (value, draw(st.integers(0, 120))))
                    steps.append(f"sql: set {what} {value!r:.60}")
                except (sqlite3.Error, UnicodeEncodeError, OverflowError):
                    continue  # an edit SQLite refuses makes no case
        finally:
            conn.close()
        for leftover in ("-wal", "-shm"):
            Path(f"{path}{leftover}").unlink(missing_ok=True)
        return path.read_bytes(), steps


# --- sealed bundles: hostile content under a correct digest ---------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=24)
namespace_names = st.one_of(
    st.sampled_from(
        ["", "/", "a", "app/1", "app/1/x", "app//", "app/1/", "\x1b[2J\x1b[31mok", "\x00", "\x85"]
    ),
    st.sampled_from(["n" * 4096, "n" * 4097, "app/1/" + "p" * 70_000]),
    _text,
    st.builds(lambda a, b, c: f"{a}/{b}/{c}", _text, _text, _text),
)
entry_sets = st.dictionaries(
    namespace_names,
    st.dictionaries(st.binary(max_size=40), st.binary(max_size=200), max_size=6),
    max_size=3,
)


Carried = dict[tuple[str, bytes], bytes]
"""What entries carry (format 2): 16 bytes per (namespace, key); absent: unknown."""


def _ordered(
    entries: dict[str, dict[bytes, bytes]], carried: Carried | None
) -> list[tuple[str, bytes, bytes, bytes | None]]:
    return [
        (name, key, entries[name][key], None if carried is None else carried.get((name, key)))
        for name in sorted((n for n in entries if entries[n]), key=lambda n: n.encode())
        for key in sorted(entries[name])
    ]


def sealed_digest(entries: dict[str, dict[bytes, bytes]], carried: Carried | None = None) -> str:
    """The digest of `entries` (format 1), or with what they carry (format 2), framed as
    docs/bundle-format.md says."""
    if carried is None:
        return entries_digest(_ordered(entries, None), 1)
    ordered = [(n, k, v, c or UNKNOWN * 2) for n, k, v, c in _ordered(entries, carried)]
    return entries_digest(ordered, 2)


def _sealed_manifest(
    draw: st.DrawFn, entries: dict[str, dict[bytes, bytes]], carried: Carried | None
) -> bytes:
    document = json.loads(json.dumps(_GOOD_MANIFEST))
    document["name"] = draw(st.just("sealed") | _text | st.just("x" * 4096))
    document["digest"] = sealed_digest(entries, carried)
    return json.dumps(document, ensure_ascii=False).encode()


@st.composite
def _carried_for(draw: st.DrawFn, entries: dict[str, dict[bytes, bytes]]) -> Carried | None:
    """None (format 1), or what some of `entries` carry (format 2): hostile or fine."""
    if draw(st.booleans()):
        return None
    keys = [(name, key) for name, items in entries.items() for key in items]
    carried: Carried = {}
    for slot in keys:
        if draw(st.booleans()):
            carried[slot] = draw(_carried_values) + draw(_carried_values)
    return carried


def write_flat(
    entries: dict[str, dict[bytes, bytes]], manifest: bytes, carried: Carried | None = None
) -> bytes:
    """A flat bundle of `entries`, laid out as docs/bundle-format.md says: format 1, or
    format 2 carrying `carried` (unknown for entries it leaves out)."""
    u32 = struct.Struct("<I").pack
    names = sorted((n for n in entries if entries[n]), key=lambda n: n.encode())
    version = 1 if carried is None else 2
    out = bytearray(FLAT_MAGIC + u32(version) + u32(len(manifest)) + manifest + u32(len(names)))
    for name in names:
        out += u32(len(name.encode())) + name.encode()
    index, carrying, data = bytearray(), bytearray(), bytearray()
    for ns_id, name in enumerate(names):
        for key in sorted(entries[name]):
            value = entries[name][key]
            k_off, v_off = len(data), len(data) + len(key)
            index += struct.pack("<IIIII", ns_id, k_off, len(key), v_off, len(value))
            if carried is not None:
                carrying += carried.get((name, key), UNKNOWN * 2)
            data += key + value
    return bytes(out + u32(len(index) // 20) + index + carrying + data)


def write_sqlite(
    seed: bytes,
    entries: dict[str, dict[bytes, bytes]],
    manifest: bytes,
    encoding: str = "UTF-8",
    carried: Carried | None = None,
) -> bytes:
    """A SQLite bundle of `entries`: a valid seed's schema and meta rows (so of its
    format), its manifest replaced, in a new database of the given text encoding
    (SQLite offers three). In format 2 rows carry `carried` (as f64s SQLite stores:
    NaN as NULL), and the digest is taken over what was stored, as anyone could."""
    source = sqlite3.connect(":memory:")
    try:
        source.deserialize(seed)
        schema = [r[0] for r in source.execute("SELECT sql FROM sqlite_master WHERE sql NOT NULL")]
        meta = source.execute("SELECT k, v FROM meta WHERE k != 'manifest'").fetchall()
    finally:
        source.close()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sealed.db"
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous = OFF")  # a scratch file: no fsync per row
            conn.execute(f"PRAGMA encoding = '{encoding}'")
            for statement in schema:
                conn.execute(statement)
            conn.executemany("INSERT INTO meta VALUES (?, ?)", meta)
            conn.execute("INSERT INTO meta VALUES ('manifest', ?)", (manifest.decode(),))
            columns = [row[1] for row in conn.execute("PRAGMA table_info(entries)")]
            if "cost" in columns:
                conn.executemany(
                    "INSERT INTO entries (namespace, key, value, origin, written_at, cost) "
                    "VALUES (?, ?, ?, 1, ?, ?)",
                    [
                        (n, k, v, *struct.unpack("<dd", c or UNKNOWN * 2))
                        for n, k, v, c in _ordered(entries, carried or {})
                    ],
                )
                reseal_sqlite(conn)
            else:
                conn.executemany(
                    "INSERT INTO entries (namespace, key, value, origin) VALUES (?, ?, ?, 1)",
                    [(n, k, v) for n in sorted(entries) for k, v in sorted(entries[n].items())],
                )
        finally:
            conn.close()
        return path.read_bytes()


KINDS = [
    "flat",  # a valid flat bundle with length, count and offset fields changed
    "flat-data",  # bytes of its namespaces, keys and values changed, then resealed
    "flat-sealed",  # hostile namespaces, keys and values under a correct digest
    "sqlite",  # a valid SQLite bundle with header and page fields changed
    "sqlite-sql",  # rows, manifest and schema changed through SQLite
    "sqlite-sealed",
    "random",
    "flat-magic",  # the flat magic, then random bytes
    "sqlite-magic",  # a SQLite header, then random bytes
]


@st.composite
def bundle_cases(draw: st.DrawFn) -> Case:
    """Damaged bundles of both formats, and random bytes with and without a magic."""
    seeds = seed_bundles()
    kind = draw(st.sampled_from(KINDS))
    steps: list[str] = []
    donor = draw(st.sampled_from([*seeds.flat, *seeds.sqlite]))
    if kind.endswith("-sealed"):
        entries = draw(entry_sets)
        carried = draw(_carried_for(entries))
        manifest = _sealed_manifest(draw, entries, carried)
        shown = {n[:40]: {k[:20]: v[:20] for k, v in e.items()} for n, e in entries.items()}
        steps.append(f"entries {shown!r:.600}")
        if carried is not None:
            shown_carried = {key[:20]: raw.hex() for (_, key), raw in carried.items()}
            steps.append(f"carrying {shown_carried!r:.600}")
        if kind == "flat-sealed":
            data = write_flat(entries, manifest, carried)
        else:
            encoding = draw(st.sampled_from(["UTF-8", "UTF-8", "UTF-16le", "UTF-16be"]))
            steps.append(f"text encoding {encoding}")
            seed = seeds.sqlite[2] if carried is None else seeds.sqlite[0]
            data = write_sqlite(seed, entries, manifest, encoding, carried)
        return Case(kind=kind, steps=tuple(steps), data=data, reseal=False)
    if kind == "flat-data":
        seed = seeds.flat[1]
        blob = bytearray(seed)
        start = flat_sections(seed)["namespace_count"]
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(start, len(blob) - 1))
            value = draw(st.integers(0, 255))
            steps.append(f"byte {at}: {blob[at]} -> {value}")
            blob[at] = value
        return Case(kind=kind, steps=tuple(steps), data=bytes(blob), reseal=True)
    if kind == "flat":
        seed_index = draw(st.integers(0, len(seeds.flat) - 1))
        seed = seeds.flat[seed_index]
        blob = bytearray(seed)
        steps.append(f"flat seed {seed_index}")
        if draw(st.integers(0, 5)) == 0:
            text = draw(manifest_inputs)
            raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
            old = struct.unpack_from("<I", blob, 12)[0]
            blob[12 : 16 + old] = struct.pack("<I", len(raw)) + raw
            steps.append(f"manifest replaced by {raw[:80]!r}")
        else:
            steps += draw(_carried_edits(blob, seed))
            steps += draw(_field_edits(blob, _flat_fields(seed)))
    elif kind in ("sqlite", "sqlite-sql"):
        seed_index = draw(st.integers(0, len(seeds.sqlite) - 1))
        seed = seeds.sqlite[seed_index]
        steps.append(f"sqlite seed {seed_index}")
        if kind == "sqlite-sql":
            edited, sql_steps = draw(_sql_edits(seed))
            blob = bytearray(edited)
            steps += sql_steps
        else:
            blob = bytearray(seed)
            steps += draw(_field_edits(blob, _sqlite_fields(seed)))
            steps += draw(_page_edits(blob))
    elif kind == "flat-magic":
        blob = bytearray(FLAT_MAGIC + draw(st.binary(max_size=600)))
    elif kind == "sqlite-magic":
        blob = bytearray(seeds.sqlite[0][:100] + draw(st.binary(max_size=8192)))
    else:
        blob = bytearray(draw(st.binary(max_size=2048)))
    if kind != "sqlite-sql" or draw(st.booleans()):
        steps += draw(_byte_edits(blob, donor))
    reseal = kind in ("flat", "sqlite", "sqlite-sql") and draw(st.booleans())
    return Case(kind=kind, steps=tuple(steps), data=bytes(blob), reseal=reseal)


# --- running every reader over one case ---------------------------------------------------


async def _served_digest(bundle: Bundle) -> str:
    """The digest over what `bundle` serves, framed as docs/bundle-format.md says."""
    digest = hashlib.blake2b(digest_size=32, person=b"warmenv-entries")
    names = sorted((s.namespace for s in await bundle.namespaces()), key=lambda n: n.encode())
    for name in names:
        raw = name.encode()
        async for key, value in bundle.scan(name):
            for part in (raw, key, value):
                digest.update(len(part).to_bytes(8, "little") + part)
    return DIGEST_PREFIX + digest.hexdigest()


async def reseal(path: Path) -> bool:
    """Write the digest of what the readers serve into the manifest, as anyone could.

    In format 2 the digest covers what entries carry as stored, which readers
    serve only as believed: there the reader's own digest is the one written.
    """
    try:
        async with open_bundle(path) as bundle:
            old = bundle.manifest.digest
            if bundle.format_version == 1:
                new = await _served_digest(bundle)
            else:
                new = await bundle.compute_digest()
    except ALLOWED:
        return False
    data = path.read_bytes()
    if old == new or old.encode() not in data:
        return False
    path.write_bytes(data.replace(old.encode(), new.encode()))
    return True


def check_believed(written_at: float | None, cost: float | None) -> None:
    """What an entry carries, as served or recorded: in range, or unknown."""
    assert written_at is None or (type(written_at) is float and 0 <= written_at < WRITTEN_AT_LIMIT)
    assert cost is None or (type(cost) is float and 0 <= cost < COST_LIMIT)


async def read_everything(bundle: Bundle) -> None:
    """Everything a caller may ask of an open bundle."""
    manifest = bundle.manifest
    assert BundleManifest.from_json(manifest.to_json()) == manifest
    bundle.describe()
    assert bundle.format_version in (1, 2)
    for summary in await bundle.namespaces():
        keys: list[bytes] = []
        async for key, value in bundle.scan(summary.namespace, batch_size=7):
            assert isinstance(key, bytes) and isinstance(value, bytes)
            if len(keys) < 5:
                keys.append(key)
        carrying = bundle.scan_with_provenance(summary.namespace, batch_size=5)
        async for key, value, written_at, cost in carrying:
            assert isinstance(key, bytes) and isinstance(value, bytes)
            check_believed(written_at, cost)
        for key in keys:
            await bundle.get(summary.namespace, key)
        await bundle.get(summary.namespace, b"\xff" * 9 + b"missing")
    await bundle.get("no/such/namespace", b"k")


async def _stage(name: str, outcomes: dict[str, str], run: Callable[[], Awaitable[object]]) -> None:
    try:
        await run()
    except ALLOWED as exc:
        outcomes[name] = type(exc).__name__
    except BaseException as exc:
        exc.add_note(f"fuzz stage: {name}")
        raise
    else:
        outcomes[name] = "ok"


async def exercise_bundle(case: Case, workdir: Path) -> dict[str, str]:
    """Every reader over `case`; the outcome of each stage ("ok" or the BundleError/OSError).

    Imports go into a new environment, so that nothing one case leaves behind
    can change what the next one does.
    """
    path = workdir / "case.bundle"
    for stale in workdir.glob("case.bundle*"):
        stale.unlink()
    shutil.rmtree(workdir / "env", ignore_errors=True)
    path.write_bytes(case.data)
    outcomes: dict[str, str] = {}
    if case.reseal:
        outcomes["resealed"] = str(await reseal(path))
    data = path.read_bytes()

    async def via(opener: Callable[[Path], AbstractAsyncContextManager[Bundle]]) -> None:
        async with opener(path) as bundle:
            await read_everything(bundle)

    async def in_memory() -> None:
        bundle = FlatBundle.from_bytes(data)
        try:
            await read_everything(bundle)
            await import_bundle(bundle, env)
            await _check_recorded(env)
        finally:
            await bundle.aclose()
            await _empty(env)

    async def imported() -> None:
        try:
            await import_bundle(path, env)
            await _check_recorded(env)
        finally:
            await _empty(env)

    async def read_ahead() -> None:
        # What an import by URL reads first (`FileFormat.header`, over prefixes of the
        # file) raises only bundle errors, and never names other namespaces than the
        # bundle opened whole holds: the list it believes must be the entries'.
        found = sniff(data)
        if found is None or not found.header_in_front:
            return
        told = [
            header.namespaces
            for size in sorted({100, 4096, 65536, len(data)})
            if (header := await anyio.to_thread.run_sync(found.header, data[:size], "case"))
            is not None
            and header.namespaces is not None
        ]
        try:
            async with open_bundle(path) as bundle:
                held = sorted(s.namespace for s in await bundle.namespaces())
        except ALLOWED:
            return
        for names in told:
            assert sorted(names) == held or found.names_in_front, (names, held)

    await _stage("read ahead", outcomes, read_ahead)
    await _stage("open_bundle", outcomes, lambda: via(open_bundle))
    await _stage("FlatBundle.open", outcomes, lambda: via(FlatBundle.open))
    await _stage("SqliteBundle.open", outcomes, lambda: via(SqliteBundle.open))
    async with open_environment("fuzz", root=workdir / "env") as env:
        await _stage("FlatBundle.from_bytes", outcomes, in_memory)
        await _stage("import_bundle", outcomes, imported)
    await _stage("preflight", outcomes, lambda: preflight(path, version="1"))
    return outcomes


async def _check_recorded(env: Environment) -> None:
    """Every imported entry records a written_at and cost a reader believes, or none."""
    for summary in await env.namespaces():
        storage = env.storage(summary.namespace)
        async for key, _ in storage.scan():
            info = await storage.info(key)
            assert info is not None
            check_believed(info.written_at, info.cost)


async def _empty(env: Environment) -> None:
    for summary in await env.namespaces():
        await env.storage(summary.namespace).purge()
