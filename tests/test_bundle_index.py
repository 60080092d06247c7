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

from conftest import env_contents
from helpers import counted
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
