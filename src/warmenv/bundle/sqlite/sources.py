"""What an export reads: environments, the SQLite files of the environment schema.

An export takes the entries of one or more environments (any version, read
under one snapshot each, leaving no -wal or -shm file beside one it only
reads) and merges them into one stream in (namespace, key) order, the first
source winning on a repeated entry. Only rows a bundle reader accepts are
taken: the right types, in a namespace of non-empty UTF-8 text; the others
are left out and counted. A file that cannot be read as an environment is
`InvalidSourceError`, naming it.
"""

from __future__ import annotations

import contextlib
import heapq
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, final

import attrs

from warmenv._text import is_utf8
from warmenv.bundle.base import CarriedRow
from warmenv.bundle.errors import InvalidSourceError
from warmenv.bundle.sqlite import schema as bundle_schema
from warmenv.persistence.sqlite import schema, uris

__all__ = ["Exportable", "ExportSources", "carried_columns", "reading"]
_BATCH = 1024


@contextlib.contextmanager
def reading(what: str) -> Iterator[None]:
    """SQLite's errors reading a source (damage) as `InvalidSourceError`, naming it."""
    try:
        yield
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise InvalidSourceError(f"reading {what} failed ({exc})") from None


def _open_source(path: Path) -> sqlite3.Connection:
    """Open an environment to export from, reading under one snapshot.

    Read-write first (`uris.open_uris`): export must leave no -wal or -shm
    file beside an environment it only reads.
    """
    last: sqlite3.Error | None = None
    for uri in uris.open_uris(path, read_write=True):
        conn = None
        try:
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            conn.text_factory = schema.decode_text
            conn.execute("BEGIN")  # one snapshot for both passes
            if not schema.has_entry_columns(conn):
                conn.close()
                raise InvalidSourceError(f"{path} is not a warmenv environment (no entries table)")
            return conn
        except sqlite3.Error as exc:
            last = exc
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
    raise InvalidSourceError(f"{path} cannot be read as a warmenv environment ({last})")


@final
class ExportSources:
    """Environments to export from, merged into one sorted stream of entries.

    Several sources merge with the first source winning on a repeated
    namespace and key. Rows that are not entries (wrong types) and
    namespaces no reader accepts (empty, not UTF-8) are left out and counted
    in `skipped`.
    """

    def __init__(self, paths: list[Path], prefixes: list[str] | None) -> None:
        self.paths = paths
        self.skipped = 0
        self._conns: list[sqlite3.Connection] = []
        self._carried: list[str] = []  # per source, the SQL of what its rows carry
        try:
            self._conns = [_open_source(p) for p in paths]
            with reading(", ".join(map(str, paths))):
                self._where, self._params = self._condition(prefixes)
                self._carried = [carried_columns(conn) for conn in self._conns]
        except BaseException:
            self.close()
            raise

    def _condition(self, prefixes: list[str] | None) -> tuple[str, list[object]]:
        exportable = Exportable.of(self._conns, "entries", prefixes)
        self.skipped += sum(exportable.left_out(conn) for conn in self._conns)
        return exportable.where, exportable.params

    def totals(self) -> dict[str, tuple[int, int]]:
        """Entries and bytes per namespace, as the merged stream will hold them."""
        with reading(", ".join(map(str, self.paths))):
            if len(self._conns) == 1:
                rows = schema.namespace_totals(
                    self._conns[0], where=self._where, params=self._params
                )
                return {namespace: (count, size) for namespace, count, size in rows}
            totals: dict[str, tuple[int, int]] = {}
            for namespace, key, value_len in self._merged(carrying=False):
                entries, size = totals.get(namespace, (0, 0))
                totals[namespace] = (entries + 1, size + len(key) + int(value_len))
            return totals

    def rows(self) -> Iterator[CarriedRow]:
        """Every entry in (namespace, key) order, with what it carries (believed, or None)."""
        with reading(", ".join(map(str, self.paths))):
            yield from self._merged(carrying=True)

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

    @property
    def where(self) -> tuple[str, list[object]]:
        return self._where, self._params

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(sqlite3.Error):
                conn.rollback()
                conn.close()
        self._conns = []


@attrs.frozen
class Exportable:
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
    ) -> Exportable:
        matches, match_params = schema.prefix_sql(prefixes)
        bad = sorted(
            {
                bytes(raw)
                for conn in conns
                for (raw,) in conn.execute(
                    # Other types are left out by well_typed (a NULL has no bytes to compare).
                    f"SELECT DISTINCT CAST(namespace AS BLOB) FROM {table} "
                    "WHERE typeof(namespace) = 'text'"
                )
                if not raw or not is_utf8(bytes(raw))
            }
        )
        where = f"{schema.well_typed()} AND {matches}"
        if bad:
            where += f" AND CAST(namespace AS BLOB) NOT IN ({','.join('?' * len(bad))})"
        return cls(table, where, [*match_params, *bad], matches, [*match_params])

    def left_out(self, conn: sqlite3.Connection) -> int:
        """How many rows under the prefixes the condition leaves out (wrong types, namespaces
        that are empty or not UTF-8)."""
        row = conn.execute(
            f"SELECT count(*) FROM {self.table} WHERE {self.matches} AND NOT ({self.where})",
            [*self.match_params, *self.params],
        ).fetchone()
        return int(row[0])


def carried_columns(conn: sqlite3.Connection, database: str = "main") -> str:
    """The SQL of the written_at and cost a source's rows carry into a bundle: believed
    values, or NULL from a version-1 environment, which has no such columns."""
    names = {name for name, _ in schema.entry_columns(conn, database)}
    return bundle_schema.CARRIED_READ if {"written_at", "cost"} <= names else "NULL, NULL"
