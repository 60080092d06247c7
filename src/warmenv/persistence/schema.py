"""The environment file's rules, written once: schema, checks, transactions, insert rule.

An environment database and a SQLite bundle share one schema, so everything
that knows what such a file looks like lives here: the tables, the version
check, the check that the `entries` table has the columns and column types
warmenv wrote, how a transaction is run, how the insert rule is stated in
SQL, how entries are summed per namespace and how namespace prefixes become
SQL conditions. Every other module (environment storage, bundle files, the
bulk paths of import and export) calls these functions instead of repeating
them, so a rule cannot drift between copies. All functions take a
`sqlite3.Connection` and run on the connection's worker thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

from warmenv.persistence.storage import may_replace

__all__ = [
    "ENTRY_COLUMNS",
    "SCHEMA_VERSION",
    "UPSERT",
    "create_schema",
    "entries_shape_ok",
    "install_functions",
    "namespace_totals",
    "prefix_sql",
    "transaction",
    "well_typed",
]

T = TypeVar("T")

SCHEMA_VERSION = "1"
# (column, declared type): the entries table exactly as warmenv creates it.
ENTRY_COLUMNS = [
    ("namespace", "TEXT"),
    ("key", "BLOB"),
    ("value", "BLOB"),
    ("origin", "INTEGER"),
]
_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS entries ("
    "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
    "origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))",
)
# The insert rule in SQL: an existing row is replaced only where may_replace says so.
UPSERT = (
    "INSERT INTO {table} (namespace, key, value, origin) {source} "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
    "origin = excluded.origin WHERE warmenv_may_replace(entries.origin, excluded.origin)"
)


def well_typed(alias: str = "") -> str:
    """The condition a row must meet to be an entry: text namespace, blob key and value."""
    return (
        f"typeof({alias}namespace) = 'text' AND typeof({alias}key) = 'blob' "
        f"AND typeof({alias}value) = 'blob'"
    )


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


def create_schema(conn: sqlite3.Connection, schema: str = "main") -> None:
    """Create the tables if they are missing (in the attached database `schema`)."""
    for statement in _DDL:
        conn.execute(statement.replace("EXISTS ", f"EXISTS {schema}.", 1))


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def entry_columns(conn: sqlite3.Connection, schema: str = "main") -> list[tuple[str, str]]:
    """The entries table's (column, declared type) list."""
    rows = conn.execute(f"PRAGMA {schema}.table_info(entries)")
    return [(str(row[1]), str(row[2]).upper()) for row in rows]


def entries_shape_ok(conn: sqlite3.Connection, schema: str = "main") -> bool:
    """Whether the entries table is exactly the one warmenv creates."""
    return entry_columns(conn, schema) == ENTRY_COLUMNS


def schema_version(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    return None if row is None else str(row[0])


def meta_value(conn: sqlite3.Connection, key: str) -> object:
    """The raw `meta` value under `key` (any SQLite type), or `None`."""
    row = conn.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
    return None if row is None else row[0]


def prepare_writable(conn: sqlite3.Connection) -> str | None:
    """Create or check an environment's schema; the old version when it was rebuilt."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    install_functions(conn)

    def body(conn: sqlite3.Connection) -> str | None:
        fresh = not ({"meta", "entries"} & table_names(conn))
        create_schema(conn)
        found = schema_version(conn)
        if found == SCHEMA_VERSION and entries_shape_ok(conn):
            return None
        if not fresh:
            conn.execute("DROP TABLE IF EXISTS entries")
            create_schema(conn)
        conn.execute(
            "INSERT OR REPLACE INTO meta (k, v) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
        )
        return None if fresh else repr(found)

    return transaction(conn, body)


def prepare_readonly(conn: sqlite3.Connection) -> None:
    """Check that a file opened read-only is an environment of this schema."""
    install_functions(conn)
    found = schema_version(conn)
    if found != SCHEMA_VERSION or not entries_shape_ok(conn):
        raise sqlite3.DatabaseError(f"schema version {found!r}, not {SCHEMA_VERSION}")


def namespace_totals(
    conn: sqlite3.Connection,
    *,
    table: str = "entries",
    where: str = "1",
    params: tuple[object, ...] | list[object] = (),
) -> list[tuple[str, int, int]]:
    """(namespace, entries, bytes) per namespace of the rows meeting `where`, in order.

    Bytes are keys plus values, the one measure of size everywhere.
    """
    rows = conn.execute(
        "SELECT namespace, count(*), coalesce(sum(length(key) + length(value)), 0) "
        f"FROM {table} WHERE {where} GROUP BY namespace ORDER BY namespace",
        params,
    )
    return [(namespace, int(count), int(size)) for namespace, count, size in rows]


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
