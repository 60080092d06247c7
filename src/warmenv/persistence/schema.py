"""The SQLite bundle's format: its `entries` table and schema versions.

A SQLite bundle is an entry file (`warmenv.persistence.sqlite.schema`'s
shared columns) with a `meta` table holding its manifest. Only what is the
bundle's own lives here; the environment's schema is in
`warmenv.persistence.sqlite.schema`. (This module is the bundle side of the
split of the old shared schema, to move under `warmenv.bundle`.)
"""

from __future__ import annotations

import sqlite3

from warmenv.persistence.sqlite.schema import (
    CARRIED_COLUMNS,
    ENTRY_COLUMNS,
    META_DDL,
    SCHEMA_VERSION,
    entry_columns,
)

__all__ = [
    "BUNDLE_COLUMNS",
    "BUNDLE_SCHEMA_VERSIONS",
    "BUNDLE_VERSION",
    "create_bundle_schema",
    "entries_shape_ok",
]

# A SQLite bundle of format 2 (what export writes by default) adds what an entry
# carries to another machine, the environment's next two columns: written_at and
# cost (warmenv.persistence.carried). Its meta says schema_version 2. warmenv 0.1
# refuses it (other columns); import reads both formats, and export writes
# format 1 on request, exactly as 0.1 did, for readers that know no other.
BUNDLE_VERSION = "2"
BUNDLE_COLUMNS = CARRIED_COLUMNS
_BUNDLE_DDL = {
    1: (
        META_DDL,
        "CREATE TABLE IF NOT EXISTS entries ("
        "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))",
    ),
    2: (
        META_DDL,
        "CREATE TABLE IF NOT EXISTS entries ("
        "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, written_at REAL, cost REAL, PRIMARY KEY (namespace, key))",
    ),
}
# The meta `schema_version` of a SQLite bundle of each format, as text (0.1 wrote '1').
BUNDLE_SCHEMA_VERSIONS = {1: SCHEMA_VERSION, 2: BUNDLE_VERSION}


def create_bundle_schema(conn: sqlite3.Connection, format_version: int = 2) -> None:
    """Create the tables of a SQLite bundle of format 2 (`BUNDLE_COLUMNS`) or 1
    (`ENTRY_COLUMNS`, 0.1's table exactly)."""
    for statement in _BUNDLE_DDL[format_version]:
        conn.execute(statement)


def entries_shape_ok(conn: sqlite3.Connection, schema: str = "main") -> bool:
    """Whether the entries table is exactly the one warmenv creates in an entry file."""
    return entry_columns(conn, schema) == ENTRY_COLUMNS
