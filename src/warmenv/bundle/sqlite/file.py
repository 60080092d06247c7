"""The SQLite bundle's file, read: opened read-only, checked whole, paged and hashed.

The SQL of reading a SQLite bundle lives here, so `warmenv.bundle.sqlite.bundle`
speaks bundles and never touches `sqlite3`: it asks for a file to be opened
and checked, for pages of one namespace, and for its entries in key order
(to hash them). Whatever is wrong with the file is raised here, as the
`BundleError` a caller acts on, naming the file: a file that is not a bundle
of warmenv's schema is `NotABundleError`; one that is but holds damage (a
malformed page, a row of the wrong types, a key twice) `CorruptBundleError`;
one of a newer format than this warmenv reads `UnsupportedSchemaError`; one
whose manifest is over the limit `InvalidManifestError`, found by its size alone.

The rows are read from the table itself (`NOT INDEXED`, in rowid order), never
through the (namespace, key) index, but by the readers by key (`get`, a page):
the digest vouches for the rows, not for the index, so whatever is read through
the index is proven first. Every open (and a digest pass) proves that each index
entry names its own row (`_Index.pair`, one join): a file whose index pairs a key
with another row's value is refused by every reader. A reader by key also proves,
once, that the index finds every row by its key (`_Index.prove`, SQLite's
integrity check), since a miss there is an answer too.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import AsyncGenerator, Callable, Generator
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar, final

import anyio
import attrs

from warmenv import _sqlite
from warmenv.bundle.errors import CorruptBundleError, NotABundleError, UnsupportedSchemaError
from warmenv.bundle.manifest import (
    MAX_MANIFEST_BYTES,
    U64,
    BackgroundDigest,
    check_manifest_size,
    oversized_manifest,
)
from warmenv.bundle.sqlite import schema as bundle_schema
from warmenv.persistence import carried
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.sqlite import schema
from warmenv.persistence.storage import NamespaceSummary

__all__ = ["HASH_SLICE", "BundleFile"]

T = TypeVar("T")
_BATCH = 1024


def _is_not_database(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return "not a database" in text or "file is encrypted" in text


def _not_a_bundle(label: str, why: str) -> NotABundleError:
    return NotABundleError(f"{label} is a SQLite database but not a warmenv bundle: {why}")


@final
class BundleFile:
    """A SQLite file of the entries schema, opened read-only and checked (a bundle)."""

    __slots__ = ("_connection", "_index", "format", "label", "manifest", "namespaces", "path")

    def __init__(
        self,
        connection: _sqlite.Connection,
        path: Path,
        label: str,
        checked: _Checked,
    ) -> None:
        self._connection = connection
        self.path = path
        self.label = label
        """How errors name the file (its path, or a redacted URL)."""
        self.manifest = checked.manifest
        """The raw `meta` value under `manifest` (any SQLite type), or None."""
        self.namespaces = checked.namespaces
        self.format = checked.format
        """The bundle format its columns are (1 or 2); None: an environment's columns."""
        self._index = checked.index

    @classmethod
    async def open(cls, path: Path, label: str, *, check_rows: bool = True) -> BundleFile:
        """Open read-only and check the schema, every row's types and the index's pairs.

        A manifest over `MAX_MANIFEST_BYTES` is refused by its size alone,
        before any of it is read into Python. `check_rows=False` leaves the
        rows' types and the index's pairs to `hash_entries`, which checks them
        as it reads: for a file that is hashed before any use.
        """
        # Immutable: the main file alone is read, exactly the bytes an import's
        # private copy holds (never a -wal file beside it), and nothing is created.
        uri = bundle_schema.read_only_uri(path, immutable=True)
        try:
            connection, checked = await _sqlite.open_with(
                uri, partial(_check_file, label, check_rows, uri), uri=True
            )
        except UnicodeDecodeError as exc:
            raise CorruptBundleError(f"{label}: text that is not UTF-8 ({exc})") from None
        except sqlite3.Error as exc:
            if _is_not_database(exc):
                raise _not_a_bundle(label, f"SQLite cannot read it ({exc})") from None
            raise CorruptBundleError(f"{label}: SQLite cannot read it ({exc})") from None
        return cls(connection, path, label, checked)

    async def get(self, namespace: str, key: bytes) -> bytes | None:
        return await self._by_key(partial(schema.value_of, namespace, key))

    async def page(
        self, namespace: str, after: bytes | None, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Up to `limit` entries of `namespace` after the key `after`, in key order."""
        return await self._by_key(partial(_page, namespace, after, limit))

    async def page_carrying(
        self, namespace: str, after: bytes | None, limit: int
    ) -> list[CarryingEntry]:
        """As `page`, each entry with the written_at and cost it carries (believed, or None)."""
        return await self._by_key(partial(_page_carrying, self.format, namespace, after, limit))

    async def _by_key(self, read: Callable[[sqlite3.Connection], T]) -> T:
        """`read`, which goes through the entries' index, once the index is proven."""
        return await self._run(partial(self._index.read, read))

    async def hash_entries(self) -> AsyncGenerator[int | str, None]:
        """The content digest of every entry, in key order: the bytes of keys and values
        done so far after each slice of the pass (an int), then the digest (a str).

        Bundles are written in key order, so the table is read in rowid order
        (sequentially) while checking that each row sorts after the last. A
        file whose rows are not in key order falls back to SQLite's integrity
        check and a read in index order, with a fresh digest (and the count
        of bytes done starts again from 0). A (namespace, key) that appears
        twice is damage either way: the digest would vouch for two values of
        which an import keeps one. So is an index pairing a key with another
        row (`_Index.pair`, unless the open checked it already).

        Each slice (about `HASH_SLICE` bytes) is one hop to the worker, so a
        caller can show how far the pass is, and cancel it between slices.
        """
        steps = await self._run(partial(_hash_entries, self.label, self.format, self._index))
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
            raise CorruptBundleError(f"{self.label}: reading failed ({exc})") from None

    async def close(self) -> None:
        await self._connection.close()


@attrs.frozen
class _Checked:
    manifest: object
    namespaces: list[NamespaceSummary]
    format: int | None
    index: _Index


@final
@attrs.define
class _Index:
    """The entries' (namespace, key) index of one open file, and what is proven of it.

    `paired`: each index entry names its own row (the rowid of the row that
    holds the entry's namespace and key), and there are as many entries as
    rows, so no read through it pairs a key with another key's value.
    `proven`: SQLite's integrity check passed, which also finds every row by
    its key through the index: what a reader by key needs, for whom a miss is
    an answer too. Used on the connection's worker thread alone, one call at a
    time, so each proof runs once (one that failed runs, and fails, again).
    """

    label: str
    rows: int
    """The table's rows (counted from the table, with the totals)."""
    paired: bool = False
    proven: bool = False

    def pair(self, conn: sqlite3.Connection) -> None:
        """`CorruptBundleError` unless each index entry names its own row: one join of
        the index, read alone, with the table by rowid (about a quarter of the
        integrity check's instructions)."""
        if self.paired:
            return
        self.check_pairs(*_pair_counts(conn))

    def check_pairs(self, indexed: int, paired: int) -> None:
        """`CorruptBundleError` unless the index holds `rows` entries (`indexed`), each
        naming its own row (`paired`): the counts `pair` takes (`_pair_counts`)."""
        if not self.rows == indexed == paired:
            raise CorruptBundleError(
                f"{self.label}: its index does not match its rows ({self.rows:,} rows, "
                f"{indexed:,} index entries, {paired:,} of them naming their own row)"
            )
        self.paired = True

    def prove(self, conn: sqlite3.Connection) -> None:
        """`CorruptBundleError` unless SQLite's integrity check passes (run once)."""
        if not self.proven:
            _integrity(conn, self.label)
            self.proven = self.paired = True

    def read(self, reader: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
        """`reader`'s answer, read through the index once the index is proven."""
        self.prove(conn)
        return reader(conn)


# The primary key's index (`bundle_schema.unlike_ours` allows no other), read alone.
_INDEXED = "SELECT count(*) FROM entries INDEXED BY sqlite_autoindex_entries_1"
# Each index entry (namespace, key and rowid read from the index: a covering scan)
# joined with the row of its rowid (read from the table) if that row holds the same.
_PAIRED = (
    "SELECT count(*) FROM entries AS i INDEXED BY sqlite_autoindex_entries_1 "
    "JOIN entries AS t NOT INDEXED "
    "ON t.rowid = i.rowid AND t.namespace IS i.namespace AND t.key IS i.key"
)


def _pair_counts(conn: sqlite3.Connection) -> tuple[int, int]:
    """The index's entries, and how many of them name their own row (`_Index.pair`)."""
    (indexed,) = conn.execute(_INDEXED).fetchone()
    (paired,) = conn.execute(_PAIRED).fetchone()
    return int(indexed), int(paired)


def _wrong_types(typed: str, conn: sqlite3.Connection) -> int:
    """How many rows fail `typed` (the types every row of a bundle has), read alone."""
    (count,) = conn.execute(
        f"SELECT count(*) FROM entries NOT INDEXED WHERE NOT ({typed})"
    ).fetchone()
    return int(count)


@final
class _Beside(Generic[T]):
    """One read of the file (`read`) on a connection and thread of its own, while the
    open's thread reads the same file for its runs and totals.

    The open's reads before a trusting import's first commit are independent
    passes over an immutable file (the private copy, opened `immutable=1`):
    the runs and totals (about 3,000 instructions an entry), every row's types
    (2,100) and the index's pairs (1,600). Run side by side, the open waits
    for the longest alone; sqlite3 lets go of the GIL while a statement steps.
    Started only once the schema is checked on the open's connection (the
    index read by name is the one `unlike_ours` allows).
    """

    __slots__ = ("_error", "_read", "_result", "_thread", "_uri")

    def __init__(self, uri: str, read: Callable[[sqlite3.Connection], T]) -> None:
        self._uri = uri
        self._read = read
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="warmenv-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            conn = _sqlite.open_file(self._uri)
            try:
                self._result = self._read(conn)
            finally:
                conn.close()
        except BaseException as exc:  # raised again on the open's thread, by `result`
            self._error = exc

    def wait(self) -> None:
        """Until the thread is done (its connection closed)."""
        self._thread.join()

    def result(self) -> T:
        """What the read returned, once the thread is done; what it raised, raised here."""
        self.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


# The bundle format of each entries table warmenv reads; an environment's table
# (None) is read only to say that the file is an environment.
_FORMATS: dict[tuple[tuple[str, str], ...], int | None] = {
    **{tuple(columns): format for format, columns in bundle_schema.COLUMNS.items()},
    tuple(schema.ENVIRONMENT_COLUMNS): None,
}


def _check_file(label: str, check_rows: bool, uri: str, conn: sqlite3.Connection) -> _Checked:
    view = bundle_schema.first_view(conn)
    if view is not None:
        raise _not_a_bundle(label, f"it has a view {view!r}, which no warmenv bundle has")
    tables = schema.table_names(conn)
    if not {"meta", "entries"} <= tables:
        missing = sorted({"meta", "entries"} - tables)
        raise _not_a_bundle(label, f"it has no {' or '.join(repr(t) for t in missing)} table")
    newer = bundle_schema.newer_version(conn)
    if newer is not None:
        raise UnsupportedSchemaError(
            f"{label}: it is a bundle of format {newer}, newer than this warmenv reads "
            f"(1 and {bundle_schema.BUNDLE_VERSION}); upgrade warmenv"
        )
    columns = schema.entry_columns(conn)
    if tuple(columns) not in _FORMATS:
        raise _not_a_bundle(label, f"its entries table has columns {columns}, not warmenv's")
    format = _FORMATS[tuple(columns)]
    if format is not None:  # an environment's table is refused (as one) by the caller
        unlike = (
            bundle_schema.unlike_ours(conn, format)
            or bundle_schema.foreign_meta(conn)
            or bundle_schema.version_unlike(conn, format)
        )
        if unlike is not None:
            raise _not_a_bundle(label, unlike)
        if not bundle_schema.meta_index_agrees(conn):
            raise CorruptBundleError(f"{label}: its meta table's index does not match its rows")
    try:
        size = bundle_schema.manifest_size(conn, limit=MAX_MANIFEST_BYTES)
    except sqlite3.DataError:
        raise oversized_manifest(None, label) from None  # refused unread: over the limit
    if size is not None:
        check_manifest_size(size, label)
    manifest = schema.meta_value(conn, "manifest")
    # The rows' types are the digest pass's where one follows (it reads every row).
    typed = schema.well_typed() + (f" AND {carried.typed_sql()}" if format == 2 else "")
    # The rows' types and the index's pairs, each beside the totals (an environment's
    # table is refused as one: its pairs are not read).
    types = _Beside(uri, partial(_wrong_types, typed)) if check_rows else None
    pairs = _Beside(uri, _pair_counts) if check_rows and format is not None else None
    try:
        # Read from the table, not through the index: nothing has proven the index yet.
        totals = _totals(conn, label, types)
    except BaseException:
        for beside in (types, pairs):
            if beside is not None:
                beside.wait()  # what the open found first is what is raised, as before
        raise
    index = _Index(label, sum(summary.entries for summary in totals))
    if pairs is not None:
        index.check_pairs(*pairs.result())
    return _Checked(manifest, totals, format, index)


def _totals(
    conn: sqlite3.Connection, label: str, types: _Beside[int] | None
) -> list[NamespaceSummary]:
    """Each namespace's entries and bytes, read from the table, in namespace order.

    A bundle warmenv exported holds its rows in key order, one after the
    other (rowids without gaps): each namespace is then one run of rowids
    (`_runs`), whose totals are one range read of the table each. A file
    made otherwise is grouped by namespace (SQLite sorts the namespaces and
    sizes of every row).

    `types`: for a file read without a digest (the digest pass checks every
    row as it reads it), the count of the rows of the wrong types, read beside
    the totals (`_Beside`) and raised once they are read; where the rows are
    not in runs, a (namespace, key) held twice is then also looked for (the
    runs' check of key order rules it out).
    """
    totals: list[NamespaceSummary] = []
    runs = _runs(conn, label)
    if runs is not None:
        for namespace, text, start, end in runs:
            count, size = conn.execute(_RUN_TOTALS, (start, end)).fetchone()
            totals.append(NamespaceSummary(namespace, int(count), int(size), text))
    else:
        for name, count, size, text in conn.execute(_GROUPED_TOTALS):
            totals.append(NamespaceSummary(name, int(count), int(size), bool(text)))
    bad = 0 if types is None else types.result()
    if bad:
        what = "1 row has" if bad == 1 else f"{int(bad):,} rows have"
        raise CorruptBundleError(
            f"{label}: {what} a namespace, key, value, written_at or cost of the wrong type"
        )
    if runs is None and types is not None:
        twice = conn.execute(
            "SELECT namespace, key FROM entries NOT INDEXED "
            "GROUP BY namespace, key HAVING count(*) > 1 LIMIT 1"
        ).fetchone()
        if twice is not None:
            raise _duplicate(label, *twice)
    return totals


_MAX_RUNS = 4096  # namespaces in runs of rowids; a file of more is grouped instead
_LAST_ROWID = (1 << 63) - 1
_RUN_TOTALS = (
    f"SELECT count(*), coalesce(sum({schema.ENTRY_BYTES}), 0) "
    "FROM entries NOT INDEXED WHERE rowid BETWEEN ? AND ?"
)
# A co-routine hands the sorter each row's namespace and size alone (grouping the
# table itself would sort every key and value with them).
_GROUPED_TOTALS = (
    "SELECT name, count(*), coalesce(sum(size), 0), text FROM ("
    f"SELECT namespace AS raw, {schema.namespace_read()} AS name, "
    f"{schema.text_read()} AS text, {schema.ENTRY_BYTES} AS size "
    "FROM entries NOT INDEXED LIMIT -1"
    ") GROUP BY raw ORDER BY raw"
)
# The rows where key order is not simply the next key of the same namespace: the
# first row, a row after a gap in the rowids, a new namespace, a key not above the
# one before (each row beside the row of the rowid before it, found by rowid).
_BOUNDARIES = (
    "SELECT a.rowid, b.rowid IS NULL, a.namespace IS NOT b.namespace, "
    "b.namespace < a.namespace, b.key = a.key, a.namespace, a.key, "
    f"{schema.namespace_read('a.namespace')}, {schema.text_read('a.namespace')} "
    "FROM entries AS a NOT INDEXED LEFT JOIN entries AS b NOT INDEXED ON b.rowid = a.rowid - 1 "
    "WHERE b.rowid IS NULL OR b.namespace IS NOT a.namespace OR b.key >= a.key "
    "ORDER BY a.rowid LIMIT ?"
)


def _runs(conn: sqlite3.Connection, label: str) -> list[tuple[str, bool, int, int]] | None:
    """Each namespace's run of rowids, as (namespace, is text, first, last rowid), if
    the rows are in key order without gaps in their rowids; else None.

    One read of the table, each row beside the one before it (by rowid), keeps
    only the rows where a namespace starts or where order breaks; in key order
    no (namespace, key) is held twice, and one that is raises here.
    """
    rows = conn.execute(_BOUNDARIES, (_MAX_RUNS + 1,)).fetchall()
    if len(rows) > _MAX_RUNS:
        return None
    starts: list[tuple[str, bool, int]] = []
    for rowid, first, new_namespace, forward, same_key, namespace, key, name, text in rows:
        if first:
            if starts:
                return None  # a gap in the rowids: the row before it is elsewhere
        elif not new_namespace:
            if same_key:
                raise _duplicate(label, namespace, key)
            return None  # a key below the one before it
        elif not forward:
            return None  # a namespace below the one before it
        starts.append((name, bool(text), int(rowid)))
    ends = [start - 1 for _, _, start in starts[1:]] + [_LAST_ROWID] if starts else []
    return [(name, text, start, end) for (name, text, start), end in zip(starts, ends, strict=True)]


def _integrity(conn: sqlite3.Connection, label: str) -> None:
    """Refuse a file SQLite's integrity check finds damaged: above all an index that
    does not hold exactly its table's rows, each found by its key. Every read by key
    (a `get`, a page) goes through the entries' index, which the digest does not
    cover (it is taken from the rows in rowid order): an index pairing a key with
    another row's rowid would serve that key another key's value, one that lacks a
    key would answer that the bundle does not hold it."""
    problems = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
    if problems != ["ok"]:
        raise CorruptBundleError(f"{label}: SQLite finds it damaged: {'; '.join(problems)}")


def _page(
    namespace: str, after: bytes | None, limit: int, conn: sqlite3.Connection
) -> list[tuple[bytes, bytes]]:
    if after is None:
        sql = "SELECT key, value FROM entries WHERE namespace = ? ORDER BY key LIMIT ?"
        return conn.execute(sql, (namespace, limit)).fetchall()
    sql = "SELECT key, value FROM entries WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?"
    return conn.execute(sql, (namespace, after, limit)).fetchall()


def _page_carrying(
    format: int | None, namespace: str, after: bytes | None, limit: int, conn: sqlite3.Connection
) -> list[CarryingEntry]:
    columns = bundle_schema.CARRIED_READ if format == 2 else "NULL, NULL"
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


def _duplicate(label: str, namespace: object, key: object) -> CorruptBundleError:
    return CorruptBundleError(f"{label}: the key {key!r} of namespace {namespace!r} appears twice")


class _Order:
    """The (namespace, key) of the last row a pass took, to check the next against."""

    __slots__ = ("key", "namespace")

    def __init__(self) -> None:
        self.namespace: str | None = None
        self.key = b""


def _take(
    rows: list[tuple[Any, ...]],
    label: str,
    format: int | None,
    last: _Order,
    hasher: BackgroundDigest,
) -> int:
    """Check a batch of rows and hand it to the hasher, in one loop: their types, each
    sorting after the last (else `_NotInKeyOrder`), no key twice; each framed as the
    digest frames an entry (`Digest.update`: in format 2 with its 16 carried bytes).
    The bytes of keys and values. (One loop, not a check and then a framing: this is
    most of the Python a digest-checked import runs.)"""
    namespace, key = last.namespace, last.key
    prefix = b"" if namespace is None else hasher.prefix(namespace)
    size = 0
    parts: list[bytes] = []
    u64, pack, carrying = U64, carried.pack, format == 2
    for row in rows:
        row_namespace, row_key, value = row[0], row[1], row[2]
        if type(row_namespace) is not str or type(row_key) is not bytes or type(value) is not bytes:
            raise CorruptBundleError(f"{label}: a row's namespace, key or value has the wrong type")
        if row_namespace != namespace:
            if namespace is not None and row_namespace < namespace:
                raise _NotInKeyOrder
            namespace = row_namespace
            prefix = hasher.prefix(namespace)
        elif row_key <= key:
            if row_key == key:
                raise _duplicate(label, namespace, key)
            raise _NotInKeyOrder
        key = row_key
        size += len(key) + len(value)
        if carrying:
            written_at, cost = row[3], row[4]
            if (written_at is not None and type(written_at) is not float) or (
                cost is not None and type(cost) is not float
            ):
                raise CorruptBundleError(
                    f"{label}: a row has its written_at or cost not REAL or NULL"
                )
            parts += (prefix, u64(len(key)), key, u64(len(value)), value, pack(written_at, cost))
        else:
            parts += (prefix, u64(len(key)), key, u64(len(value)), value)
    last.namespace, last.key = namespace, key
    hasher.add_framed(parts)
    return size


def _hash_entries(
    label: str, format: int | None, index: _Index, conn: sqlite3.Connection
) -> Generator[int, None, str]:
    """A hashing pass over `conn`, run a slice per `next` on its thread: yields the bytes
    done so far after each slice (from 0), returns the digest."""
    columns = "namespace, key, value" + (", written_at, cost" if format == 2 else "")
    try:
        sql = f"SELECT {columns} FROM entries NOT INDEXED ORDER BY rowid"
        digest = yield from _hash_in(sql, conn, label, format)
    except _NotInKeyOrder:
        pass
    else:
        index.pair(conn)  # a file verified is refused as one opened would be
        return digest
    # Reading in index order trusts the index to match the table: prove it.
    index.prove(conn)
    try:
        sql = f"SELECT {columns} FROM entries ORDER BY namespace, key"
        return (yield from _hash_in(sql, conn, label, format))
    except _NotInKeyOrder:
        raise CorruptBundleError(f"{label}: its index does not keep its rows in order") from None


def _hash_in(
    sql: str, conn: sqlite3.Connection, label: str, format: int | None
) -> Generator[int, None, str]:
    """Hash the rows `sql` reads, which must come in key order (else `_NotInKeyOrder`)."""
    yield 0
    hasher = BackgroundDigest(format or 1)
    last = _Order()
    done = reported = 0
    try:
        cursor = conn.execute(sql)
        while rows := cursor.fetchmany(_HASH_ROWS):
            size = _take(rows, label, format, last, hasher)
            done += size
            if done - reported >= HASH_SLICE:
                reported = done
                yield done
        if done != reported:
            yield done
        return hasher.value()
    finally:
        hasher.close()
