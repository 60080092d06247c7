"""Entry files read whole: SQLite bundles, export sources and export staging files.

Import and export move entries in bulk between an environment and a file of
the same schema. The SQL for that lives here, beside the environment's own,
so the bundle modules never touch `sqlite3`: they ask for a file to be
opened and checked, for its entries in key order (to hash them), for pages
of one namespace, and for a staging file to be filled and finished. A file
that is not of the schema raises `NotEntryFileError`; one that is but holds
damage (a malformed page, a row of the wrong types) raises
`DamagedEntryFileError`. The bundle layer turns them into its own errors.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar, final

import attrs

from warmenv import _sqlite
from warmenv.persistence import schema
from warmenv.persistence.storage import NamespaceSummary, Origin

__all__ = [
    "DamagedEntryFileError",
    "EntryFile",
    "EntryFileError",
    "ExportSources",
    "NotEntryFileError",
    "StagingFile",
    "StagingWriteError",
    "read_only_uri",
]

T = TypeVar("T")
Row = tuple[str, bytes, bytes]
_BATCH = 1024
_SOURCE = "warmenv_source"


class EntryFileError(Exception):
    """A file could not be read as an entry file (the message says why)."""


class NotEntryFileError(EntryFileError):
    """The file is not a SQLite database of warmenv's schema at all."""


class DamagedEntryFileError(EntryFileError):
    """The file is of warmenv's schema but damaged (malformed pages or rows)."""


class StagingWriteError(EntryFileError):
    """Writing a staging file failed; `errno`, `strerror` and `filename` say how."""

    def __init__(self, errno_: int, strerror: str, filename: str) -> None:
        super().__init__(f"{filename}: {strerror}")
        self.errno = errno_
        self.strerror = strerror
        self.filename = filename


# SQLite's primary result codes, as the OSError they stand for.
_ERRNO_OF = {
    8: errno.EROFS,  # SQLITE_READONLY
    10: errno.EIO,  # SQLITE_IOERR
    13: errno.ENOSPC,  # SQLITE_FULL
    14: errno.EACCES,  # SQLITE_CANTOPEN
}


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        code = _ERRNO_OF.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF, errno.EIO)
        raise StagingWriteError(code, f"{os.strerror(code)} ({exc})", str(path)) from None


@contextlib.contextmanager
def _reading(what: str) -> Iterator[None]:
    try:
        yield
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise DamagedEntryFileError(f"reading {what} failed ({exc})") from None


class Hasher(Protocol):
    """What `EntryFile.hash_entries` feeds: batches of rows in key order."""

    def add(self, entries: Iterable[Row]) -> None: ...

    def value(self) -> str: ...

    def close(self) -> None: ...


def read_only_uri(path: Path, *, immutable: bool = False) -> str:
    """A read-only URI for `path` (immutable where no lock file can be made)."""
    return f"{path.resolve().as_uri()}?{'immutable=1' if immutable else 'mode=ro'}"


def _is_not_database(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return "not a database" in text or "file is encrypted" in text


@final
class EntryFile:
    """A SQLite file of the entries schema, opened read-only and checked (a bundle)."""

    __slots__ = ("_connection", "meta", "namespaces", "path", "utf8")

    def __init__(
        self,
        connection: _sqlite.Connection,
        path: Path,
        meta: dict[str, object],
        namespaces: list[NamespaceSummary],
        utf8: bool,
    ) -> None:
        self._connection = connection
        self.path = path
        self.meta = meta
        self.namespaces = namespaces
        self.utf8 = utf8  # whether its text is UTF-8, as an environment's is

    @classmethod
    async def open(cls, path: Path, *, check_rows: bool = True) -> EntryFile:
        """Open read-only and check the schema and every row's types.

        `check_rows=False` leaves the rows' types to `hash_entries`, which
        checks them as it reads: for a file that is hashed before any use.
        """
        # Immutable: the main file alone is read, exactly the bytes an import's
        # private copy holds (never a -wal file beside it), and nothing is created.
        try:
            connection, (meta, namespaces, utf8) = await _sqlite.open_with(
                read_only_uri(path, immutable=True), partial(_check_file, check_rows), uri=True
            )
        except UnicodeDecodeError as exc:
            raise DamagedEntryFileError(f"text that is not UTF-8 ({exc})") from None
        except sqlite3.Error as exc:
            if _is_not_database(exc):
                raise NotEntryFileError(f"SQLite cannot read it ({exc})") from None
            raise DamagedEntryFileError(f"SQLite cannot read it ({exc})") from None
        return cls(connection, path, meta, namespaces, utf8)

    async def get(self, namespace: str, key: bytes) -> bytes | None:
        return await self._run(partial(_get, namespace, key))

    async def page(
        self, namespace: str, after: bytes | None, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Up to `limit` entries of `namespace` after the key `after`, in key order."""
        return await self._run(partial(_page, namespace, after, limit))

    async def hash_entries(self, new_hasher: Callable[[], Hasher]) -> str:
        """Feed every entry, in key order, to a hasher; its value.

        Bundles are written in key order, so the table is read in rowid order
        (sequentially) while checking that each row sorts after the last. A
        file whose rows are not in key order falls back to SQLite's integrity
        check and a read in index order, with a fresh hasher.
        """
        return await self._run(partial(_hash_entries, new_hasher))

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._connection.run(fn)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise DamagedEntryFileError(f"reading failed ({exc})") from None

    async def close(self) -> None:
        await self._connection.close()


def _check_file(
    check_rows: bool, conn: sqlite3.Connection
) -> tuple[dict[str, object], list[NamespaceSummary], bool]:
    tables = schema.table_names(conn)
    if not {"meta", "entries"} <= tables:
        missing = sorted({"meta", "entries"} - tables)
        raise NotEntryFileError(f"it has no {' or '.join(repr(t) for t in missing)} table")
    columns = schema.entry_columns(conn)
    if columns not in (schema.ENTRY_COLUMNS, schema.ENVIRONMENT_COLUMNS):
        raise NotEntryFileError(f"its entries table has columns {columns}, not warmenv's")
    meta = {str(k): v for k, v in conn.execute("SELECT k, v FROM meta")}
    # The table itself is scanned for rows of the wrong types (a damaged file can hold
    # rows its index lacks); the totals come through the index, which is far cheaper
    # than grouping a table scan.
    count = 0
    if check_rows:
        bad = conn.execute(f"SELECT count(*) FROM entries WHERE NOT ({schema.well_typed()})")
        count = int(bad.fetchone()[0])
    if count:
        raise DamagedEntryFileError(
            f"{count} rows have a namespace, key or value of the wrong type"
        )
    totals = schema.namespace_totals(conn)
    utf8 = str(conn.execute("PRAGMA encoding").fetchone()[0]).upper() == "UTF-8"
    return meta, [NamespaceSummary(n, c, b) for n, c, b in totals], utf8


def _get(namespace: str, key: bytes, conn: sqlite3.Connection) -> bytes | None:
    row = conn.execute(
        "SELECT value FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
    ).fetchone()
    return None if row is None else bytes(row[0])


def _page(
    namespace: str, after: bytes | None, limit: int, conn: sqlite3.Connection
) -> list[tuple[bytes, bytes]]:
    if after is None:
        sql = "SELECT key, value FROM entries WHERE namespace = ? ORDER BY key LIMIT ?"
        return conn.execute(sql, (namespace, limit)).fetchall()
    sql = "SELECT key, value FROM entries WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?"
    return conn.execute(sql, (namespace, after, limit)).fetchall()


def _check_types(row: tuple[object, object, object]) -> None:
    namespace, key, value = row
    if type(namespace) is not str or type(key) is not bytes or type(value) is not bytes:
        raise DamagedEntryFileError("a row has a namespace, key or value of the wrong type")


class _NotInKeyOrder(Exception):
    pass


def _hash_entries(new_hasher: Callable[[], Hasher], conn: sqlite3.Connection) -> str:
    hasher = new_hasher()
    try:
        cursor = conn.execute("SELECT namespace, key, value FROM entries ORDER BY rowid")
        previous_namespace: str | None = None
        previous_key = b""
        while rows := cursor.fetchmany(_BATCH):
            for namespace, key, value in rows:
                if type(namespace) is not str or type(key) is not bytes or type(value) is not bytes:
                    raise DamagedEntryFileError(
                        "a row's namespace, key or value has the wrong type"
                    )
                if namespace != previous_namespace:
                    if previous_namespace is not None and namespace < previous_namespace:
                        raise _NotInKeyOrder
                    previous_namespace = namespace
                elif key <= previous_key:
                    raise _NotInKeyOrder
                previous_key = key
            hasher.add(rows)
        return hasher.value()
    except _NotInKeyOrder:
        pass
    finally:
        hasher.close()
    # Reading in index order trusts the index to match the table: check that.
    problems = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
    if problems != ["ok"]:
        raise DamagedEntryFileError(f"SQLite finds it damaged: {'; '.join(problems)}")
    hasher = new_hasher()
    try:
        cursor = conn.execute("SELECT namespace, key, value FROM entries ORDER BY namespace, key")
        while rows := cursor.fetchmany(_BATCH):
            for row in rows:
                _check_types(row)
            hasher.add(rows)
        return hasher.value()
    finally:
        hasher.close()


# --- export: reading sources, writing a staging file -------------------------------


def _open_source(path: Path) -> sqlite3.Connection:
    """Open an environment to export from, reading under one snapshot.

    Read-write where possible (without creating anything), so that closing
    it, as the last connection, removes the -wal and -shm files it needed;
    read-only, then immutable, where the file or its directory is not writable.
    """
    uri = path.resolve().as_uri()
    last: sqlite3.Error | None = None
    for query in ("mode=rw", "mode=ro", "immutable=1"):
        conn = None
        try:
            conn = sqlite3.connect(
                f"{uri}?{query}", uri=True, isolation_level=None, check_same_thread=False
            )
            conn.text_factory = schema.decode_text
            conn.execute("BEGIN")  # one snapshot for both passes
            if schema.entry_columns(conn)[:3] != schema.ENTRY_COLUMNS[:3]:
                conn.close()
                raise NotEntryFileError(f"{path} is not a warmenv environment (no entries table)")
            return conn
        except sqlite3.Error as exc:
            last = exc
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
    raise NotEntryFileError(f"{path} cannot be read as a warmenv environment ({last})")


@final
class ExportSources:
    """Environments to export from, merged into one sorted stream of entries.

    Several sources merge with the first source winning on a repeated
    namespace and key. Rows that are not entries (wrong types) and
    namespaces that are not UTF-8 are left out and counted in `skipped`.
    """

    def __init__(self, paths: list[Path], prefixes: list[str] | None) -> None:
        self.paths = paths
        self.skipped = 0
        self._conns: list[sqlite3.Connection] = []
        try:
            self._conns = [_open_source(p) for p in paths]
            with _reading(", ".join(map(str, paths))):
                self._where, self._params = self._condition(prefixes)
        except BaseException:
            self.close()
            raise

    def _condition(self, prefixes: list[str] | None) -> tuple[str, list[object]]:
        exportable = _Exportable.of(self._conns, "entries", prefixes)
        self.skipped += sum(exportable.left_out(conn) for conn in self._conns)
        return exportable.where, exportable.params

    def totals(self) -> dict[str, tuple[int, int]]:
        """Entries and bytes per namespace, as the merged stream will hold them."""
        with _reading(", ".join(map(str, self.paths))):
            if len(self._conns) == 1:
                rows = schema.namespace_totals(
                    self._conns[0], where=self._where, params=self._params
                )
                return {namespace: (count, size) for namespace, count, size in rows}
            totals: dict[str, tuple[int, int]] = {}
            for namespace, key, value_len in self._merged("length(value)"):
                entries, size = totals.get(namespace, (0, 0))
                totals[namespace] = (entries + 1, size + len(key) + int(value_len))  # type: ignore[call-overload]
            return totals

    def rows(self) -> Iterator[Row]:
        """Every entry in (namespace, key) order."""
        with _reading(", ".join(map(str, self.paths))):
            yield from self._merged("value")  # type: ignore[misc]

    def _merged(self, columns: str) -> Iterator[tuple[str, bytes, object]]:
        sql = (
            f"SELECT namespace, key, {columns} FROM entries WHERE {self._where} "
            "ORDER BY namespace, key"
        )

        def rows(conn: sqlite3.Connection) -> Iterator[tuple[str, bytes, object]]:
            cursor = conn.execute(sql, self._params)
            while batch := cursor.fetchmany(_BATCH):
                yield from batch

        if len(self._conns) == 1:  # one sorted source has nothing to merge or deduplicate
            yield from rows(self._conns[0])
            return
        previous: tuple[str, bytes] | None = None
        for row in heapq.merge(*(rows(c) for c in self._conns), key=lambda r: (r[0], r[1])):
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


LARGE_BUNDLE = 4 << 20
LARGE_PAGE = 32768


@final
class StagingFile:
    """A SQLite bundle being written: the schema, entries in key order, then the manifest.

    Written without a journal (it is a staging file: a failure discards it)
    and switched to journal mode DELETE when finished, so the bundle reads
    from a read-only directory without a shared-memory file beside it.

    A bundle expected to hold `LARGE_BUNDLE` bytes or more is written with
    pages of `LARGE_PAGE` bytes instead of SQLite's 4 KiB: every pass an
    import makes over it (its checks, the digest, the copy) then reads a
    tenth as many pages, each one system call, and rows of about 1 KiB
    waste a quarter of a 4 KiB page but little of a large one. Small bundles
    keep small pages, which cost nothing to read either way.
    """

    def __init__(self, path: Path, *, expected_bytes: int = 0) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._copied_rowid = 0
        self._copy_after: tuple[str, bytes] | None = None
        self._attached = False
        self.skipped = 0
        try:
            with _writing(path):
                conn = self._conn = sqlite3.connect(
                    f"{path.resolve().as_uri()}?mode=rwc",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                )
                if expected_bytes >= LARGE_BUNDLE:
                    conn.execute(f"PRAGMA page_size={LARGE_PAGE}")  # before the first table
                conn.execute("PRAGMA journal_mode=OFF")
                conn.execute("PRAGMA synchronous=OFF")
                schema.create_schema(conn)
        except BaseException:
            self.close()
            raise

    def _connection(self) -> sqlite3.Connection:
        assert self._conn is not None, "the staging file is closed"
        return self._conn

    def begin(self) -> None:
        with _writing(self.path):
            self._connection().execute("BEGIN")

    def add(self, rows: list[Row]) -> None:
        """Append entries (already in key order) as IMPORTED."""
        with _writing(self.path):
            self._connection().executemany(
                "INSERT INTO entries (namespace, key, value, origin) "
                f"VALUES (?, ?, ?, {int(Origin.IMPORTED)})",
                rows,
            )

    def attach_source(self, source: Path, prefixes: list[str] | None) -> dict[str, tuple[int, int]]:
        """Copy from one environment inside SQLite; the totals under one snapshot."""
        with _reading(str(source)):
            return self._attach_source(source, prefixes)

    def _attach_source(
        self, source: Path, prefixes: list[str] | None
    ) -> dict[str, tuple[int, int]]:
        conn = self._connection()
        error: sqlite3.Error | None = None
        for immutable in (False, True):
            try:
                conn.execute(
                    f"ATTACH DATABASE ? AS {_SOURCE}",
                    (read_only_uri(source, immutable=immutable),),
                )
                self._attached = True
                columns = schema.entry_columns(conn, _SOURCE)
                break
            except sqlite3.Error as exc:
                if self._attached:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute(f"DETACH DATABASE {_SOURCE}")
                    self._attached = False
                error = exc
        else:
            raise NotEntryFileError(f"{source} cannot be read as a warmenv environment ({error})")
        if columns[:3] != schema.ENTRY_COLUMNS[:3]:
            raise NotEntryFileError(f"{source} is not a warmenv environment (no entries table)")
        conn.text_factory = schema.decode_text
        exportable = _Exportable.of([conn], f"{_SOURCE}.entries", prefixes)
        self._where, self._params = exportable.where, exportable.params
        conn.execute("BEGIN")  # one snapshot of the source for the totals and the copy
        rows = schema.namespace_totals(
            conn, table=f"{_SOURCE}.entries", where=self._where, params=self._params
        )
        self.skipped = exportable.left_out(conn)
        self._copy_after = ("", b"")
        return {namespace: (count, size) for namespace, count, size in rows}

    def copy_step(self) -> list[Row]:
        """Copy the next batch from the attached source; the rows as written (empty: done)."""
        with _writing(self.path):
            return self._copy_step()

    def _copy_step(self) -> list[Row]:
        conn = self._connection()
        assert self._copy_after is not None, "attach_source() first"
        after, params = "", list(self._params)
        if self._copied_rowid:  # past the first batch: continue after the last row copied
            after = " AND (namespace, key) > (?, ?)"
            params += self._copy_after
        conn.execute(
            "INSERT INTO main.entries (namespace, key, value, origin) "
            f"SELECT namespace, key, value, {int(Origin.IMPORTED)} FROM {_SOURCE}.entries "
            f"WHERE {self._where}{after} ORDER BY namespace, key LIMIT {_BATCH}",
            params,
        )
        rows = conn.execute(
            "SELECT rowid, namespace, key, value FROM main.entries WHERE rowid > ? ORDER BY rowid",
            (self._copied_rowid,),
        ).fetchall()
        if not rows:
            return []
        last = rows[-1]
        self._copied_rowid = last[0]
        self._copy_after = (last[1], last[2])
        return [(namespace, key, value) for _, namespace, key, value in rows]

    def finish(self, manifest_json: str) -> None:
        """Write the manifest, commit, and leave a closed file in journal mode DELETE."""
        with _writing(self.path):
            self._finish(manifest_json)

    def _finish(self, manifest_json: str) -> None:
        conn = self._connection()
        conn.execute(
            "INSERT INTO meta (k, v) VALUES ('schema_version', ?), ('manifest', ?)",
            (schema.SCHEMA_VERSION, manifest_json),
        )
        conn.execute("COMMIT")
        if self._attached:
            conn.execute(f"DETACH DATABASE {_SOURCE}")
            self._attached = False
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
        self._conn = None

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()


@attrs.frozen
class _Exportable:
    """Which rows of a source an export takes: entries of the right types, under the
    prefixes, in namespaces that are UTF-8 text (written by something else, one may not be).
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
                bytes(raw)
                for conn in conns
                for (raw,) in conn.execute(f"SELECT DISTINCT CAST(namespace AS BLOB) FROM {table}")
                if not _is_utf8(bytes(raw))
            }
        )
        where = f"{schema.well_typed()} AND {matches}"
        if bad:
            where += f" AND CAST(namespace AS BLOB) NOT IN ({','.join('?' * len(bad))})"
        return cls(table, where, [*match_params, *bad], matches, [*match_params])

    def left_out(self, conn: sqlite3.Connection) -> int:
        """How many rows under the prefixes the condition leaves out (wrong types, not UTF-8)."""
        row = conn.execute(
            f"SELECT count(*) FROM {self.table} WHERE {self.matches} AND NOT ({self.where})",
            [*self.match_params, *self.params],
        ).fetchone()
        return int(row[0])


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def manifest_of(path: Path) -> object:
    """The `manifest` meta value of a SQLite file, or `None` (is it a bundle?)."""
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
        try:
            return schema.meta_value(conn, "manifest")
        finally:
            conn.close()
    except sqlite3.Error:
        return None
