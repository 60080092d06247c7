"""The SQLite bundle's schema: its formats, their tables, and the checks of a file's version.

A SQLite bundle is a `meta` table (a `schema_version` and the `manifest`)
and an `entries` table of the environment's first four columns, written in
key order. Format 1 (0.1's) has exactly those four; format 2, what export
writes by default, adds what an entry carries to another machine
(`written_at`, `cost`: `warmenv.persistence.carried`), so a hit on the
imported entry can count the time it saved. warmenv 0.1 refuses format 2
(other columns); this warmenv reads both and writes format 1 on request,
exactly as 0.1 did, for readers that know no other. Everything here is the
bundle's alone: the environment's schema (`warmenv.persistence.sqlite.schema`)
knows no bundle format, and this module only borrows its column list and
its helpers for the `meta` table.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from warmenv import _sqlite
from warmenv._text import clean
from warmenv.persistence import carried
from warmenv.persistence.sqlite import schema

__all__ = [
    "BUNDLE_VERSION",
    "CARRIED_READ",
    "COLUMNS",
    "SCHEMA_VERSIONS",
    "create",
    "first_view",
    "foreign_meta",
    "has_manifest",
    "meta_index_agrees",
    "manifest_size",
    "newer_version",
    "read_only_uri",
    "unlike_ours",
    "version_unlike",
]

BUNDLE_VERSION = "2"
"""The newest format this warmenv reads and writes (its meta `schema_version`)."""

COLUMNS: dict[int, list[tuple[str, str]]] = {
    1: list(schema.ENTRY_COLUMNS),
    2: list(schema.CARRIED_COLUMNS),
}
"""The entries table's (column, declared type) list of each format."""

SCHEMA_VERSIONS = {1: schema.SCHEMA_VERSION, 2: BUNDLE_VERSION}
"""The meta `schema_version` of each format, as text (0.1 wrote '1')."""

_DDL = {
    1: (
        schema.META_DDL,
        "CREATE TABLE IF NOT EXISTS entries ("
        "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))",
    ),
    2: (
        schema.META_DDL,
        "CREATE TABLE IF NOT EXISTS entries ("
        "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, written_at REAL, cost REAL, PRIMARY KEY (namespace, key))",
    ),
}

CARRIED_READ = carried.believed_columns_sql()
"""The SQL reading what a row carries (written_at, cost), each NULL where not believed."""

_MAX_VERSION_BYTES = 64  # a schema_version is "1" or "2": a longer one is not read at all


def create(conn: sqlite3.Connection, format_version: int = 2) -> None:
    """Create the tables of a SQLite bundle of format 2 or 1 (0.1's table exactly)."""
    for statement in _DDL[format_version]:
        conn.execute(statement)


# What `sqlite_master` holds besides the tables: the index of each primary key.
_AUTOINDEXES = (
    ("index", "sqlite_autoindex_meta_1", "meta"),
    ("index", "sqlite_autoindex_entries_1", "entries"),
)
_WORD = re.compile(r"\s+")
_PUNCTUATION = re.compile(r"\s*([(),])\s*")


def _normal(sql: str) -> str:
    """A table definition as `sqlite_master` holds it, compared: `IF NOT EXISTS` gone
    (SQLite never stores it), whitespace runs one space, none beside `(`, `)` and
    `,`, and case folded (our definitions hold no literals, so nothing is lost)."""
    sql = sql.replace(" IF NOT EXISTS ", " ", 1)
    return _PUNCTUATION.sub(r"\1", _WORD.sub(" ", sql)).strip().casefold()


def unlike_ours(conn: sqlite3.Connection, format_version: int) -> str | None:
    """What in a file's schema differs from the tables `create` makes for
    `format_version` (the one definition of a bundle's tables), as a clause
    naming it, or None: exactly our tables and their primary keys' indexes, in
    UTF-8. A schema is input: a collation, a view, a trigger, a generated column,
    an index or `WITHOUT ROWID` would change what the rows a digest vouches for
    are, once compared or copied."""
    encoding = str(conn.execute("PRAGMA encoding").fetchone()[0])
    if encoding.upper() != "UTF-8":
        return f"its text encoding is {encoding}, not UTF-8 as warmenv writes"
    ours = {(name, _normal(sql)) for sql in _DDL[format_version] for name in [_table_name(sql)]}
    rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    for type_, name, table, sql in rows:
        if (type_, name, table) in _AUTOINDEXES and sql is None:
            continue
        if type_ != "table":
            article = "an" if type_ == "index" else "a"
            return f"it has {article} {type_} {name!r}, which no warmenv bundle has"
        if name not in {n for n, _ in ours}:
            return f"it has a table {name!r}, which no warmenv bundle has"
        if (name, _normal(str(sql))) not in ours:
            shown = _WORD.sub(" ", str(sql))
            shown = shown if len(shown) <= 300 else shown[:300] + "..."
            return f"its table {name!r} is not as warmenv writes it ({shown})"
    return None


def version_unlike(conn: sqlite3.Connection, format_version: int) -> str | None:
    """What in a file's meta `schema_version` differs from the text `format_version`
    writes (`SCHEMA_VERSIONS`), as a clause naming it, or None.

    `format_version` is the format the file's tables are exactly (`unlike_ours`
    passed): the version a bundle claims must be that one, written as warmenv
    writes it. A claim read some other way (another format's number, `02`, a
    blob, none) is a file warmenv did not write, refused rather than guessed at.
    A newer version than this warmenv reads is `newer_version`'s, checked first.
    """
    try:
        found = schema.meta_value(conn, "schema_version", limit=_MAX_VERSION_BYTES)
    except sqlite3.DataError:
        return f"its schema_version is over {_MAX_VERSION_BYTES} bytes"
    if found == SCHEMA_VERSIONS[format_version]:
        return None
    if found is None:
        return "its meta table has no schema_version (every warmenv bundle names its format)"
    if not isinstance(found, str):  # meta's `v TEXT` (exactly ours) keeps only text and blobs
        return "its schema_version is a blob, not text"
    claimed = [f for f, version in SCHEMA_VERSIONS.items() if version == found]
    if claimed:
        return (
            f"its schema_version says format {claimed[0]}, "
            f"but its tables are format {format_version}'s"
        )
    known = " or ".join(f"'{version}'" for version in SCHEMA_VERSIONS.values())
    return f"its schema_version '{clean(found)}' names no format warmenv writes ({known})"


_META_KEYS = ("schema_version", "manifest")


def foreign_meta(conn: sqlite3.Connection) -> str | None:
    """A clause naming a `meta` row other than the two every bundle holds, or None.

    Nothing but the manifest is signed, and nothing else in `meta` is read: a
    row added to a (signed) bundle would travel with it unvouched for, so a
    file holding one is not a bundle of ours."""
    row = conn.execute(
        "SELECT CASE typeof(k) WHEN 'text' THEN substr(k, 1, 80) ELSE typeof(k) END "
        f"FROM meta WHERE k IS NULL OR k NOT IN {_META_KEYS!r} LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    return f"its meta table has a row {row[0]!r}, which no warmenv bundle has"


def meta_index_agrees(conn: sqlite3.Connection) -> bool:
    """Whether the index of `meta`'s key holds exactly its rows (the same keys, each
    with its own row's rowid), compared with the table read without any index.

    A `meta` value is read by key, through that index, which no digest covers:
    one pairing `manifest` with another row's rowid would have the manifest read
    from that row. Cheap: `foreign_meta` has passed, so `meta` holds two rows."""
    rows = conn.execute("SELECT k, rowid FROM meta NOT INDEXED ORDER BY k").fetchall()
    indexed = conn.execute(
        "SELECT k, rowid FROM meta INDEXED BY sqlite_autoindex_meta_1 ORDER BY k"
    ).fetchall()
    return rows == indexed


def first_view(conn: sqlite3.Connection) -> str | None:
    """The name of a view in the file, if any: checked before any table is read
    (reading a view runs its query, which a hostile file makes endless)."""
    row = conn.execute("SELECT name FROM sqlite_master WHERE type = 'view' LIMIT 1").fetchone()
    return None if row is None else str(row[0])


def _table_name(ddl: str) -> str:
    return ddl.split("EXISTS ", 1)[1].split(" ", 1)[0]


def read_only_uri(path: Path, *, immutable: bool = False) -> str:
    """A read-only URI for `path`: `mode=ro`, or `immutable=1` (no lock, no -shm
    file, no -wal file read: the main file's bytes alone)."""
    return f"{path.resolve().as_uri()}?{'immutable=1' if immutable else 'mode=ro'}"


def newer_version(conn: sqlite3.Connection) -> str | None:
    """The `schema_version` of a bundle newer than this warmenv reads, else None
    (an older or unreadable one, or a file that is no bundle at all)."""
    try:
        version = schema.meta_value(conn, "schema_version", limit=_MAX_VERSION_BYTES)
        is_bundle = schema.has_meta(conn, "manifest")
    except sqlite3.Error:
        return None  # a `meta` of another shape: the checks that follow say what the file is
    if is_bundle and schema.is_newer(version, BUNDLE_VERSION):
        return str(version)
    return None


# The size in bytes of a stored value, as SQL. octet_length (SQLite 3.43+) reads
# it from the record's header; before it, the value is cast to a blob inside SQLite.
_OCTETS = "octet_length(v)" if sqlite3.sqlite_version_info >= (3, 43) else "length(CAST(v AS BLOB))"


def manifest_size(conn: sqlite3.Connection, *, limit: int) -> int | None:
    """The bytes of the manifest (the largest, should a `meta` made without its
    primary key hold the key twice), or `None` if there is none.

    Measured in SQLite, never read into Python. Where measuring would read the
    value (text, before SQLite 3.43), one of more than `limit` bytes is refused
    unread, as `sqlite3.DataError` (`schema.length_limit`): known only to be too large.
    """
    with schema.length_limit(conn, limit):
        count, size = conn.execute(
            f"SELECT count(*), max({_OCTETS}) FROM meta WHERE k = 'manifest'"
        ).fetchone()
    return None if not count else int(size or 0)


def has_manifest(path: Path) -> bool:
    """Whether a SQLite file's `meta` holds a manifest (is it a bundle?); its value
    is not read, so a hostile file's huge one costs nothing.

    Read `immutable=1`, the main file alone: a `mode=ro` look at a WAL database
    (an environment given as OUT or SOURCE) would create a -wal and a -shm
    beside a file that is not ours, and leave them. A bundle is never in WAL
    mode, so its manifest is in the main file.
    """
    try:
        conn = _sqlite.open_file(read_only_uri(path, immutable=True))
        try:
            return schema.has_meta(conn, "manifest")
        finally:
            conn.close()
    except sqlite3.Error:
        return False
