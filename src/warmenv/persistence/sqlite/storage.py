"""One namespace of an environment database: the `Storage` protocol over SQL.

Every operation is one function run on the connection's worker thread (one
hop). A write is a whole transaction inside that function, BEGIN IMMEDIATE to
COMMIT, so other processes see it all or nothing, the insert-rule check and
the write cannot be split by another writer, and a cancelled caller can never
leave a transaction open. A failure of SQLite is the protocol's answer
(a miss, `Failed`), logged, never an exception out of a lookup.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Generator,
    Iterable,
    Iterator,
)
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar, final

from warmenv import _sqlite
from warmenv.persistence import carried
from warmenv.persistence.arrivals import Arrivals
from warmenv.persistence.explain import Explanation
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.sqlite import schema
from warmenv.persistence.storage import (
    DEFAULT_SCAN_BATCH,
    BundleRef,
    Conflict,
    EntryInfo,
    Failed,
    HeldValues,
    Insertion,
    InsertItems,
    InsertSummary,
    NamespaceSummary,
    Origin,
    Purged,
    Storage,
    Stored,
    check_batch_size,
    check_bundle,
    check_cost,
    check_item,
    check_key,
    check_value,
    may_replace,
    wall_clock,
)

__all__ = ["Database", "SqlStorage", "SqliteStorage"]

log = logging.getLogger("warmenv.storage")

T = TypeVar("T")

_GET_MANY_CHUNK = 500
_REPLACE = (
    "INSERT OR REPLACE INTO entries (namespace, key, value, origin, written_at, cost, bundle) "
    "VALUES (?, ?, ?, ?, ?, ?, NULL)"
)


class Database(Protocol):
    """What a namespace's storage needs of the database it lives in.

    `SqliteDatabase` (`warmenv.persistence.sqlite.database`) is the one
    implementation; naming only this here keeps storage below the database
    that hands its namespaces out.
    """

    @property
    def connection(self) -> _sqlite.Connection: ...
    @property
    def path(self) -> Path: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def version(self) -> int: ...
    @property
    def arrivals(self) -> Arrivals: ...

    def forget_on_close(self, held: HeldValues) -> None: ...
    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
    def run_here(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
    async def touch(self, namespace: str, keys: Iterable[bytes]) -> int: ...
    async def explain(self, namespace: str, key: bytes | None) -> Explanation: ...


def _read_failed(storage: Storage, exc: sqlite3.Error) -> None:
    """A read of `storage` that failed: logged, and a miss (`get`, `start_get`)."""
    log.warning("read of %s failed, treated as a miss: %s", storage.describe(), exc)


@final
class _Reading:
    """`SqlStorage.start_get`'s `PendingGet`: the worker's read, a failure a miss as in `get`."""

    __slots__ = ("_read", "_storage")

    def __init__(self, storage: SqlStorage, read: _sqlite.Pending[bytes | None]) -> None:
        self._storage = storage
        self._read = read

    async def result(self) -> bytes | None:
        try:
            return await self._read.result()
        except sqlite3.Error as exc:
            _read_failed(self._storage, exc)
            return None


class SqlStorage(Storage):
    """One namespace of an environment's database, in a file or in memory.

    The one implementation of the `Storage` contract over SQL: `SqliteStorage`
    (a file) and `MemoryStorage` (`warmenv.persistence.memory`) differ only in
    where their database lives and how they describe themselves.
    """

    __slots__ = ("_db", "_namespace")

    def __init__(self, db: Database, namespace: Namespace | str) -> None:
        self._db = db
        self._namespace = str(Namespace.coerce(namespace))

    @property
    def namespace(self) -> str:
        return self._namespace

    async def get(self, key: bytes) -> bytes | None:
        check_key(key)
        try:
            return await self._db.run(partial(schema.value_of, self._namespace, key))
        except sqlite3.Error as exc:
            _read_failed(self, exc)
            return None

    def start_get(self, key: bytes) -> _Reading:
        check_key(key)
        read = self._db.connection.start(partial(schema.value_of, self._namespace, key))
        return _Reading(self, read)

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        wanted = [check_key(k) for k in keys]
        if not wanted:
            return {}
        try:
            return await self._db.run(partial(_get_many, self._namespace, wanted))
        except sqlite3.Error as exc:
            log.warning("read of %s failed, treated as misses: %s", self.describe(), exc)
            return {}

    async def insert(
        self,
        key: bytes,
        value: bytes,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        written_at: float | None = None,
    ) -> Insertion:
        check_key(key)
        check_value(value)
        cost = check_cost(cost)
        try:
            return await self._db.run(
                partial(_insert, self._namespace, key, value, int(Origin(origin)), cost, written_at)
            )
        except sqlite3.Error as exc:
            return self._failed("insert", exc)

    async def insert_many(
        self,
        items: InsertItems,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        bundle: BundleRef | None = None,
    ) -> InsertSummary:
        origin = Origin(origin)
        cost = check_cost(cost)
        bundle = check_bundle(bundle, origin)
        pairs: Iterable[tuple[bytes, bytes]]
        if isinstance(items, AsyncIterable):
            # A transaction is one call into the worker, which cannot await:
            # an async source is gathered first.
            pairs = [check_item(item) async for item in items]
        else:
            pairs = items
        counter = _Counter(pairs)
        try:
            stored = await self._db.run(
                partial(_insert_many, self._namespace, counter, int(origin), cost, bundle)
            )
        except sqlite3.Error as exc:
            failed = self._failed("insert_many", exc)
            return InsertSummary(stored=0, conflict=0, failed=counter.drain(), reason=failed.reason)
        return InsertSummary(stored=stored, conflict=counter.count - stored, failed=0)

    async def insert_fetched(
        self, entries: list[tuple[bytes, bytes, float | None, float | None]]
    ) -> InsertSummary:
        """As the protocol says, in one transaction (a write-behind queue's batch)."""
        for key, value, _, cost in entries:
            check_key(key)
            check_value(value)
            check_cost(cost)
        try:
            stored = await self._db.run(partial(_insert_fetched, self._namespace, entries))
        except sqlite3.Error as exc:
            reason = self._failed("insert_fetched", exc).reason
            return InsertSummary(stored=0, conflict=0, failed=len(entries), reason=reason)
        return InsertSummary(stored=stored, conflict=len(entries) - stored, failed=0)

    async def info(self, key: bytes) -> EntryInfo | None:
        check_key(key)
        try:
            found = await self._db.run(partial(_info, self._namespace, key, self._db.version))
        except sqlite3.Error as exc:
            log.warning("reading the provenance in %s failed: %s", self.describe(), exc)
            return None
        return None if found is None else _entry_info(*found)

    async def dated(self, keys: Iterable[bytes]) -> dict[bytes, tuple[bytes, float | None]]:
        wanted = [check_key(k) for k in keys]
        if not wanted:
            return {}
        try:
            return await self._db.run(partial(_dated, self._namespace, wanted, self._db.version))
        except sqlite3.Error as exc:
            log.warning("read of %s failed, treated as misses: %s", self.describe(), exc)
            return {}

    async def touch(self, keys: Iterable[bytes]) -> int:
        return await self._db.touch(self._namespace, keys)

    async def replace(
        self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL, *, cost: float | None = None
    ) -> Stored | Failed:
        check_key(key)
        check_value(value)
        cost = check_cost(cost)
        try:
            await self._db.run(
                partial(_replace, self._namespace, key, value, int(Origin(origin)), cost)
            )
        except sqlite3.Error as exc:
            return self._failed("replace", exc)
        return Stored()

    async def scan(
        self, batch_size: int = DEFAULT_SCAN_BATCH
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        check_batch_size(batch_size)
        after: bytes | None = None
        while True:
            try:
                page = await self._db.run(partial(_page, self._namespace, after, batch_size))
            except sqlite3.Error as exc:
                log.warning("scan of %s failed, stopped early: %s", self.describe(), exc)
                return
            rows, last = page
            for row in rows:
                yield row
            if last is None:
                return
            after = last

    async def scan_with_info(
        self, batch_size: int = DEFAULT_SCAN_BATCH
    ) -> AsyncIterator[tuple[bytes, bytes, EntryInfo]]:
        check_batch_size(batch_size)
        after: bytes | None = None
        version = self._db.version
        while True:
            try:
                rows, last = await self._db.run(
                    partial(_page_with_info, self._namespace, after, batch_size, version)
                )
            except sqlite3.Error as exc:
                log.warning("scan of %s failed, stopped early: %s", self.describe(), exc)
                return
            for key, value, origin, written_at, cost, name, digest in rows:
                yield key, value, _entry_info(origin, written_at, cost, name, digest)
            if last is None:
                return
            after = last

    def entries_on(
        self, conn: sqlite3.Connection, after: bytes | None = None
    ) -> Generator[tuple[bytes, bytes], None, None]:
        """The entries after the key `after` (None: from the first) in key order, as
        `scan`, read on `conn` one at a time.

        For a function already on the connection's thread (given to `Database.run`)
        that acts on each entry as it is read, with one value in memory at a time
        rather than a page; `sqlite3.Error` is its to handle. `conn` must be a
        connection to this storage's database. The statement stays open until the
        generator is exhausted or closed: close it before the function returns.
        """
        return _entries(self._namespace, after, conn)

    def entries_with_info_on(
        self, conn: sqlite3.Connection, after: bytes | None = None
    ) -> Generator[tuple[bytes, bytes, EntryInfo], None, None]:
        """`entries_on` of `scan_with_info`: each value with its provenance, the same query."""
        rows = _entries_with_info(self._namespace, after, self._db.version, conn)
        with contextlib.closing(rows):
            for key, value, origin, written_at, cost, name, digest in rows:
                yield key, value, _entry_info(origin, written_at, cost, name, digest)

    async def purge(self) -> Purged | Failed:
        try:
            return Purged(await self._db.run(partial(_purge, self._namespace, None)))
        except sqlite3.Error as exc:
            return self._failed("purge", exc)

    async def purge_key(self, key: bytes) -> Purged | Failed:
        check_key(key)
        try:
            return Purged(await self._db.run(partial(_purge, self._namespace, key)))
        except sqlite3.Error as exc:
            return self._failed("purge_key", exc)

    async def summary(self) -> NamespaceSummary:
        try:
            entries, size = await self._db.run(partial(_summary, self._namespace))
        except sqlite3.Error as exc:
            log.warning("summary of %s failed: %s", self.describe(), exc)
            entries, size = 0, 0
        return NamespaceSummary(namespace=self._namespace, entries=entries, bytes=size)

    def forget_on_close(self, held: HeldValues) -> None:
        self._db.forget_on_close(held)

    def arrivals(self) -> Arrivals:
        return self._db.arrivals

    async def explain(self, key: bytes | None = None) -> Explanation:
        return await self._db.explain(self._namespace, None if key is None else check_key(key))

    def _failed(self, operation: str, exc: sqlite3.Error) -> Failed:
        reason = f"{operation} on {self.describe()} failed: {exc}"
        log.warning("%s", reason)
        return Failed(reason)


@final
class SqliteStorage(SqlStorage):
    """One namespace of an environment's database file."""

    __slots__ = ()

    def get_blocking(self, key: bytes) -> bytes | None:
        check_key(key)
        try:
            return self._db.run_here(partial(schema.value_of, self._namespace, key))
        except sqlite3.Error:
            return None  # `get` reads again, and logs if it fails too

    def describe(self) -> str:
        mode = " (read-only)" if self._db.read_only else ""
        return f"SQLite {self._db.path}{mode} [{self._namespace}]"


class _Counter:
    """Checks and counts items as the worker consumes them."""

    __slots__ = ("count", "items")

    def __init__(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self.items = iter(items)
        self.count = 0

    def rows(
        self, namespace: str, origin: int, written_at: float, cost: float | None, bundle: int | None
    ) -> Iterator[tuple[str, bytes, bytes, int, float, float | None, int | None]]:
        for item in self.items:
            key, value = check_item(item)
            self.count += 1
            yield namespace, key, value, origin, written_at, cost, bundle

    def drain(self) -> int:
        """Count what was not consumed, so a failure accounts for every item."""
        for _ in self.items:
            self.count += 1
        return self.count


def _get_many(namespace: str, keys: list[bytes], conn: sqlite3.Connection) -> dict[bytes, bytes]:
    return {k: v for k, v in _rows(namespace, "value", keys, conn) if isinstance(v, bytes)}


def _dated(
    namespace: str, keys: list[bytes], version: int, conn: sqlite3.Connection
) -> dict[bytes, tuple[bytes, float | None]]:
    # Value and write time from the one row each: a replace cannot fall between them.
    column = "written_at" if version >= 2 else "NULL"  # a version-1 file records none
    return {
        k: (v, float(at) if isinstance(at, int | float) else None)
        for k, v, at in _rows(namespace, f"value, {column}", keys, conn)
        if isinstance(v, bytes)
    }


def _rows(
    namespace: str, columns: str, keys: list[bytes], conn: sqlite3.Connection
) -> Iterator[tuple[Any, ...]]:
    """`(key, *columns)` of those `keys` stored in `namespace`, read in chunks of bound keys."""
    for start in range(0, len(keys), _GET_MANY_CHUNK):
        chunk = keys[start : start + _GET_MANY_CHUNK]
        marks = ",".join("?" * len(chunk))
        yield from conn.execute(
            f"SELECT key, {columns} FROM entries WHERE namespace = ? AND key IN ({marks})",
            (namespace, *chunk),
        )


def _insert(
    namespace: str,
    key: bytes,
    value: bytes,
    origin: int,
    cost: float | None,
    written_at: float | None,
    conn: sqlite3.Connection,
) -> Insertion:
    def body(conn: sqlite3.Connection) -> Insertion:
        row = conn.execute(
            "SELECT value, origin FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
        ).fetchone()
        if row is not None and not may_replace(row[1], origin):
            return Conflict(bytes(row[0]))
        now = wall_clock()
        if written_at is None and origin == Origin.LOCAL:
            written: float | None = now  # written here, now
        else:
            written = _written_as_believed(written_at, now)
        conn.execute(_REPLACE, (namespace, key, value, origin, written, cost))
        return Stored()

    return schema.transaction(conn, body)


def _insert_fetched(
    namespace: str,
    entries: list[tuple[bytes, bytes, float | None, float | None]],
    conn: sqlite3.Connection,
) -> int:
    now = wall_clock()
    origin = int(Origin.REMOTE)

    def body(conn: sqlite3.Connection) -> int:
        before = conn.total_changes
        rows = (
            (namespace, key, value, origin, _written_as_believed(written_at, now), cost, None)
            for key, value, written_at, cost in entries
        )
        conn.executemany(schema.INSERT, rows)
        return conn.total_changes - before

    return schema.transaction(conn, body)


def _written_as_believed(written_at: float | None, now: float) -> float | None:
    """When an entry that came from elsewhere was written, as believed (`carried`);
    None (unknown, stored NULL) for a time missing, out of range or after `now`."""
    return carried.as_of(carried.believed(written_at, carried.WRITTEN_AT_LIMIT), now)


def _insert_many(
    namespace: str,
    counter: _Counter,
    origin: int,
    cost: float | None,
    bundle: BundleRef | None,
    conn: sqlite3.Connection,
) -> int:
    now = wall_clock()

    def body(conn: sqlite3.Connection) -> int:
        bundle_id = None if bundle is None else schema.bundle_id(bundle, now, conn)
        before = conn.total_changes
        conn.executemany(schema.INSERT, counter.rows(namespace, origin, now, cost, bundle_id))
        return conn.total_changes - before

    return schema.transaction(conn, body)


def _replace(
    namespace: str,
    key: bytes,
    value: bytes,
    origin: int,
    cost: float | None,
    conn: sqlite3.Connection,
) -> None:
    def body(conn: sqlite3.Connection) -> None:
        conn.execute(_REPLACE, (namespace, key, value, origin, wall_clock(), cost))

    schema.transaction(conn, body)


def _page(
    namespace: str, after: bytes | None, limit: int, conn: sqlite3.Connection
) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
    """One page of a keyset scan, and the key to continue after (`None`: the end)."""
    if after is None:
        cursor = conn.execute(
            "SELECT key, value FROM entries WHERE namespace = ? ORDER BY key LIMIT ?",
            (namespace, limit),
        )
    else:
        cursor = conn.execute(
            "SELECT key, value FROM entries WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?",
            (namespace, after, limit),
        )
    raw = cursor.fetchall()
    rows = [(k, v) for k, v in raw if isinstance(k, bytes) and isinstance(v, bytes)]
    return rows, (raw[-1][0] if len(raw) == limit else None)


_Row = tuple[bytes, bytes, int, float | None, float | None, str | None, str | None]


def _with_info_sql(after: bytes | None, version: int) -> str:
    where = "e.namespace = ?" + ("" if after is None else " AND e.key > ?")
    if version < 2:  # a version-1 file read as it is: only the origin is known
        return (
            "SELECT e.key, e.value, e.origin, NULL, NULL, NULL, NULL FROM entries AS e "
            f"WHERE {where} ORDER BY e.key"
        )
    return (
        "SELECT e.key, e.value, e.origin, e.written_at, e.cost, b.name, b.digest "
        "FROM entries AS e LEFT JOIN bundles AS b ON b.id = e.bundle AND e.origin = "
        f"{int(Origin.IMPORTED)} WHERE {where} ORDER BY e.key"
    )


def _page_with_info(
    namespace: str, after: bytes | None, limit: int, version: int, conn: sqlite3.Connection
) -> tuple[list[_Row], bytes | None]:
    """One page of a keyset scan, each value with its provenance from the same query
    (see `Storage.scan_with_info`), and the key to continue after (`None`: the end)."""
    params = (namespace,) if after is None else (namespace, after)
    raw = conn.execute(_with_info_sql(after, version) + " LIMIT ?", (*params, limit)).fetchall()
    rows = [row for row in raw if isinstance(row[0], bytes) and isinstance(row[1], bytes)]
    return rows, (raw[-1][0] if len(raw) == limit else None)


def _entries(
    namespace: str, after: bytes | None, conn: sqlite3.Connection
) -> Generator[tuple[bytes, bytes], None, None]:
    """`_page`'s rows without pages: one statement, read a row at a time."""
    where = "namespace = ?" + ("" if after is None else " AND key > ?")
    params = (namespace,) if after is None else (namespace, after)
    cursor = conn.execute(f"SELECT key, value FROM entries WHERE {where} ORDER BY key", params)
    try:
        for key, value in cursor:
            if isinstance(key, bytes) and isinstance(value, bytes):
                yield key, value
    finally:
        cursor.close()


def _entries_with_info(
    namespace: str, after: bytes | None, version: int, conn: sqlite3.Connection
) -> Generator[_Row, None, None]:
    """`_page_with_info`'s rows without pages: one statement, read a row at a time."""
    params = (namespace,) if after is None else (namespace, after)
    cursor = conn.execute(_with_info_sql(after, version), params)
    try:
        for row in cursor:
            if isinstance(row[0], bytes) and isinstance(row[1], bytes):
                yield row
    finally:
        cursor.close()


def _entry_info(
    origin: int, written_at: float | None, cost: float | None, name: str | None, digest: str | None
) -> EntryInfo:
    return EntryInfo(
        origin=Origin(origin),
        written_at=None if written_at is None else float(written_at),
        cost=None if cost is None else float(cost),
        bundle=None if digest is None else BundleRef(str(name), str(digest)),
    )


def _purge(namespace: str, key: bytes | None, conn: sqlite3.Connection) -> int:
    def body(conn: sqlite3.Connection) -> int:
        if key is None:
            cursor = conn.execute("DELETE FROM entries WHERE namespace = ?", (namespace,))
        else:
            cursor = conn.execute(
                "DELETE FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
            )
        return cursor.rowcount

    return schema.transaction(conn, body)


def _summary(namespace: str, conn: sqlite3.Connection) -> tuple[int, int]:
    for _, entries, size in schema.namespace_totals(
        conn, where="namespace = ?", params=(namespace,)
    ):
        return entries, size
    return 0, 0


def _origin(namespace: str, key: bytes, conn: sqlite3.Connection) -> int | None:
    row = conn.execute(
        "SELECT origin FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
    ).fetchone()
    return None if row is None else int(row[0])


def _info(
    namespace: str, key: bytes, version: int, conn: sqlite3.Connection
) -> tuple[int, float | None, float | None, str | None, str | None] | None:
    if version < 2:  # a version-1 file read as it is: only the origin is known
        origin = _origin(namespace, key, conn)
        return None if origin is None else (origin, None, None, None, None)
    row = conn.execute(
        "SELECT e.origin, e.written_at, e.cost, b.name, b.digest FROM entries AS e "
        "LEFT JOIN bundles AS b ON b.id = e.bundle AND e.origin = ? "
        "WHERE e.namespace = ? AND e.key = ?",
        (int(Origin.IMPORTED), namespace, key),
    ).fetchone()
    return None if row is None else (int(row[0]), row[1], row[2], row[3], row[4])
