"""The format registry: a file's format is told by its first bytes, in one place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from warmenv.bundle import BundleFormat, open_bundle
from warmenv.bundle.formats import FORMATS, of, sniff

pytestmark = pytest.mark.anyio


async def test_an_exported_bundle_sniffs_as_the_format_it_was_written_in(
    bundle_path: Path, bundle_format: str
) -> None:
    found = sniff(bundle_path.read_bytes()[:16])
    assert found is of(BundleFormat(bundle_format))
    async with open_bundle(bundle_path) as bundle:
        assert bundle.format == found.format


def test_bytes_of_no_format_sniff_as_none() -> None:
    assert sniff(b"") is None
    assert sniff(b"PK\x03\x04 a zip, not a bundle") is None


def test_every_format_is_listed_once_under_its_name() -> None:
    assert sorted(f.format for f in FORMATS) == sorted(BundleFormat)
    assert len({f.magic for f in FORMATS}) == len(FORMATS)


def test_a_sqlite_database_without_a_manifest_is_no_bundle(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    found = sniff(other.read_bytes()[:16])
    assert found is of(BundleFormat.SQLITE)
    assert not found.is_bundle(other)
