"""The environment file's rules, written once: tables, versions, checks, transactions, insert rule.

An environment is one SQLite file whose `entries` table starts with the
columns every entry file shares (namespace, key, value, origin; a SQLite
bundle has them too) and adds its provenance at version 2. Everything that
knows what such a file looks like lives here: the tables, the version checks
and the upgrade from version 1, the check that `entries` has the columns and
types warmenv wrote, how a transaction is run, how the insert rule is stated
in SQL, how namespaces are read back (text that is not UTF-8, values of
another SQLite type), how entries are summed per namespace and how namespace
prefixes become SQL conditions. The rest of `persistence.sqlite` (and the
bundle files, which read the shared columns) calls these functions instead of
repeating them, so a rule cannot drift between copies. Every function takes a
`sqlite3.Connection` and runs on the connection's worker thread.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import TypeVar

from warmenv.persistence.storage import BundleRef, NamespaceSummary, may_replace, wall_clock

__all__ = [
    "CARRIED_COLUMNS",
    "ENTRY_BYTES",
    "ENTRY_COLUMNS",
    "ENVIRONMENT_COLUMNS",
    "ENVIRONMENT_VERSION",
    "HIT_GRANULARITY",
    "IMPORTS_TABLE",
    "INSERT",
    "META_DDL",
    "SCHEMA_VERSION",
    "STATISTICS_TABLES",
    "UPSERT",
    "bundle_id",
    "create_environment_schema",
    "decode_text",
    "entry_columns",
    "foreign_text",
    "has_entry_columns",
    "has_meta",
    "install_functions",
    "is_newer",
    "length_limit",
    "meta_value",
    "namespace_read",
    "namespace_summaries",
    "summaries_hit_without_cost",
    "namespace_totals",
    "prefix_sql",
    "range_totals",
    "set_version",
    "table_names",
    "text_read",
    "transaction",
    "value_of",
    "well_typed",
]

T = TypeVar("T")

# Version 1: an environment of 0.1, and a SQLite bundle of format 1 (0.1's):
# exactly these columns, (column, declared type).
SCHEMA_VERSION = "1"
ENTRY_COLUMNS = [
    ("namespace", "TEXT"),
    ("key", "BLOB"),
    ("value", "BLOB"),
    ("origin", "INTEGER"),
]
META_DDL = "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)"
# What an entry carries to another machine (`warmenv.persistence.carried`), the
# environment's next two columns. A file of exactly these columns at schema
# version 2 (a SQLite bundle of format 2) is read like a version-1 environment.
CARRIED_COLUMNS = [*ENTRY_COLUMNS, ("written_at", "REAL"), ("cost", "REAL")]

# An environment is at version 2: the entry file's columns, then provenance
# (written_at: unix seconds, NULL for entries that predate version 2; cost:
# seconds the computation took, NULL unless known; bundle: the `bundles` row an
# imported entry came from) and `last_hit`, the coarse recency eviction reads
# (unix seconds rounded down to HIT_GRANULARITY, NULL: never hit). The new
# columns come last and are nullable, so version 1 upgrades by ALTER TABLE
# ADD COLUMN: a change of the schema alone, no row rewritten.
ENVIRONMENT_VERSION = "2"
PROVENANCE_COLUMNS = [
    ("written_at", "REAL"),
    ("cost", "REAL"),
    ("bundle", "INTEGER"),
    ("last_hit", "INTEGER"),
]
ENVIRONMENT_COLUMNS = ENTRY_COLUMNS + PROVENANCE_COLUMNS
HIT_GRANULARITY = 60
"""Seconds: a hit is recorded at most once per entry per this long."""
_BUNDLES_DDL = (
    "CREATE TABLE IF NOT EXISTS bundles (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
    "digest TEXT NOT NULL UNIQUE, imported_at REAL NOT NULL)"
)
_ENVIRONMENT_DDL = (
    META_DDL,
    _BUNDLES_DDL,
    "CREATE TABLE IF NOT EXISTS entries ("
    "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
    "origin INTEGER NOT NULL, written_at REAL, cost REAL, "
    "bundle INTEGER REFERENCES bundles (id), last_hit INTEGER, "
    "PRIMARY KEY (namespace, key))",
)
# Lookup statistics, added to by every process in UPSERT increments (so
# counts add up) and created on any writable open (so a version-2 file made
# before they existed gains them): per (namespace, origin of the entry hit),
# misses and computations under origin LOCAL; and per imported bundle (a
# `bundles` row).
_STATISTICS_DDL = (
    "CREATE TABLE IF NOT EXISTS statistics (namespace TEXT NOT NULL, origin INTEGER NOT NULL, "
    "hits INTEGER NOT NULL DEFAULT 0, saved_seconds REAL NOT NULL DEFAULT 0, "
    "misses INTEGER NOT NULL DEFAULT 0, computes INTEGER NOT NULL DEFAULT 0, "
    "compute_seconds REAL NOT NULL DEFAULT 0, PRIMARY KEY (namespace, origin))",
    "CREATE TABLE IF NOT EXISTS bundle_statistics (bundle INTEGER PRIMARY KEY "
    "REFERENCES bundles (id), hits INTEGER NOT NULL DEFAULT 0, "
    "saved_seconds REAL NOT NULL DEFAULT 0)",
)
STATISTICS_TABLES = frozenset({"statistics", "bundle_statistics"})
# The imports an environment recorded (background warm-ups: how each ended), the
# newest kept; created like the statistics tables, on any writable open.
_IMPORTS_DDL = (
    "CREATE TABLE IF NOT EXISTS imports (id INTEGER PRIMARY KEY, at REAL NOT NULL, "
    "source TEXT NOT NULL, outcome TEXT NOT NULL, bundle TEXT, imported INTEGER NOT NULL, "
    "skipped INTEGER NOT NULL, failed INTEGER NOT NULL, error TEXT)"
)
IMPORTS_TABLE = "imports"
_UPGRADE_1_TO_2 = (
    _BUNDLES_DDL,
    "ALTER TABLE entries ADD COLUMN written_at REAL",
    "ALTER TABLE entries ADD COLUMN cost REAL",
    "ALTER TABLE entries ADD COLUMN bundle INTEGER REFERENCES bundles (id)",
    "ALTER TABLE entries ADD COLUMN last_hit INTEGER",
)
# The insert rule in SQL: an existing row is replaced only where may_replace
# says so, and a replaced row takes the newcomer's provenance (its recency stays).
UPSERT = (
    "INSERT INTO {table} (namespace, key, value, origin, written_at, cost, bundle) {source} "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
    "origin = excluded.origin, written_at = excluded.written_at, cost = excluded.cost, "
    "bundle = excluded.bundle "
    "WHERE warmenv_may_replace(entries.origin, excluded.origin)"
)
INSERT = UPSERT.format(table="entries", source="VALUES (?, ?, ?, ?, ?, ?, ?)")
"""One row under the insert rule: a namespace's writes, an import's rows not copied in bulk."""


def well_typed(alias: str = "") -> str:
    """The condition a row must meet to be an entry: text namespace, blob key and value."""
    return (
        f"typeof({alias}namespace) = 'text' AND typeof({alias}key) = 'blob' "
        f"AND typeof({alias}value) = 'blob'"
    )


def namespace_read(column: str = "namespace") -> str:
    """How a namespace is read back from a file, as SQL, written once.

    Text reads as itself (text that is not UTF-8 comes back with surrogates,
    through `decode_text`). A value of another SQLite type (a row something
    else wrote: a BLOB, or an INTEGER, REAL or NULL where the column allows
    one) reads as its content cast to text, decoded the same way (a NULL as
    the empty string), with nothing added to it. Whether it is text is a value
    read beside it (`text_read`, `NamespaceSummary.text`): a BLOB `app/1/k`
    and the text `app/1/k` are two namespaces with the same name, told apart
    by that flag wherever namespaces are keyed.
    """
    return f"coalesce(CAST({column} AS TEXT), '')"


def text_read(column: str = "namespace") -> str:
    """Whether a namespace read by `namespace_read` is stored as text, as SQL (0 or 1)."""
    return f"typeof({column}) = 'text'"


def decode_text(raw: bytes) -> str:
    """A text factory that reads text which is not UTF-8 (another program wrote it)
    instead of failing: its bytes come back as surrogates, shown escaped and never
    written back."""
    return raw.decode("utf-8", "surrogateescape")


def install_functions(conn: sqlite3.Connection) -> None:
    """Register the insert rule so SQL statements can apply it."""
    conn.create_function("warmenv_may_replace", 2, may_replace, deterministic=True)


def transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run `body` inside BEGIN IMMEDIATE ... COMMIT; on any failure, roll back.

    COMMIT itself can fail (busy, full disk, I/O error). It runs inside the
    same guard, so a failed COMMIT is rolled back too and the connection is
    never left inside a transaction holding the write lock.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite already rolled back (it does on some I/O errors)
        raise
    return result


@contextlib.contextmanager
def foreign_text(conn: sqlite3.Connection) -> Iterator[None]:
    """Read text that is not UTF-8 (written by something else) instead of failing on it:
    such a namespace is listed, not hidden (`decode_text`)."""
    previous = conn.text_factory
    conn.text_factory = decode_text
    try:
        yield
    finally:
        conn.text_factory = previous


def create_environment_schema(conn: sqlite3.Connection) -> None:
    """Create an environment's tables (version 2) if they are missing."""
    for statement in _ENVIRONMENT_DDL:
        conn.execute(statement)
    create_statistics_schema(conn)


def create_statistics_schema(conn: sqlite3.Connection) -> None:
    """Create the statistics tables if they are missing (any writable version-2 open)."""
    for statement in (*_STATISTICS_DDL, _IMPORTS_DDL):
        conn.execute(statement)


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def entry_columns(conn: sqlite3.Connection, schema: str = "main") -> list[tuple[str, str]]:
    """The entries table's (column, declared type) list."""
    rows = conn.execute(f"PRAGMA {schema}.table_info(entries)")
    return [(str(row[1]), str(row[2]).upper()) for row in rows]


def has_entry_columns(conn: sqlite3.Connection, schema: str = "main") -> bool:
    """Whether `entries` starts namespace TEXT, key BLOB, value BLOB: a table export
    reads, of an environment of any version or a bundle of any format (origin is
    not read: a bundle's entries are imported whatever their origin was)."""
    return entry_columns(conn, schema)[:3] == ENTRY_COLUMNS[:3]


def environment_version(conn: sqlite3.Connection) -> int | None:
    """1 or 2 when the file is an environment of that version in the right shape, else None."""
    found = schema_version(conn)
    columns = entry_columns(conn)
    if found == ENVIRONMENT_VERSION and columns == ENVIRONMENT_COLUMNS:
        return 2
    if found == SCHEMA_VERSION and columns == ENTRY_COLUMNS:
        return 1
    return None


def schema_version(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    return None if row is None else str(row[0])


def meta_value(conn: sqlite3.Connection, key: str, *, limit: int | None = None) -> object:
    """The raw `meta` value under `key` (any SQLite type), or `None`.

    With `limit`, a value of more bytes is `sqlite3.DataError`, refused by
    SQLite from the record's header before it reads the value (see `length_limit`).
    """
    with contextlib.nullcontext() if limit is None else length_limit(conn, limit):
        row = conn.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
    return None if row is None else row[0]


@contextlib.contextmanager
def length_limit(conn: sqlite3.Connection, limit: int) -> Iterator[None]:
    """Refuse, for the block, any value of more than `limit` bytes that a query would read.

    SQLite checks a value's length (from its record's header) against
    SQLITE_LIMIT_LENGTH before reading it and raises `sqlite3.DataError`
    ("string or blob too big"): a hostile file's huge value never reaches
    memory, SQLite's or ours.
    """
    previous = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limit)
    try:
        yield
    finally:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, previous)


def has_meta(conn: sqlite3.Connection, key: str) -> bool:
    """Whether `meta` holds `key`, without fetching its value (which may be huge)."""
    return conn.execute("SELECT 1 FROM meta WHERE k = ?", (key,)).fetchone() is not None


def is_newer(found: object, newest: str) -> bool:
    """Whether a `schema_version` read from a file (any SQLite type, or None) names a
    version above `newest`: written by a newer warmenv. The one reading of a version,
    for environments and bundles alike; anything that is not a number is not newer."""
    try:
        return found is not None and int(str(found)) > int(newest)
    except ValueError:
        return False


def upgrade_1_to_2(conn: sqlite3.Connection) -> None:
    """Add the provenance columns and the bundles table (inside the caller's transaction).

    ALTER TABLE ADD COLUMN of a nullable column changes the schema only: no
    row is rewritten, so the upgrade takes the same time for any size, and
    entries written before it read `written_at` NULL (unknown). The time of
    the upgrade is kept in `meta` so that age-based gc can treat them as
    written then rather than never.
    """
    for statement in _UPGRADE_1_TO_2:
        conn.execute(statement)
    create_statistics_schema(conn)
    conn.execute(
        "INSERT OR REPLACE INTO meta (k, v) VALUES ('upgraded_at', ?)", (repr(wall_clock()),)
    )
    set_version(conn)


def set_version(conn: sqlite3.Connection) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO meta (k, v) VALUES ('schema_version', ?)", (ENVIRONMENT_VERSION,)
    )


ENTRY_BYTES = "length(key) + length(value)"
"""An entry's size as SQL: its key's bytes and its value's, the one measure of size."""
_TOTAL_BYTES = f"coalesce(sum({ENTRY_BYTES}), 0)"


def value_of(namespace: str, key: bytes, conn: sqlite3.Connection) -> bytes | None:
    """The value stored for `(namespace, key)`, or None; a value that is not a BLOB
    (a row something else wrote) is no value, never coerced."""
    row = conn.execute(
        "SELECT value FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
    ).fetchone()
    if row is None or not isinstance(row[0], bytes):
        return None
    value: bytes = row[0]
    return value


def namespace_totals(
    conn: sqlite3.Connection,
    *,
    table: str = "entries",
    where: str = "1",
    params: tuple[object, ...] | list[object] = (),
) -> list[tuple[str, int, int]]:
    """(namespace, entries, bytes) per namespace of the rows meeting `where`, in order.

    Bytes are keys plus values, the one measure of size everywhere. For rows whose
    namespaces are text (`well_typed`, or a checked bundle's): where a namespace of
    another type can be among them, `namespace_summaries` says which is which.
    """
    summaries = namespace_summaries(conn, table=table, where=where, params=params)
    return [(s.namespace, s.entries, s.bytes) for s in summaries]


def namespace_summaries(
    conn: sqlite3.Connection,
    *,
    table: str = "entries",
    where: str = "1",
    params: tuple[object, ...] | list[object] = (),
) -> list[NamespaceSummary]:
    """`namespace_totals` as summaries, each saying whether its namespace is text."""
    rows = conn.execute(
        f"SELECT {namespace_read()}, count(*), {_TOTAL_BYTES}, {text_read()} "
        f"FROM {table} WHERE {where} GROUP BY namespace ORDER BY namespace",
        params,
    )
    return [
        NamespaceSummary(namespace=namespace, entries=int(count), bytes=int(size), text=bool(text))
        for namespace, count, size, text in rows
    ]


def summaries_hit_without_cost(conn: sqlite3.Connection) -> list[tuple[NamespaceSummary, int]]:
    """`namespace_summaries` of an environment (version 2), each with how many of its
    entries were hit (they have a recency) and have no recorded cost, in the same scan."""
    rows = conn.execute(
        f"SELECT {namespace_read()}, count(*), {_TOTAL_BYTES}, {text_read()}, "
        "count(iif(cost IS NULL, last_hit, NULL)) "
        "FROM entries GROUP BY namespace ORDER BY namespace"
    )
    return [
        (
            NamespaceSummary(namespace=namespace, entries=int(n), bytes=int(size), text=bool(text)),
            int(unpriced),
        )
        for namespace, n, size, text, unpriced in rows
    ]


def range_totals(
    conn: sqlite3.Connection, *, table: str, where: str, params: tuple[object, ...]
) -> list[tuple[str, int, int]]:
    """`namespace_totals` of a range of rows read in table order (a batch of a bulk copy).

    Such a range almost always lies in one namespace, and then one aggregate
    over it says everything: the first row's namespace, and how many rows hold
    another (one comparison a row; `min` and `max` of the namespaces cost two,
    about 700 instructions an entry against 380). Grouping (which sorts the
    range, copying every value into the sorter) runs only for a range that
    spans namespaces. The rows' types are checked already (a namespace is
    never NULL).
    """
    row = conn.execute(
        f"SELECT namespace FROM {table} WHERE {where} ORDER BY rowid LIMIT 1", params
    ).fetchone()
    if row is None:
        return []
    first = row[0]
    count, size, others = conn.execute(
        f"SELECT count(*), {_TOTAL_BYTES}, count(*) FILTER (WHERE namespace IS NOT ?) "
        f"FROM {table} WHERE {where}",
        (first, *params),
    ).fetchone()
    if not others:
        return [(first, int(count), int(size))]
    return namespace_totals(conn, table=table, where=where, params=params)


def prefix_sql(prefixes: list[str] | None, column: str = "namespace") -> tuple[str, list[str]]:
    """Namespace prefixes (whole segments) as an SQL condition on `column`, with parameters.

    A range comparison rather than LIKE, so `_` and `%` in a prefix match only
    themselves, and so the condition can use the (namespace, key) index.
    """
    if prefixes is None:
        return "1", []
    parts: list[str] = []
    params: list[str] = []
    for prefix in (p.rstrip("/") for p in prefixes):
        if not prefix:
            return "1", []
        # '0' is the character after '/': the range is exactly "starts with prefix/".
        parts.append(f"({column} = ? OR ({column} >= ? AND {column} < ?))")
        params += [prefix, prefix + "/", prefix + "0"]
    return "(" + " OR ".join(parts) + ")", params


def bundle_id(bundle: BundleRef, now: float, conn: sqlite3.Connection) -> int:
    """The `bundles` row of `bundle` (by digest), made or renamed as needed (in a transaction);
    its signer recorded, or (imported unsigned, or unchecked) any record of one forgotten."""
    row = conn.execute(
        "INSERT INTO bundles (name, digest, imported_at) VALUES (?, ?, ?) "
        "ON CONFLICT (digest) DO UPDATE SET name = excluded.name, "
        "imported_at = excluded.imported_at RETURNING id",
        (bundle.name, bundle.digest, now),
    ).fetchone()
    if bundle.signer is not None:
        conn.execute(_SIGNERS_DDL)
        conn.execute(
            "INSERT INTO bundle_signers (digest, signer) VALUES (?, ?) "
            "ON CONFLICT (digest) DO UPDATE SET signer = excluded.signer",
            (bundle.digest, bundle.signer),
        )
    elif "bundle_signers" in table_names(conn):
        # The same digest imported without a check may hold other entries (verify=False).
        conn.execute("DELETE FROM bundle_signers WHERE digest = ?", (bundle.digest,))
    return int(row[0])


# The trusted key each imported bundle's signature was checked against, by digest;
# made by the first signed import (an environment without one has no such table).
SIGNERS_TABLE = "bundle_signers"
_SIGNERS_DDL = (
    f"CREATE TABLE IF NOT EXISTS {SIGNERS_TABLE} (digest TEXT PRIMARY KEY, signer TEXT NOT NULL)"
)


def bundle_signers(conn: sqlite3.Connection) -> dict[str, str]:
    """The signer's key (text) of each bundle imported with a checked signature, by digest."""
    if "bundle_signers" not in table_names(conn):
        return {}
    return {str(d): str(s) for d, s in conn.execute("SELECT digest, signer FROM bundle_signers")}
