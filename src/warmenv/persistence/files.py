"""Entry files read whole: SQLite bundles, export sources and export staging files.

Import and export move entries in bulk between an environment and a file of
the same schema. The SQL for that lives here, beside the environment's own,
so the bundle modules never touch `sqlite3`: they ask for a file to be
opened and checked, for its entries in key order (to hash them), for pages
of one namespace, and for a staging file to be filled and finished. A file
that is not of the schema raises `NotEntryFileError`; one that is but holds
damage (a malformed page, a row of the wrong types) raises
`DamagedEntryFileError`; a bundle of a newer format than this warmenv reads
raises `NewerEntryFileError`. The bundle layer turns them into its own errors.

A file is read in either bundle format: 1, the four columns of 0.1, and 2,
which adds each entry's `written_at` and `cost` (`warmenv.persistence.carried`)
and is what export writes by default, filled from the source environment.
A staging file is written in either, format 1 for readers that know no other.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import sqlite3
from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar, final

import anyio
import attrs

from warmenv import _sqlite
from warmenv.persistence import carried
from warmenv.persistence import schema as bundle_schema
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.sqlite import schema, uris
from warmenv.persistence.storage import NamespaceSummary, Origin

__all__ = [
    "DamagedEntryFileError",
    "EntryFile",
    "EntryFileError",
    "ExportSources",
    "NewerEntryFileError",
    "NotEntryFileError",
    "OversizedManifestError",
    "StagingFile",
    "StagingWriteError",
]

T = TypeVar("T")
Row = tuple[str, bytes, bytes]
CarriedRow = tuple[str, bytes, bytes, float | None, float | None]
"""(namespace, key, value, written_at, cost): an entry and what it carries."""
_BATCH = 1024
_SOURCE = "warmenv_source"


class EntryFileError(Exception):
    """A file could not be read as an entry file (the message says why)."""


class NotEntryFileError(EntryFileError):
    """The file is not a SQLite database of warmenv's schema at all."""


class DamagedEntryFileError(EntryFileError):
    """The file is of warmenv's schema but damaged (malformed pages or rows)."""


class NewerEntryFileError(EntryFileError):
    """The file is a bundle of a format newer than this warmenv reads."""


class OversizedManifestError(EntryFileError):
    """The file's manifest is larger than the caller accepts; `size` is its bytes
    (`None`: SQLite refused it unread, so only known to be over the limit)."""

    def __init__(self, size: int | None) -> None:
        super().__init__("its manifest is " + ("too large" if size is None else f"{size:,} bytes"))
        self.size = size


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
    """What `EntryFile.hash_entries` feeds: batches of rows in key order.

    `add` for a file of format 1; `add_carrying` for format 2, each entry with
    its 16 carried bytes (`carried.pack` of the values as stored).
    """

    def add(self, entries: Iterable[Row]) -> None: ...

    def add_carrying(self, entries: Iterable[tuple[str, bytes, bytes, bytes]]) -> None: ...

    def value(self) -> str: ...

    def close(self) -> None: ...


def _is_not_database(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return "not a database" in text or "file is encrypted" in text


@final
class EntryFile:
    """A SQLite file of the entries schema, opened read-only and checked (a bundle)."""

    __slots__ = ("_connection", "format", "manifest", "namespaces", "path", "utf8")

    def __init__(
        self,
        connection: _sqlite.Connection,
        path: Path,
        checked: _Checked,
    ) -> None:
        self._connection = connection
        self.path = path
        self.manifest = checked.manifest
        """The raw `meta` value under `manifest` (any SQLite type), or None."""
        self.namespaces = checked.namespaces
        self.utf8 = checked.utf8  # whether its text is UTF-8, as an environment's is
        self.format = checked.format
        """The bundle format its columns are (1 or 2); None: an environment's columns."""

    @classmethod
    async def open(
        cls, path: Path, *, max_manifest_bytes: int, check_rows: bool = True
    ) -> EntryFile:
        """Open read-only and check the schema and every row's types.

        A manifest over `max_manifest_bytes` is `OversizedManifestError`, found
        by its size alone, before any of it is read into Python.
        `check_rows=False` leaves the rows' types to `hash_entries`, which
        checks them as it reads: for a file that is hashed before any use.
        """
        # Immutable: the main file alone is read, exactly the bytes an import's
        # private copy holds (never a -wal file beside it), and nothing is created.
        try:
            connection, checked = await _sqlite.open_with(
                uris.read_only_uri(path, immutable=True),
                partial(_check_file, check_rows, max_manifest_bytes),
                uri=True,
            )
        except UnicodeDecodeError as exc:
            raise DamagedEntryFileError(f"text that is not UTF-8 ({exc})") from None
        except sqlite3.Error as exc:
            if _is_not_database(exc):
                raise NotEntryFileError(f"SQLite cannot read it ({exc})") from None
            raise DamagedEntryFileError(f"SQLite cannot read it ({exc})") from None
        return cls(connection, path, checked)

    async def get(self, namespace: str, key: bytes) -> bytes | None:
        return await self._run(partial(schema.value_of, namespace, key))

    async def page(
        self, namespace: str, after: bytes | None, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Up to `limit` entries of `namespace` after the key `after`, in key order."""
        return await self._run(partial(_page, namespace, after, limit))

    async def page_carrying(
        self, namespace: str, after: bytes | None, limit: int
    ) -> list[CarryingEntry]:
        """As `page`, each entry with the written_at and cost it carries (believed, or None)."""
        return await self._run(partial(_page_carrying, self.format, namespace, after, limit))

    async def hash_entries(
        self, new_hasher: Callable[[], Hasher]
    ) -> AsyncGenerator[int | str, None]:
        """Feed every entry, in key order, to a hasher: the bytes of keys and values
        done so far after each slice of the pass (an int), then its value (a str).

        Bundles are written in key order, so the table is read in rowid order
        (sequentially) while checking that each row sorts after the last. A
        file whose rows are not in key order falls back to SQLite's integrity
        check and a read in index order, with a fresh hasher (and the count
        of bytes done starts again from 0). A (namespace, key) that appears
        twice is damage either way: the digest would vouch for two values of
        which an import keeps one.

        Each slice (about `HASH_SLICE` bytes) is one hop to the worker, so a
        caller can show how far the pass is, and cancel it between slices.
        """
        steps = await self._run(partial(_hash_entries, new_hasher, self.format))
        try:
            while True:
                step = await self._run(partial(_next_step, steps))
                yield step
                if isinstance(step, str):
                    return
        finally:
            # The generator holds a cursor and a digest thread: closed where it ran
            # (unless the file was closed meanwhile: then collected, as the cursor is).
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self._connection.run(lambda _conn: steps.close())

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._connection.run(fn)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise DamagedEntryFileError(f"reading failed ({exc})") from None

    async def close(self) -> None:
        await self._connection.close()


@attrs.frozen
class _Checked:
    manifest: object
    namespaces: list[NamespaceSummary]
    utf8: bool
    format: int | None


# The bundle format of each entries table warmenv reads; an environment's table
# (None) is read only to say that the file is an environment.
_FORMATS: dict[tuple[tuple[str, str], ...], int | None] = {
    tuple(schema.ENTRY_COLUMNS): 1,
    tuple(bundle_schema.BUNDLE_COLUMNS): 2,
    tuple(schema.ENVIRONMENT_COLUMNS): None,
}


def _check_file(check_rows: bool, max_manifest: int, conn: sqlite3.Connection) -> _Checked:
    tables = schema.table_names(conn)
    if not {"meta", "entries"} <= tables:
        missing = sorted({"meta", "entries"} - tables)
        raise NotEntryFileError(f"it has no {' or '.join(repr(t) for t in missing)} table")
    _check_not_newer(conn)
    columns = schema.entry_columns(conn)
    if tuple(columns) not in _FORMATS:
        raise NotEntryFileError(f"its entries table has columns {columns}, not warmenv's")
    format = _FORMATS[tuple(columns)]
    try:
        size = schema.meta_size(conn, "manifest", limit=max_manifest)
    except sqlite3.DataError:
        raise OversizedManifestError(None) from None
    if size is not None and size > max_manifest:
        raise OversizedManifestError(size)
    manifest = schema.meta_value(conn, "manifest")
    # The table itself is scanned for rows of the wrong types (a damaged file can hold
    # rows its index lacks); the totals come through the index, which is far cheaper
    # than grouping a table scan.
    totals = schema.namespace_totals(conn)
    if check_rows:
        _check_rows(conn, format, sum(count for _, count, _ in totals))
    utf8 = str(conn.execute("PRAGMA encoding").fetchone()[0]).upper() == "UTF-8"
    return _Checked(manifest, [NamespaceSummary(n, c, b) for n, c, b in totals], utf8, format)


def _check_rows(conn: sqlite3.Connection, format: int | None, indexed: int) -> None:
    """Damage that reading the rows would meet: a row of the wrong types, a row the
    index lacks (`indexed`: the rows the totals counted), a (namespace, key) twice.

    A file that is hashed before use leaves this to the hash, which sees all of
    it in the one pass it makes anyway; this is one table scan, for a file read
    without a digest. A repeated key needs no scan of its own where the table
    has a unique (namespace, key) index holding every row (the row counts
    agree); a table without one is grouped by (namespace, key) to find it.
    """
    typed = schema.well_typed() + (f" AND {carried.typed_sql()}" if format == 2 else "")
    rows, bad = conn.execute(
        f"SELECT count(*), coalesce(sum(NOT ({typed})), 0) FROM entries"
    ).fetchone()
    if bad:
        what = "1 row has" if bad == 1 else f"{int(bad):,} rows have"
        raise DamagedEntryFileError(
            f"{what} a namespace, key, value, written_at or cost of the wrong type"
        )
    if rows != indexed:
        raise DamagedEntryFileError(f"its table holds {rows:,} rows but its index {indexed:,}")
    if _unique_entries(conn):
        return  # the index that holds every row holds no (namespace, key) twice
    twice = conn.execute(
        "SELECT namespace, key FROM entries GROUP BY namespace, key HAVING count(*) > 1 LIMIT 1"
    ).fetchone()
    if twice is not None:
        raise _duplicate(*twice)


def _unique_entries(conn: sqlite3.Connection) -> bool:
    """Whether the entries table has a unique index on exactly (namespace, key), as
    every bundle export writes has (its primary key); a file made otherwise may not."""
    indexes = conn.execute(
        "SELECT name FROM pragma_index_list('entries') WHERE \"unique\" AND NOT partial"
    )
    for (name,) in indexes.fetchall():
        columns = conn.execute(
            "SELECT name FROM pragma_index_info(?) ORDER BY seqno", (name,)
        ).fetchall()
        if columns == [("namespace",), ("key",)]:
            return True
    return False


_MAX_VERSION_BYTES = 64  # a schema_version is "1" or "2": a longer one is not read at all


def _check_not_newer(conn: sqlite3.Connection) -> None:
    """`NewerEntryFileError` for a bundle whose `schema_version` is above the newest format."""
    try:
        version = schema.meta_value(conn, "schema_version", limit=_MAX_VERSION_BYTES)
        is_bundle = schema.has_meta(conn, "manifest")
    except sqlite3.Error:
        return  # a `meta` of another shape: the checks that follow say what the file is
    try:
        newer = is_bundle and int(str(version)) > int(bundle_schema.BUNDLE_VERSION)
    except ValueError:
        newer = False
    if newer:
        raise NewerEntryFileError(
            f"it is a bundle of format {version}, newer than this warmenv reads "
            f"(1 and {bundle_schema.BUNDLE_VERSION}); upgrade warmenv"
        )


def _page(
    namespace: str, after: bytes | None, limit: int, conn: sqlite3.Connection
) -> list[tuple[bytes, bytes]]:
    if after is None:
        sql = "SELECT key, value FROM entries WHERE namespace = ? ORDER BY key LIMIT ?"
        return conn.execute(sql, (namespace, limit)).fetchall()
    sql = "SELECT key, value FROM entries WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?"
    return conn.execute(sql, (namespace, after, limit)).fetchall()


_BELIEVED = (
    f"{carried.believed_sql('written_at', carried.WRITTEN_AT_LIMIT)}, "
    f"{carried.believed_sql('cost', carried.COST_LIMIT)}"
)


def _page_carrying(
    format: int | None, namespace: str, after: bytes | None, limit: int, conn: sqlite3.Connection
) -> list[CarryingEntry]:
    columns = _BELIEVED if format == 2 else "NULL, NULL"
    after_sql, params = ("", [namespace]) if after is None else (" AND key > ?", [namespace, after])
    sql = (
        f"SELECT key, value, {columns} FROM entries WHERE namespace = ?{after_sql} "
        "ORDER BY key LIMIT ?"
    )
    return conn.execute(sql, [*params, limit]).fetchall()


class _NotInKeyOrder(Exception):
    pass


HASH_SLICE = 8 << 20
"""Bytes of keys and values hashed per hop to the worker (a progress step)."""
_HASH_ROWS = _BATCH  # rows read and hashed at a time


def _next_step(steps: Generator[int, None, str], conn: sqlite3.Connection) -> int | str:
    """The next progress step (bytes done) of a hashing pass, or its digest at the end."""
    try:
        return next(steps)
    except StopIteration as done:
        return str(done.value)


def _duplicate(namespace: object, key: object) -> DamagedEntryFileError:
    return DamagedEntryFileError(f"the key {key!r} of namespace {namespace!r} appears twice")


class _Order:
    """The (namespace, key) of the last row a pass took, to check the next against."""

    __slots__ = ("key", "namespace")

    def __init__(self) -> None:
        self.namespace: str | None = None
        self.key = b""


def _take(rows: list[tuple[Any, ...]], format: int | None, last: _Order) -> tuple[list[Any], int]:
    """Check a batch of rows in one loop (their types; each sorting after the last,
    else `_NotInKeyOrder`; no key twice) and frame it for the hasher: the entries
    (in format 2 each with its 16 carried bytes), and the bytes of keys and values."""
    namespace, key = last.namespace, last.key
    size = 0
    pack = carried.pack
    entries: list[Any] = rows if format != 2 else []
    for row in rows:
        if type(row[0]) is not str or type(row[1]) is not bytes or type(row[2]) is not bytes:
            raise DamagedEntryFileError("a row's namespace, key or value has the wrong type")
        if row[0] != namespace:
            if namespace is not None and row[0] < namespace:
                raise _NotInKeyOrder
            namespace = row[0]
        elif row[1] <= key:
            if row[1] == key:
                raise _duplicate(namespace, key)
            raise _NotInKeyOrder
        key = row[1]
        size += len(key) + len(row[2])
        if format == 2:
            written_at, cost = row[3], row[4]
            if (written_at is not None and type(written_at) is not float) or (
                cost is not None and type(cost) is not float
            ):
                raise DamagedEntryFileError("a row has its written_at or cost not REAL or NULL")
            entries.append((namespace, key, row[2], pack(written_at, cost)))
    last.namespace, last.key = namespace, key
    return entries, size


def _hash_entries(
    new_hasher: Callable[[], Hasher], format: int | None, conn: sqlite3.Connection
) -> Generator[int, None, str]:
    """A hashing pass over `conn`, run a slice per `next` on its thread: yields the bytes
    done so far after each slice (from 0), returns the digest."""
    columns = "namespace, key, value" + (", written_at, cost" if format == 2 else "")
    try:
        sql = f"SELECT {columns} FROM entries ORDER BY rowid"
        return (yield from _hash_in(sql, conn, new_hasher, format))
    except _NotInKeyOrder:
        pass
    # Reading in index order trusts the index to match the table: check that.
    problems = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
    if problems != ["ok"]:
        raise DamagedEntryFileError(f"SQLite finds it damaged: {'; '.join(problems)}")
    try:
        sql = f"SELECT {columns} FROM entries ORDER BY namespace, key"
        return (yield from _hash_in(sql, conn, new_hasher, format))
    except _NotInKeyOrder:
        raise DamagedEntryFileError("its index does not keep its rows in order") from None


def _hash_in(
    sql: str, conn: sqlite3.Connection, new_hasher: Callable[[], Hasher], format: int | None
) -> Generator[int, None, str]:
    """Hash the rows `sql` reads, which must come in key order (else `_NotInKeyOrder`)."""
    yield 0
    hasher = new_hasher()
    add = hasher.add_carrying if format == 2 else hasher.add
    last = _Order()
    done = reported = 0
    try:
        cursor = conn.execute(sql)
        while rows := cursor.fetchmany(_HASH_ROWS):
            entries, size = _take(rows, format, last)
            add(entries)
            done += size
            if done - reported >= HASH_SLICE:
                reported = done
                yield done
        if done != reported:
            yield done
        return hasher.value()
    finally:
        hasher.close()


# --- export: reading sources, writing a staging file -------------------------------


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
            with _reading(", ".join(map(str, paths))):
                self._where, self._params = self._condition(prefixes)
                self._carried = [_carried_columns(conn) for conn in self._conns]
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
            for namespace, key, value_len in self._merged(carrying=False):
                entries, size = totals.get(namespace, (0, 0))
                totals[namespace] = (entries + 1, size + len(key) + int(value_len))
            return totals

    def rows(self) -> Iterator[CarriedRow]:
        """Every entry in (namespace, key) order, with what it carries (believed, or None)."""
        with _reading(", ".join(map(str, self.paths))):
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

    `format_version` 2 (the default) writes what each entry carries; 1 writes
    0.1's four columns and `schema_version` '1', for readers of format 1
    only, and what the rows carry is dropped.
    """

    def __init__(self, path: Path, *, expected_bytes: int = 0, format_version: int = 2) -> None:
        self.path = path
        self.format_version = format_version
        # The columns written beyond (namespace, key, value, origin), and what the
        # rows read back carry: nothing in format 1.
        self._carrying = format_version == 2
        self._conn: sqlite3.Connection | None = None
        self._copied_rowid = 0
        self._copy_after: tuple[str, bytes] | None = None
        self._attached = False
        self._carried = "NULL, NULL"  # the SQL of what the attached source's rows carry
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
                bundle_schema.create_bundle_schema(conn, format_version)
        except BaseException:
            self.close()
            raise

    def _connection(self) -> sqlite3.Connection:
        assert self._conn is not None, "the staging file is closed"
        return self._conn

    def begin(self) -> None:
        with _writing(self.path):
            self._connection().execute("BEGIN")

    def add(self, rows: list[CarriedRow]) -> None:
        """Append entries (already in key order) as IMPORTED, with what they carry
        (in format 2; format 1 has no place for it)."""
        with _writing(self.path):
            if self._carrying:
                self._connection().executemany(
                    "INSERT INTO entries (namespace, key, value, origin, written_at, cost) "
                    f"VALUES (?, ?, ?, {int(Origin.IMPORTED)}, ?, ?)",
                    rows,
                )
            else:
                self._connection().executemany(
                    "INSERT INTO entries (namespace, key, value, origin) "
                    f"VALUES (?, ?, ?, {int(Origin.IMPORTED)})",
                    (row[:3] for row in rows),
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
        # Read-write first, as `_open_source`: detaching it, as the last
        # connection, removes the -wal and -shm files reading it needed.
        for uri in uris.open_uris(source, read_write=True):
            try:
                conn.execute(f"ATTACH DATABASE ? AS {_SOURCE}", (uri,))
                self._attached = True
                readable = schema.has_entry_columns(conn, _SOURCE)
                break
            except sqlite3.Error as exc:
                if self._attached:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute(f"DETACH DATABASE {_SOURCE}")
                    self._attached = False
                error = exc
        else:
            raise NotEntryFileError(f"{source} cannot be read as a warmenv environment ({error})")
        if not readable:
            raise NotEntryFileError(f"{source} is not a warmenv environment (no entries table)")
        self._carried = _carried_columns(conn, _SOURCE)
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

    def copy_step(self) -> list[CarriedRow]:
        """Copy the next batch from the attached source; the rows as written (empty: done),
        carrying nothing (`None`) in format 1."""
        with _writing(self.path):
            return self._copy_step()

    def _copy_step(self) -> list[CarriedRow]:
        conn = self._connection()
        assert self._copy_after is not None, "attach_source() first"
        after, params = "", list(self._params)
        if self._copied_rowid:  # past the first batch: continue after the last row copied
            after = " AND (namespace, key) > (?, ?)"
            params += self._copy_after
        carried_columns, carried_values, carried_read = (
            (", written_at, cost", f", {self._carried}", "written_at, cost")
            if self._carrying
            else ("", "", "NULL, NULL")
        )
        conn.execute(
            f"INSERT INTO main.entries (namespace, key, value, origin{carried_columns}) "
            f"SELECT namespace, key, value, {int(Origin.IMPORTED)}{carried_values} "
            f"FROM {_SOURCE}.entries "
            f"WHERE {self._where}{after} ORDER BY namespace, key LIMIT {_BATCH}",
            params,
        )
        rows = conn.execute(
            f"SELECT rowid, namespace, key, value, {carried_read} FROM main.entries "
            "WHERE rowid > ? ORDER BY rowid",
            (self._copied_rowid,),
        ).fetchall()
        if not rows:
            return []
        last = rows[-1]
        self._copied_rowid = last[0]
        self._copy_after = (last[1], last[2])
        return [row[1:] for row in rows]

    def finish(self, manifest_json: str) -> None:
        """Write the manifest, commit, and leave a closed file in journal mode DELETE."""
        with _writing(self.path):
            self._finish(manifest_json)

    def _finish(self, manifest_json: str) -> None:
        conn = self._connection()
        conn.execute(
            "INSERT INTO meta (k, v) VALUES ('schema_version', ?), ('manifest', ?)",
            (bundle_schema.BUNDLE_SCHEMA_VERSIONS[self.format_version], manifest_json),
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
                bytes(raw)
                for conn in conns
                for (raw,) in conn.execute(
                    # Other types are left out by well_typed (a NULL has no bytes to compare).
                    f"SELECT DISTINCT CAST(namespace AS BLOB) FROM {table} "
                    "WHERE typeof(namespace) = 'text'"
                )
                if not raw or not _is_utf8(bytes(raw))
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


def _carried_columns(conn: sqlite3.Connection, database: str = "main") -> str:
    """The SQL of the written_at and cost a source's rows carry into a bundle: believed
    values, or NULL from a version-1 environment, which has no such columns."""
    names = {name for name, _ in schema.entry_columns(conn, database)}
    return _BELIEVED if {"written_at", "cost"} <= names else "NULL, NULL"


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def has_manifest(path: Path) -> bool:
    """Whether a SQLite file's `meta` holds a manifest (is it a bundle?); its value
    is not read, so a hostile file's huge one costs nothing."""
    try:
        conn = sqlite3.connect(uris.read_only_uri(path), uri=True)
        try:
            return schema.has_meta(conn, "manifest")
        finally:
            conn.close()
    except sqlite3.Error:
        return False
