"""What an export reads from environments: their entries, under one snapshot each.

An export takes the entries of one or more environment files (any version:
a version-1 file carries no `written_at` or `cost`, and is read, never
upgraded) and never writes them: each is proven warmenv's first, on a
connection that cannot change it (`opening.prove_unwritten`), then opened
read-write (`uris.open_uris`) so that the last connection to close it removes the -wal
and -shm files reading it needed. Only rows a bundle reader accepts are
taken: the right types, in a namespace of non-empty UTF-8 text; the others
are left out and counted. Every statement an export runs on an environment
is here; the bundle side only says where the rows go.

Two ways out, as an import has two ways in (`bulk`): `ExportSources` brings
the rows into Python, merged into one stream in (namespace, key) order, the
first source winning on a repeated entry (any format, any number of
sources); `SourceCopy` attaches one source to the connection of a SQLite
bundle being written and copies its rows inside SQLite, a batch at a time.
A file that is not an environment, or that cannot be opened as one, is
`NotAnEnvironmentError` (naming it); what SQLite says reading one goes on as
the `sqlite3.Error` it is. The caller says what either means to its user.
"""

from __future__ import annotations

import contextlib
import heapq
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias, final

import attrs

from warmenv import _sqlite
from warmenv._text import is_utf8
from warmenv.persistence import carried
from warmenv.persistence.sqlite import opening, schema, uris
from warmenv.persistence.storage import Origin

__all__ = [
    "ExportRow",
    "ExportSources",
    "NotAnEnvironmentError",
    "SourceCopy",
    "Totals",
]

_BATCH = 1024
_SOURCE = "warmenv_source"

ExportRow: TypeAlias = tuple[str, bytes, bytes, float | None, float | None]
"""An entry as export reads it: (namespace, key, value, written_at, cost), each carried
number believed (`carried`) or None."""

Totals: TypeAlias = dict[str, tuple[int, int]]
"""Entries and bytes (keys plus values) per namespace."""


class NotAnEnvironmentError(sqlite3.DatabaseError):
    """A file given to export is not a warmenv environment, or cannot be opened as one;
    the message names it."""


@final
class ExportSources:
    """Environments to export from, merged into one sorted stream of entries.

    Each source is read under one snapshot (a transaction held open until
    `close`), so the totals and the rows agree. Several sources merge with
    the first source winning on a repeated namespace and key. Rows that are
    not entries (wrong types) and namespaces no reader accepts (empty, not
    UTF-8) are left out and counted in `skipped`. Used from one thread at a
    time.
    """

    def __init__(self, paths: list[Path], prefixes: list[str] | None) -> None:
        self.paths = paths
        self.skipped = 0
        self._conns: list[sqlite3.Connection] = []
        self._carried: list[str] = []  # per source, the SQL of what its rows carry
        self._totals: Totals | None = None  # one source's, counted as it opens
        try:
            for path in paths:
                self._conns.append(_open_source(path))
            exportable = _Exportable.of(self._conns, "entries", prefixes)
            self._where, self._params = exportable.where, exportable.params
            if len(self._conns) == 1:
                # One source's totals are its own: counted now, and `skipped` from them.
                conn = self._conns[0]
                rows = schema.namespace_totals(conn, where=self._where, params=self._params)
                self._totals = {namespace: (count, size) for namespace, count, size in rows}
                self.skipped = exportable.left_out(conn, kept=_entries(self._totals))
            else:
                self.skipped = sum(exportable.left_out(conn) for conn in self._conns)
            self._carried = [_carried_columns(conn) for conn in self._conns]
            for conn in self._conns:
                # Every namespace the condition lets through is UTF-8 (`_Exportable`), so
                # the rows read as plain text from here on, with no Python call per row.
                conn.text_factory = str
        except BaseException:
            self.close()
            raise

    def totals(self) -> Totals:
        """Entries and bytes per namespace, as the merged stream will hold them."""
        if self._totals is not None:
            return dict(self._totals)
        totals: Totals = {}
        for namespace, key, value_len in self._merged(carrying=False):
            entries, size = totals.get(namespace, (0, 0))
            totals[namespace] = (entries + 1, size + len(key) + int(value_len))
        return totals

    def rows(self) -> Iterator[ExportRow]:
        """Every entry in (namespace, key) order, with what it carries (believed, or None)."""
        return self._merged(carrying=True)

    def _merged(self, *, carrying: bool) -> Iterator[Any]:
        """Rows (namespace, key, then the value and what it carries, or the value's length)."""

        def rows(conn: sqlite3.Connection, carried_sql: str) -> Iterator[Any]:
            columns = f"value, {carried_sql}" if carrying else "length(value)"
            cursor = conn.execute(
                f"SELECT namespace, key, {columns} FROM entries WHERE {self._where} "
                "ORDER BY namespace, key",
                self._params,
            )
            while batch := cursor.fetchmany(_BATCH):
                yield from batch

        sources = [rows(conn, sql) for conn, sql in zip(self._conns, self._carried, strict=True)]
        if len(sources) == 1:  # one sorted source has nothing to merge or deduplicate
            yield from sources[0]
            return
        previous: tuple[object, object] | None = None
        for row in heapq.merge(*sources, key=lambda r: (r[0], r[1])):
            if previous is not None and (row[0], row[1]) == previous:
                continue
            previous = (row[0], row[1])
            yield row

    def close(self) -> None:
        """End the snapshots and close the sources; idempotent."""
        for conn in self._conns:
            with contextlib.suppress(sqlite3.Error):
                conn.rollback()
                conn.close()
        self._conns = []


@final
class SourceCopy:
    """One environment attached to a SQLite bundle's connection and copied into its
    `main.entries` inside SQLite (INSERT ... SELECT, a batch at a time), as IMPORTED.

    Attaching begins the connection's transaction: one snapshot of the source
    for the totals and every batch, and the bundle's writes in it too; the
    caller commits, then `detach`es. `carrying` copies what each row carries
    into the bundle's `written_at` and `cost` (format 2); without it the
    bundle has the first four columns alone (format 1).
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        source: Path,
        prefixes: list[str] | None,
        *,
        carrying: bool,
    ) -> None:
        self._conn = conn
        self.attached = False
        _refuse_unless_ours(source)
        error: sqlite3.Error | None = None
        for uri in uris.open_uris(source, read_write=True):
            try:
                conn.execute(f"ATTACH DATABASE ? AS {_SOURCE}", (uri,))
                self.attached = True
                readable = schema.has_entry_columns(conn, _SOURCE)
                break
            except sqlite3.Error as exc:
                self.detach()
                error = exc
        else:
            raise NotAnEnvironmentError(
                f"{source} cannot be read as a warmenv environment ({error})"
            )
        if not readable:
            raise NotAnEnvironmentError(f"{source} is not a warmenv environment (no entries table)")
        conn.text_factory = schema.decode_text
        # One snapshot of the source for the condition, the totals and the copy.
        conn.execute("BEGIN")
        exportable = _Exportable.of([conn], f"{_SOURCE}.entries", prefixes)
        self._where, self._params = exportable.where, exportable.params
        columns, values = "", ""
        if carrying:
            columns, values = ", written_at, cost", f", {_carried_columns(conn, _SOURCE)}"
        self._insert = (
            f"INSERT INTO main.entries (namespace, key, value, origin{columns}) "
            f"SELECT namespace, key, value, {int(Origin.IMPORTED)}{values} "
            f"FROM {_SOURCE}.entries WHERE {self._where}"
        )
        rows = schema.namespace_totals(
            conn, table=f"{_SOURCE}.entries", where=self._where, params=self._params
        )
        self.totals: Totals = {namespace: (count, size) for namespace, count, size in rows}
        """Entries and bytes per namespace that the copy will hold."""
        self.skipped = exportable.left_out(conn, kept=_entries(self.totals))
        """Rows of the source left out (wrong types, namespaces no reader accepts)."""
        # The rows copied are UTF-8 text (`_Exportable`): read back with no Python call each.
        conn.text_factory = str

    def copy_batch(self, after: tuple[str, bytes] | None, limit: int) -> None:
        """Copy the next `limit` entries in (namespace, key) order after `after`
        (`None`: from the first)."""
        sql, params = self._insert, list(self._params)
        if after is not None:
            sql += " AND (namespace, key) > (?, ?)"
            params += after
        self._conn.execute(f"{sql} ORDER BY namespace, key LIMIT {int(limit)}", params)

    def detach(self) -> None:
        """Detach the source (after the commit: a transaction holds it); idempotent."""
        if self.attached:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute(f"DETACH DATABASE {_SOURCE}")
            self.attached = False


def _refuse_unless_ours(path: Path) -> None:
    """The ownership proof (`opening.prove_unwritten`) before a source's read-write open,
    its refusal as this module's error."""
    try:
        opening.prove_unwritten(path, busy_timeout=_sqlite.FILE_BUSY_TIMEOUT_SECONDS)
    except opening.NotAnEnvironmentError as exc:
        raise NotAnEnvironmentError(str(exc.at(path))) from None


def _open_source(path: Path) -> sqlite3.Connection:
    """Open an environment to export from, reading under one snapshot."""
    _refuse_unless_ours(path)
    last: sqlite3.Error | None = None
    for uri in uris.open_uris(path, read_write=True):
        conn = None
        try:
            conn = _sqlite.open_file(uri)
            conn.text_factory = schema.decode_text
            conn.execute("BEGIN")  # one snapshot for both passes
            if not schema.has_entry_columns(conn):
                conn.close()
                raise NotAnEnvironmentError(
                    f"{path} is not a warmenv environment (no entries table)"
                )
            return conn
        except NotAnEnvironmentError:
            raise
        except sqlite3.Error as exc:
            last = exc
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
    raise NotAnEnvironmentError(f"{path} cannot be read as a warmenv environment ({last})")


@attrs.frozen
class _Exportable:
    """Which rows of a source an export takes: entries of the right types, under the
    prefixes, in namespaces a bundle reader accepts: non-empty UTF-8 text (a file written
    by something else may hold others, and a bundle holding one could not be read).
    """

    table: str
    where: str
    params: list[object]
    matches: str
    match_params: list[object]

    @classmethod
    def of(
        cls, conns: list[sqlite3.Connection], table: str, prefixes: list[str] | None
    ) -> _Exportable:
        matches, match_params = schema.prefix_sql(prefixes)
        bad = sorted(
            {
                raw
                for conn in conns
                for raw in _text_namespaces(conn, table)
                if not raw or not is_utf8(raw)
            }
        )
        where = f"{schema.well_typed()} AND {matches}"
        if bad:
            where += f" AND CAST(namespace AS BLOB) NOT IN ({','.join('?' * len(bad))})"
        return cls(table, where, [*match_params, *bad], matches, [*match_params])

    def left_out(self, conn: sqlite3.Connection, *, kept: int | None = None) -> int:
        """How many rows under the prefixes the condition leaves out (wrong types, namespaces
        that are empty or not UTF-8). `kept`, the rows it lets through where the caller has
        counted them already (the totals), spares a scan of the table: the rows under the
        prefixes are counted from the (namespace, key) index alone."""
        if kept is not None:
            row = conn.execute(
                f"SELECT count(*) FROM {self.table} WHERE {self.matches}", self.match_params
            ).fetchone()
            return int(row[0]) - kept
        row = conn.execute(
            f"SELECT count(*) FROM {self.table} WHERE {self.matches} AND NOT ({self.where})",
            [*self.match_params, *self.params],
        ).fetchone()
        return int(row[0])


# The text namespaces sort after every number and NULL and before every blob, and the
# (namespace, key) index holds them in that order: each next one is one seek along it.
_FIRST_TEXT = (
    "SELECT CAST(namespace AS BLOB) FROM {table} WHERE namespace >= '' AND namespace < x'' "
    "ORDER BY namespace LIMIT 1"
)
_NEXT_TEXT = (
    "SELECT CAST(namespace AS BLOB) FROM {table} "
    "WHERE namespace > CAST(? AS TEXT) AND namespace < x'' ORDER BY namespace LIMIT 1"
)


def _text_namespaces(conn: sqlite3.Connection, table: str) -> Iterator[bytes]:
    """The bytes of each distinct namespace of `table` stored as text, in index order.

    Found by stepping along the (namespace, key) index from one namespace to the
    next, one seek each, instead of `SELECT DISTINCT` over every row (about 1,000
    instructions an entry, a tenth of the copy itself). Namespaces of another
    type are left out by `well_typed`; those that are text but not UTF-8 are
    compared as the bytes they are (the previous one bound as a blob and cast
    back to text, which keeps its bytes).
    """
    row = conn.execute(_FIRST_TEXT.format(table=table)).fetchone()
    while row is not None:
        raw = bytes(row[0])
        yield raw
        row = conn.execute(_NEXT_TEXT.format(table=table), (raw,)).fetchone()


def _entries(totals: Totals) -> int:
    return sum(entries for entries, _ in totals.values())


def _carried_columns(conn: sqlite3.Connection, database: str = "main") -> str:
    """The SQL of the written_at and cost a source's rows carry into a bundle: believed
    values, or NULL from a version-1 environment, which has no such columns."""
    names = {name for name, _ in schema.entry_columns(conn, database)}
    return carried.believed_columns_sql() if {"written_at", "cost"} <= names else "NULL, NULL"
