"""A SQLite bundle's indexes are proven to hold its rows before any read goes through them.

The digest (and so a signature) vouches for the rows, read in rowid order;
every lookup by key (a `get`, a page of a namespace, the namespace totals, a
`meta` value) reads the primary key's index. A signed bundle whose index has
two rowids swapped (2 bytes edited) passed `verify`, and a `get` or an import
with `validate=` then paired each of the two keys with the other's value
(attack review 2, finding 1). These tests edit the index bytes as an attacker
with the file would, and every reader must refuse the file or serve exactly
the entries the digest vouches for.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conftest import KERNELS, env_contents, sample_entries
from helpers import counted
from test_bundle_rowids import _respaced
from warmenv import Environment, Namespace, open_environment
from warmenv.bundle import (
    BundleError,
    CorruptBundleError,
    PublicKey,
    SigningKey,
    export_bundle,
    generate_key,
    import_bundle,
    open_bundle,
    preflight,
)
from warmenv.bundle.open import open_snapshot
from warmenv.bundle.sqlite import file as bundle_file
from warmenv.persistence.namespace import matches_any

pytestmark = pytest.mark.anyio

NS = Namespace("app", "idx", version="1")
ENTRIES = {b"k%03d" % i: b"value-of-k%03d" % i for i in range(40)}

_SWAPPED = (
    "signed SQLite bundle whose entries index pairs keys with other rows (2 bytes edited): "
    "open_bundle, import (validate=, trust=, verify on and off), preflight (asyncio, uvloop, trio)",
    "CorruptBundleError from every reader before any entry is served or written",
)
_EDITED = (
    "SQLite bundle index page, every byte of its cells edited (asyncio, uvloop, trio)",
    "each edit refused with a BundleError, or every key served its own value",
)


def _varint(data: bytes | bytearray, at: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        byte = data[at + i]
        if i == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, at + i + 1
    raise AssertionError("unreachable")


def _index_page(path: Path) -> tuple[int, int]:
    """(offset, size) of the entries index's root page, a single leaf for 40 entries."""
    conn = sqlite3.connect(path)
    try:
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'sqlite_autoindex_entries_1'"
        ).fetchone()
    finally:
        conn.close()
    return (root - 1) * page_size, page_size


def _rowid_fields(page: bytes | bytearray) -> dict[bytes, tuple[int, int]]:
    """Each index cell's key, with the (offset, length) in the page of its rowid field."""
    assert page[0] == 0x0A, "the index root is not a single leaf page"
    found = {}
    for cell in range(int.from_bytes(page[3:5], "big")):
        at = int.from_bytes(page[8 + 2 * cell : 10 + 2 * cell], "big")
        _, start = _varint(page, at)
        header, at = _varint(page, start)
        types = []
        while at < start + header:
            kind, at = _varint(page, at)
            types.append(kind)
        fields = []
        at = start + header
        for kind in types:
            size = {8: 0, 9: 0, 5: 6, 6: 8, 7: 8}.get(kind, kind if kind < 5 else (kind - 12) // 2)
            fields.append((at, size))
            at += size
        (key_at, key_size), rowid = fields[1], fields[2]
        found[bytes(page[key_at : key_at + key_size])] = rowid
    return found


def swap_rowids(good: Path, out: Path, a: bytes, b: bytes) -> Path:
    """`good` with the rowids of keys `a` and `b` swapped in its entries index, nothing else."""
    offset, size = _index_page(good)
    data = bytearray(good.read_bytes())
    page = data[offset : offset + size]
    (at_a, size_a), (at_b, size_b) = _rowid_fields(page)[a], _rowid_fields(page)[b]
    assert size_a == size_b
    page[at_a : at_a + size_a], page[at_b : at_b + size_b] = (
        page[at_b : at_b + size_b],
        page[at_a : at_a + size_a],
    )
    data[offset : offset + size] = page
    out.write_bytes(bytes(data))
    return out


@pytest.fixture
async def signed(tmp_path: Path) -> tuple[Path, PublicKey]:
    public = generate_key(tmp_path / "k.pem")
    async with open_environment("source", root=tmp_path / "source") as env:
        await env.storage(NS).insert_many(ENTRIES.items())
        path = tmp_path / "good.bundle"
        await export_bundle(
            env, path, name="idx", version="1", format="sqlite",
            sign=SigningKey.load(tmp_path / "k.pem"),
        )  # fmt: skip
    return path, public


@pytest.fixture
def swapped(signed: tuple[Path, PublicKey], tmp_path: Path) -> Path:
    path = swap_rowids(signed[0], tmp_path / "swapped.bundle", b"k001", b"k002")
    conn = sqlite3.connect(path)
    read = "SELECT value FROM entries {} WHERE namespace = ? AND key = ?"
    try:  # the premise: the rows (and so the digest) are untouched, the index lies
        assert conn.execute(read.format("NOT INDEXED"), (str(NS), b"k001")).fetchone() == (
            b"value-of-k001",
        )
        assert conn.execute(read.format(""), (str(NS), b"k001")).fetchone() == (b"value-of-k002",)
    finally:
        conn.close()
    return path


@counted(*_SWAPPED)
async def test_a_swapped_index_is_refused_by_open_bundle_before_any_get(swapped: Path) -> None:
    with pytest.raises(CorruptBundleError, match=r"swapped\.bundle"):
        async with open_bundle(swapped) as bundle:
            await bundle.verify()
            pytest.fail(f"served k001 as {await bundle.get(NS, b'k001')!r}")


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "verify=False"])
@pytest.mark.parametrize("validate", [True, False], ids=["validate=", "bulk copy"])
@counted(*_SWAPPED)
async def test_a_swapped_index_is_refused_by_a_trusting_import_and_nothing_is_written(
    swapped: Path,
    signed: tuple[Path, PublicKey],
    cold_env: Environment,
    verify: bool,
    validate: bool,
) -> None:
    check = (lambda namespace, key, value: True) if validate else None
    with pytest.raises(CorruptBundleError, match=r"swapped\.bundle"):
        await import_bundle(swapped, cold_env, trust=[signed[1]], verify=verify, validate=check)
    assert await env_contents(cold_env) == {}


@counted(*_SWAPPED)
async def test_a_swapped_index_is_refused_by_preflight(
    swapped: Path, signed: tuple[Path, PublicKey]
) -> None:
    with pytest.raises(CorruptBundleError, match=r"swapped\.bundle"):
        await preflight(swapped, version="1", namespaces=[NS], trust=[signed[1]])


async def test_the_unedited_bundle_still_imports_every_pair_as_signed(
    signed: tuple[Path, PublicKey], cold_env: Environment
) -> None:
    await import_bundle(signed[0], cold_env, trust=[signed[1]], validate=lambda n, k, v: True)
    storage = cold_env.storage(NS)
    assert {key: await storage.get(key) for key in ENTRIES} == ENTRIES


@counted(*_EDITED)
async def test_no_edit_of_an_index_byte_makes_a_reader_serve_a_wrong_pair(
    signed: tuple[Path, PublicKey], tmp_path: Path
) -> None:
    good, _ = signed
    offset, size = _index_page(good)
    page = good.read_bytes()[offset : offset + size]
    content = int.from_bytes(page[5:7], "big") or 65536
    cells = 8 + 2 * int.from_bytes(page[3:5], "big")
    edited = tmp_path / "edited.bundle"
    for at in [*range(cells), *range(content, size)]:
        for flip in (0x01, 0x80):
            data = bytearray(good.read_bytes())
            data[offset + at] ^= flip
            edited.write_bytes(bytes(data))
            try:
                async with open_bundle(edited) as bundle:
                    await bundle.verify()
                    served = {key: await bundle.get(NS, key) for key in ENTRIES}
                    scanned = dict([pair async for pair in bundle.scan(NS)])
            except BundleError:
                continue
            assert served == ENTRIES, f"byte {at} ^ {flip:#x}"
            assert scanned == ENTRIES, f"byte {at} ^ {flip:#x}"


# --- what reads the rows alone is not moved by the index ----------------------
#
# The bulk copy, the totals of an open and the digest pass read the table by
# rowid, never through the index, so an index edited in any way changes nothing
# an import writes: it is refused (an index pairing a key with another row, by
# every reader) or ignored. Only a reader by key proves the whole index first.


def unreadable_index(good: Path, out: Path) -> Path:
    """`good` with the root page of its entries index zeroed: any read through it fails."""
    offset, size = _index_page(good)
    data = bytearray(good.read_bytes())
    data[offset : offset + size] = bytes(size)
    out.write_bytes(bytes(data))
    return out


def reorder_cells(good: Path, out: Path, first: int, second: int) -> Path:
    """`good` with two cells of its index page swapped in the page's order: every entry
    still names its own row, but the index no longer holds them in key order."""
    offset, _ = _index_page(good)
    data = bytearray(good.read_bytes())
    a, b = offset + 8 + 2 * first, offset + 8 + 2 * second
    data[a : a + 2], data[b : b + 2] = data[b : b + 2], data[a : a + 2]
    out.write_bytes(bytes(data))
    return out


@pytest.fixture
async def three_namespaces(warm_env: Environment, tmp_path: Path) -> Path:
    """A SQLite bundle of `sample_entries()`: three namespaces, 151 entries."""
    path = tmp_path / "three.bundle"
    await export_bundle(warm_env, path, name="three", version="1", format="sqlite")
    return path


@pytest.mark.parametrize(
    ("prefixes", "first"),
    [(None, str(KERNELS)), (["app/1"], str(KERNELS))],
    ids=["every namespace", "a prefix"],
)
async def test_a_bulk_copy_reads_the_bundle_by_rowid_alone(
    three_namespaces: Path,
    cold_env: Environment,
    tmp_path: Path,
    prefixes: list[str] | None,
    first: str,
) -> None:
    unreadable = unreadable_index(three_namespaces, tmp_path / "unreadable.bundle")
    copier = cold_env.bulk_copy(unreadable, prefixes, 16, first=[first])
    assert copier is not None
    batches = [batch async for batch in copier]
    assert [batch for batch in batches if batch.failed] == []
    assert batches[0].last_namespace == first  # the namespaces-first pass ran
    expected = {ns: items for ns, items in sample_entries().items() if matches_any(ns, prefixes)}
    assert await env_contents(cold_env) == expected


@pytest.mark.parametrize("rowids", ["dense", "10^11 apart"])
async def test_a_bundle_opened_to_be_verified_counts_its_rows_without_its_index(
    three_namespaces: Path, tmp_path: Path, rowids: str
) -> None:
    source = three_namespaces
    if rowids != "dense":  # not in runs of rowids: the totals are grouped from the table
        source = _respaced(three_namespaces, tmp_path / "sparse.bundle", ":r * 100000000000")
    unreadable = unreadable_index(source, tmp_path / "unreadable.bundle")
    async with open_snapshot(unreadable, near=tmp_path, verified=True) as bundle:
        totals = [(s.namespace, s.entries, s.bytes) for s in await bundle.namespaces()]
    expected = [
        (ns, len(items), sum(len(k) + len(v) for k, v in items.items()))
        for ns, items in sorted(sample_entries().items())
    ]
    assert totals == expected


@pytest.fixture
def out_of_order(signed: tuple[Path, PublicKey], tmp_path: Path) -> Path:
    path = reorder_cells(signed[0], tmp_path / "out-of-order.bundle", 1, 2)
    conn = sqlite3.connect(path)
    try:  # the premise: through the index, k002 comes before k001; the rows are untouched
        keys = conn.execute(
            "SELECT key FROM entries WHERE namespace = ? ORDER BY key LIMIT 3", (str(NS),)
        ).fetchall()
        assert keys == [(b"k000",), (b"k002",), (b"k001",)]
    finally:
        conn.close()
    return path


@pytest.mark.parametrize("verify", [True, False], ids=["digest checked", "verify=False"])
async def test_an_index_out_of_key_order_changes_nothing_a_bulk_import_writes(
    out_of_order: Path, cold_env: Environment, verify: bool
) -> None:
    report = await import_bundle(out_of_order, cold_env, verify=verify)
    assert report.imported == len(ENTRIES)
    assert await env_contents(cold_env) == {str(NS): ENTRIES}


@pytest.mark.parametrize("reader", ["get", "scan", "import with validate="])
async def test_an_index_out_of_key_order_is_refused_before_a_read_by_key(
    out_of_order: Path, cold_env: Environment, reader: str
) -> None:
    with pytest.raises(CorruptBundleError, match=r"out-of-order\.bundle: SQLite finds it damaged"):
        if reader == "import with validate=":
            await import_bundle(out_of_order, cold_env, verify=False, validate=lambda *_: True)
        else:
            async with open_bundle(out_of_order) as bundle:
                if reader == "get":
                    await bundle.get(NS, b"k001")
                else:
                    [pair async for pair in bundle.scan(NS)]
    assert await env_contents(cold_env) == {}


@pytest.mark.parametrize(
    ("use", "checks"),
    [("open, verify, get and scan", 1), ("bulk import, digest checked", 0)],
)
async def test_the_integrity_check_runs_once_for_readers_by_key_and_never_for_a_bulk_import(
    signed: tuple[Path, PublicKey],
    cold_env: Environment,
    monkeypatch: pytest.MonkeyPatch,
    use: str,
    checks: int,
) -> None:
    # SQLite's full check reads every page and looks every row up in the index; the
    # readers that read by rowid alone do not need it (it was a tenth of an import).
    runs: list[str] = []
    check = bundle_file._integrity

    def counted_check(conn: sqlite3.Connection, label: str) -> None:
        runs.append(label)
        check(conn, label)

    monkeypatch.setattr(bundle_file, "_integrity", counted_check)
    if use == "bulk import, digest checked":
        await import_bundle(signed[0], cold_env)
    else:
        async with open_bundle(signed[0]) as bundle:
            await bundle.verify()
            assert await bundle.get(NS, b"k001") == ENTRIES[b"k001"]
            assert dict([pair async for pair in bundle.scan(NS)]) == ENTRIES
    assert len(runs) == checks
