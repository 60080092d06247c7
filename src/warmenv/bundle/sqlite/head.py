"""A SQLite bundle's manifest, read from the first bytes of its file before its body.

Export writes a SQLite bundle's `meta` rows (the manifest with a digest and
signature of their final lengths) before any entry, and fills them in place
once the entries are written (`StagingFile.reserve`), so the manifest lies
in the file's first pages: page 1 (the schema), the tables' root pages and
the manifest's own overflow pages. Reading them needs no parser of SQLite's
pages here: the bytes read so far are handed to SQLite as a database held
in memory whose size is what was read (`_sqlite.open_image`), so a page
beyond them is damage to SQLite, and the caller reads further ahead.

What this reads is used only to refuse a bundle before its body is fetched
(of no namespace of the application's version, or signed otherwise than the
trust asks): a bundle that passes is downloaded whole, opened and checked as
any other, its manifest's list of namespaces against its entries
(`warmenv.bundle.base.check_listed`). Anything this cannot read positively
(not warmenv's schema, another `meta` row, the pages not all there yet) is
`None`: read further, or download it all and let the full checks say what
is wrong.
"""

from __future__ import annotations

import sqlite3

from warmenv import _sqlite
from warmenv.bundle.base import Header
from warmenv.bundle.errors import InvalidManifestError, UnsupportedSchemaError
from warmenv.bundle.manifest import MAX_MANIFEST_BYTES, BundleManifest, check_manifest_size
from warmenv.bundle.sqlite import schema as bundle_schema
from warmenv.persistence.sqlite import schema

__all__ = ["HEADER_LIMIT", "declared_size", "read_header"]

HEADER_LIMIT = 2 << 20
"""Bytes of a SQLite bundle's start read ahead at most: its first five pages (of up to
64 KiB) and the largest manifest with its list that export writes fit well inside."""

_FILE_HEADER = 100  # SQLite's file header, at the start of page 1


def declared_size(head: bytes) -> int | None:
    """The bytes the SQLite file starting with `head` needs: its header's page size times
    the page count it records (where SQLite itself would believe that count), or the
    header's own 100 bytes when `head` is shorter."""
    if len(head) < _FILE_HEADER:
        return _FILE_HEADER
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    declared = int.from_bytes(head[28:32], "big")
    if page_size < 512 or page_size & (page_size - 1) or head[24:28] != head[92:96]:
        return None  # not a size SQLite would believe: the full open says what is wrong
    return declared * page_size or None


def read_header(data: bytes, label: str) -> Header | None:
    """The manifest of the SQLite bundle whose file starts with `data` (and the names
    of its namespaces, where it lists them), or `None`: not all there, or not read."""
    if len(data) < _FILE_HEADER:
        return None
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return None  # not a database SQLite would open: the full open says so
    pages = len(data) // page_size
    declared = int.from_bytes(data[28:32], "big")
    if declared and data[24:28] == data[92:96]:  # the size SQLite itself believes
        pages = min(pages, declared)
    if not pages:
        return None
    image = bytearray(data[: pages * page_size])
    # SQLite refuses a file shorter than its header says: it is told this one is whole.
    image[28:32] = pages.to_bytes(4, "big")
    image[92:96] = image[24:28]
    try:
        connection = _sqlite.open_image(bytes(image))
    except sqlite3.Error:
        return None
    try:
        manifest = _manifest(connection, label)
    except sqlite3.Error:
        return None  # a page not read yet (or damage, which the full open will name)
    finally:
        connection.close()
    if manifest is None:
        return None
    try:
        parsed = BundleManifest.from_json(manifest)
    except (InvalidManifestError, UnsupportedSchemaError) as exc:
        raise type(exc)(f"{label}: {exc}") from None
    return Header.told(parsed, parsed.namespaces, label)


def _manifest(conn: sqlite3.Connection, label: str) -> str | None:
    """The manifest's text, if the schema is exactly a bundle's and `meta` holds only
    a bundle's rows; `None` otherwise."""
    if bundle_schema.first_view(conn) is not None:
        return None  # never read a table a view could stand in for
    if all(bundle_schema.unlike_ours(conn, format) is not None for format in (2, 1)):
        return None
    if bundle_schema.foreign_meta(conn) is not None:
        return None
    if not bundle_schema.meta_index_agrees(conn):
        return None  # damage: the full open names it
    try:
        size = bundle_schema.manifest_size(conn, limit=MAX_MANIFEST_BYTES)
    except sqlite3.DataError:
        return None  # over the limit: the full open refuses it, naming it
    if size is None:
        return None  # no manifest up front (an environment; the full open says so)
    check_manifest_size(size, label)
    text = schema.meta_value(conn, "manifest", limit=MAX_MANIFEST_BYTES)
    return text if isinstance(text, str) else None
