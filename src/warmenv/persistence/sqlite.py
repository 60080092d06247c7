"""Namespaces stored in one SQLite database file (an environment).

Every operation is one function run on the connection's worker thread (one
hop). A write is a whole transaction inside that function, BEGIN IMMEDIATE to
COMMIT, so other processes see it all or nothing, the insert-rule check and
the write cannot be split by another writer, and a cancelled caller can never
leave a transaction open. WAL lets readers carry on while a writer commits;
the busy timeout makes writers of several processes queue rather than fail.
"""

from __future__ import annotations

import logging
import sqlite3
import warnings
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar, final

import anyio
import anyio.to_thread

from warmenv import _sqlite
from warmenv._errors import WarmenvWarning
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.storage import (
    DEFAULT_SCAN_BATCH,
    Conflict,
    Failed,
    Insertion,
    InsertItems,
    InsertSummary,
    NamespaceSummary,
    Origin,
    Purged,
    Storage,
    Stored,
    check_batch_size,
    check_item,
    check_key,
    check_value,
    may_replace,
)

__all__ = ["SCHEMA_VERSION", "SqliteDatabase", "SqliteStorage", "open_database"]

log = logging.getLogger("warmenv.storage")
T = TypeVar("T")

SCHEMA_VERSION = "1"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    namespace TEXT NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    origin INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
);
"""
# The bulk insert states the insert rule through may_replace, registered below.
UPSERT = (
    "INSERT INTO entries (namespace, key, value, origin) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
    "origin = excluded.origin WHERE warmenv_may_replace(entries.origin, excluded.origin)"
)
_GET_MANY_CHUNK = 500


def install_functions(conn: sqlite3.Connection) -> None:
    """Register the insert rule so SQL statements can apply it."""
    conn.create_function("warmenv_may_replace", 2, may_replace, deterministic=True)


def transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run `body` inside BEGIN IMMEDIATE ... COMMIT, rolling back if it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
    except BaseException:
        conn.rollback()
        raise
    conn.execute("COMMIT")
    return result


def _prepare_writable(conn: sqlite3.Connection) -> str | None:
    """Create or check the schema; returns the old version when it was rebuilt."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    install_functions(conn)

    def body(conn: sqlite3.Connection) -> str | None:
        fresh = (
            conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('meta', 'entries')"
            ).fetchone()[0]
            == 0
        )
        _create_schema(conn)
        row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
        found = None if row is None else row[0]
        if found == SCHEMA_VERSION and _entries_shape_ok(conn):
            return None
        if not fresh:
            conn.execute("DROP TABLE IF EXISTS entries")
            _create_schema(conn)
        conn.execute(
            "INSERT OR REPLACE INTO meta (k, v) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
        )
        return None if fresh else repr(found)

    return transaction(conn, body)


def _create_schema(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def _entries_shape_ok(conn: sqlite3.Connection) -> bool:
    columns = [row[1] for row in conn.execute("PRAGMA table_info(entries)")]
    return columns == ["namespace", "key", "value", "origin"]


def _prepare_readonly(conn: sqlite3.Connection) -> None:
    install_functions(conn)
    row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    if row is None or row[0] != SCHEMA_VERSION or not _entries_shape_ok(conn):
        raise sqlite3.DatabaseError(f"schema version {row and row[0]!r}, not {SCHEMA_VERSION}")


@final
class SqliteDatabase:
    """One open environment database: the connection every namespace shares."""

    __slots__ = ("connection", "path", "read_only")

    def __init__(self, connection: _sqlite.Connection, path: Path, *, read_only: bool) -> None:
        self.connection = connection
        self.path = path
        self.read_only = read_only

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self.connection.run(fn)

    async def close(self) -> None:
        await self.connection.close()

    async def namespaces(self) -> list[NamespaceSummary]:
        try:
            rows = await self.run(_namespaces)
        except sqlite3.Error as exc:
            log.warning("listing namespaces of %s failed: %s", self.path, exc)
            return []
        return [NamespaceSummary(namespace=n, entries=c, bytes=b) for n, c, b in rows]


def _namespaces(conn: sqlite3.Connection) -> list[tuple[str, int, int]]:
    return conn.execute(
        "SELECT namespace, count(*), coalesce(sum(length(key) + length(value)), 0) "
        "FROM entries GROUP BY namespace ORDER BY namespace"
    ).fetchall()


async def open_database(path: Path, *, create: bool = True) -> SqliteDatabase:
    """Open (and if need be create) the database at `path`, read-write if possible.

    Falls back to read-only (`mode=ro`, then `immutable=1` for a WAL file whose
    directory cannot hold the shared-memory file) when the file exists but
    cannot be written. Raises `sqlite3.Error` or `OSError` when neither works.
    """
    exists = await anyio.to_thread.run_sync(path.exists)
    if not exists and not create:
        raise FileNotFoundError(path)
    try:
        connection, rebuilt = await _sqlite.open_with(str(path), _prepare_writable)
    except sqlite3.Error:
        if not exists:
            raise
    else:
        if rebuilt is not None:
            warnings.warn(
                f"{path}: schema version {rebuilt} is not {SCHEMA_VERSION}; "
                "its entries were dropped and the table rebuilt",
                WarmenvWarning,
                stacklevel=3,
            )
        return SqliteDatabase(connection, path, read_only=False)
    return await _open_readonly(path)


async def _open_readonly(path: Path) -> SqliteDatabase:
    uri = (await anyio.to_thread.run_sync(path.resolve)).as_uri()
    error: sqlite3.Error | None = None
    for query in ("mode=ro", "immutable=1"):
        try:
            connection, _ = await _sqlite.open_with(f"{uri}?{query}", _prepare_readonly, uri=True)
        except sqlite3.Error as exc:
            error = exc
            continue
        return SqliteDatabase(connection, path, read_only=True)
    assert error is not None
    raise error


@final
class SqliteStorage(Storage):
    """One namespace of an environment database."""

    __slots__ = ("_db", "_namespace")

    def __init__(self, db: SqliteDatabase, namespace: Namespace | str) -> None:
        self._db = db
        self._namespace = str(Namespace.coerce(namespace))

    @property
    def namespace(self) -> str:
        return self._namespace

    async def get(self, key: bytes) -> bytes | None:
        check_key(key)
        try:
            return await self._db.run(partial(_get, self._namespace, key))
        except sqlite3.Error as exc:
            log.warning("read of %s failed, treated as a miss: %s", self.describe(), exc)
            return None

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        wanted = [check_key(k) for k in keys]
        if not wanted:
            return {}
        try:
            return await self._db.run(partial(_get_many, self._namespace, wanted))
        except sqlite3.Error as exc:
            log.warning("read of %s failed, treated as misses: %s", self.describe(), exc)
            return {}

    async def insert(self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL) -> Insertion:
        check_key(key)
        check_value(value)
        try:
            return await self._db.run(
                partial(_insert, self._namespace, key, value, int(Origin(origin)))
            )
        except sqlite3.Error as exc:
            return self._failed("insert", exc)

    async def insert_many(self, items: InsertItems, origin: Origin = Origin.LOCAL) -> InsertSummary:
        origin = Origin(origin)
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
                partial(_insert_many, self._namespace, counter, int(origin))
            )
        except sqlite3.Error as exc:
            failed = self._failed("insert_many", exc)
            return InsertSummary(stored=0, conflict=0, failed=counter.drain(), reason=failed.reason)
        return InsertSummary(stored=stored, conflict=counter.count - stored, failed=0)

    async def replace(
        self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL
    ) -> Stored | Failed:
        check_key(key)
        check_value(value)
        try:
            await self._db.run(partial(_replace, self._namespace, key, value, int(Origin(origin))))
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

    def describe(self) -> str:
        mode = " (read-only)" if self._db.read_only else ""
        return f"SQLite {self._db.path}{mode} [{self._namespace}]"

    async def origin_of(self, key: bytes) -> Origin | None:
        """The origin of the stored value, or `None` (for tests and diagnostics)."""
        check_key(key)
        found = await self._db.run(partial(_origin, self._namespace, key))
        return None if found is None else Origin(found)

    def _failed(self, operation: str, exc: sqlite3.Error) -> Failed:
        reason = f"{operation} on {self.describe()} failed: {exc}"
        log.warning("%s", reason)
        return Failed(reason)


class _Counter:
    """Checks and counts items as the worker consumes them."""

    __slots__ = ("count", "items")

    def __init__(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self.items = iter(items)
        self.count = 0

    def rows(self, namespace: str, origin: int) -> Iterator[tuple[str, bytes, bytes, int]]:
        for item in self.items:
            key, value = check_item(item)
            self.count += 1
            yield namespace, key, value, origin

    def drain(self) -> int:
        """Count what was not consumed, so a failure accounts for every item."""
        for _ in self.items:
            self.count += 1
        return self.count


def _get(namespace: str, key: bytes, conn: sqlite3.Connection) -> bytes | None:
    row = conn.execute(
        "SELECT value FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
    ).fetchone()
    if row is None or not isinstance(row[0], bytes):
        return None
    value: bytes = row[0]
    return value


def _get_many(namespace: str, keys: list[bytes], conn: sqlite3.Connection) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    for start in range(0, len(keys), _GET_MANY_CHUNK):
        chunk = keys[start : start + _GET_MANY_CHUNK]
        marks = ",".join("?" * len(chunk))
        cursor = conn.execute(
            f"SELECT key, value FROM entries WHERE namespace = ? AND key IN ({marks})",
            (namespace, *chunk),
        )
        found.update((k, v) for k, v in cursor if isinstance(v, bytes))
    return found


def _insert(
    namespace: str, key: bytes, value: bytes, origin: int, conn: sqlite3.Connection
) -> Insertion:
    def body(conn: sqlite3.Connection) -> Insertion:
        row = conn.execute(
            "SELECT value, origin FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
        ).fetchone()
        if row is not None and not may_replace(row[1], origin):
            return Conflict(bytes(row[0]))
        conn.execute(
            "INSERT OR REPLACE INTO entries (namespace, key, value, origin) VALUES (?, ?, ?, ?)",
            (namespace, key, value, origin),
        )
        return Stored()

    return transaction(conn, body)


def _insert_many(namespace: str, counter: _Counter, origin: int, conn: sqlite3.Connection) -> int:
    def body(conn: sqlite3.Connection) -> int:
        before = conn.total_changes
        conn.executemany(UPSERT, counter.rows(namespace, origin))
        return conn.total_changes - before

    return transaction(conn, body)


def _replace(
    namespace: str, key: bytes, value: bytes, origin: int, conn: sqlite3.Connection
) -> None:
    def body(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO entries (namespace, key, value, origin) VALUES (?, ?, ?, ?)",
            (namespace, key, value, origin),
        )

    transaction(conn, body)


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


def _purge(namespace: str, key: bytes | None, conn: sqlite3.Connection) -> int:
    def body(conn: sqlite3.Connection) -> int:
        if key is None:
            cursor = conn.execute("DELETE FROM entries WHERE namespace = ?", (namespace,))
        else:
            cursor = conn.execute(
                "DELETE FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
            )
        return cursor.rowcount

    return transaction(conn, body)


def _summary(namespace: str, conn: sqlite3.Connection) -> tuple[int, int]:
    row = conn.execute(
        "SELECT count(*), coalesce(sum(length(key) + length(value)), 0) "
        "FROM entries WHERE namespace = ?",
        (namespace,),
    ).fetchone()
    return int(row[0]), int(row[1])


def _origin(namespace: str, key: bytes, conn: sqlite3.Connection) -> int | None:
    row = conn.execute(
        "SELECT origin FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
    ).fetchone()
    return None if row is None else int(row[0])
