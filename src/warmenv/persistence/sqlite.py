"""Namespaces stored in one SQLite database file (an environment).

Every operation is one function run on the connection's worker thread (one
hop). A write is a whole transaction inside that function, BEGIN IMMEDIATE to
COMMIT, so other processes see it all or nothing, the insert-rule check and
the write cannot be split by another writer, and a cancelled caller can never
leave a transaction open. WAL lets readers carry on while a writer commits;
the busy timeout makes writers of several processes queue rather than fail.
"""

from __future__ import annotations

import errno
import itertools
import logging
import sqlite3
import warnings
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
)
from functools import partial
from pathlib import Path
from typing import TypeVar, final

import anyio
import anyio.to_thread
import attrs

from warmenv import _sqlite
from warmenv._errors import WarmenvWarning
from warmenv._fs import non_regular_kind
from warmenv.persistence import schema
from warmenv.persistence.files import read_only_uri
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

__all__ = ["SqliteDatabase", "SqliteStorage", "open_database"]

log = logging.getLogger("warmenv.storage")
T = TypeVar("T")

_GET_MANY_CHUNK = 500
_INSERT = schema.UPSERT.format(table="entries", source="VALUES (?, ?, ?, ?)")


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

    async def copy_from(
        self, source: Path, prefixes: list[str] | None, batch_size: int
    ) -> AsyncGenerator[CopiedBatch, None]:
        """Copy the entries of the entry file `source` in, as IMPORTED, a batch at a time.

        The copy stays inside SQLite (ATTACH, then INSERT ... SELECT over rowid
        ranges); each batch is one transaction and obeys the insert rule. The
        caller must own `source` (a private, verified snapshot): it is read by
        path. A batch that fails is reported `failed` and the copy goes on.
        """
        # A name of its own, so that imports into one environment can overlap.
        alias = f"warmenv_bundle_{next(_aliases)}"
        try:
            try:
                await self.run(partial(_attach, alias, read_only_uri(source)))
            except sqlite3.Error:
                await self.run(partial(_attach, alias, read_only_uri(source, immutable=True)))
            clause, params = schema.prefix_sql(prefixes, column="b.namespace")
            start: int | None = await self.run(partial(_first_rowid, alias))
            while start is not None:
                copy = partial(_copy_batch, alias, start, batch_size, clause, params)
                try:
                    batch = await self.run(copy)
                except sqlite3.Error as exc:
                    log.warning("importing %s into %s: a batch failed: %s", source, self.path, exc)
                    batch = await self.run(
                        partial(_count_failed_batch, alias, start, batch_size, clause, params)
                    )
                start = batch.following
                yield batch
        finally:
            # The worker runs calls in order, so this detach follows even an
            # attach whose caller was cancelled while it ran.
            with anyio.CancelScope(shield=True):
                try:
                    await self.run(partial(_detach, alias))
                except sqlite3.Error:
                    pass


def _namespaces(conn: sqlite3.Connection) -> list[tuple[str, int, int]]:
    # A namespace that is not UTF-8 (written by something else) is listed, not hidden.
    previous = conn.text_factory
    conn.text_factory = lambda raw: raw.decode("utf-8", "surrogateescape")
    try:
        return schema.namespace_totals(conn)
    finally:
        conn.text_factory = previous


async def open_database(path: Path, *, create: bool = True) -> SqliteDatabase:
    """Open (and if need be create) the database at `path`, read-write if possible.

    Falls back to read-only (`mode=ro`, then `immutable=1` for a WAL file whose
    directory cannot hold the shared-memory file) when the file exists but
    cannot be written. Raises `sqlite3.Error` or `OSError` when neither works.
    """
    kind = await anyio.to_thread.run_sync(non_regular_kind, path)
    if kind is not None:  # SQLite would block on a FIFO or read a device forever
        raise OSError(errno.EINVAL, f"{path} is {kind}, not a database file", str(path))
    exists = await anyio.to_thread.run_sync(path.exists)
    if not exists and not create:
        raise FileNotFoundError(path)
    try:
        connection, rebuilt = await _sqlite.open_with(str(path), schema.prepare_writable)
    except sqlite3.Error:
        if not exists:
            raise
    else:
        if rebuilt is not None:
            warnings.warn(
                f"{path}: schema version {rebuilt} is not {schema.SCHEMA_VERSION}; "
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
            connection, _ = await _sqlite.open_with(
                f"{uri}?{query}", schema.prepare_readonly, uri=True
            )
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

    return schema.transaction(conn, body)


def _insert_many(namespace: str, counter: _Counter, origin: int, conn: sqlite3.Connection) -> int:
    def body(conn: sqlite3.Connection) -> int:
        before = conn.total_changes
        conn.executemany(_INSERT, counter.rows(namespace, origin))
        return conn.total_changes - before

    return schema.transaction(conn, body)


def _replace(
    namespace: str, key: bytes, value: bytes, origin: int, conn: sqlite3.Connection
) -> None:
    def body(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO entries (namespace, key, value, origin) VALUES (?, ?, ?, ?)",
            (namespace, key, value, origin),
        )

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


# --- the bulk copy of an import -------------------------------------------------

_aliases = itertools.count(1)


@attrs.frozen
class CopiedBatch:
    """One batch of a bulk copy: rows seen, and what was imported per namespace."""

    seen: int
    seen_bytes: int
    imported: list[tuple[str, int, int]]
    last_namespace: str
    following: int | None
    failed: bool = False


def _attach(alias: str, uri: str, conn: sqlite3.Connection) -> None:
    conn.execute(f"ATTACH DATABASE ? AS {alias}", (uri,))


def _detach(alias: str, conn: sqlite3.Connection) -> None:
    conn.execute(f"DETACH DATABASE {alias}")


def _first_rowid(alias: str, conn: sqlite3.Connection) -> int | None:
    row = conn.execute(f"SELECT min(rowid) FROM {alias}.entries").fetchone()
    return None if row[0] is None else int(row[0])


def _batch_bounds(
    alias: str, start: int, batch_size: int, conn: sqlite3.Connection
) -> tuple[int, int | None]:
    """The last rowid of the batch starting at `start`, and the first of the next."""
    row = conn.execute(
        f"SELECT rowid FROM {alias}.entries WHERE rowid >= ? ORDER BY rowid LIMIT 1 OFFSET ?",
        (start, batch_size),
    ).fetchone()
    if row is None:
        end = conn.execute(f"SELECT max(rowid) FROM {alias}.entries").fetchone()[0]
        return int(end), None
    following = int(row[0])
    return following - 1, following


def _seen(
    alias: str, start: int, end: int, clause: str, params: list[str], conn: sqlite3.Connection
) -> list[tuple[str, int, int]]:
    return schema.namespace_totals(
        conn,
        table=f"{alias}.entries AS b",
        where=f"b.rowid BETWEEN ? AND ? AND {clause}",
        params=(start, end, *params),
    )


def _count_failed_batch(
    alias: str,
    start: int,
    batch_size: int,
    clause: str,
    params: list[str],
    conn: sqlite3.Connection,
) -> CopiedBatch:
    end, following = _batch_bounds(alias, start, batch_size, conn)
    seen = _seen(alias, start, end, clause, params, conn)
    return CopiedBatch(
        seen=sum(c for _, c, _ in seen),
        seen_bytes=sum(b for _, _, b in seen),
        imported=[],
        last_namespace=seen[-1][0] if seen else "",
        following=following,
        failed=True,
    )


def _copy_batch(
    alias: str,
    start: int,
    batch_size: int,
    clause: str,
    params: list[str],
    conn: sqlite3.Connection,
) -> CopiedBatch:
    """Copy one rowid range in one transaction, in one call into the worker.

    Which rows were new is known without asking SQLite row by row when all
    or none of the batch went in; only a batch where some did (a resumed
    import, a few local values) is redone with RETURNING to count them.
    """
    end, following = _batch_bounds(alias, start, batch_size, conn)
    source = (
        f"SELECT b.namespace, b.key, b.value, {int(Origin.IMPORTED)} "
        f"FROM {alias}.entries AS b WHERE b.rowid BETWEEN ? AND ? AND {clause}"
    )
    sql = schema.UPSERT.format(table="main.entries", source=source)
    args = (start, end, *params)

    def body(conn: sqlite3.Connection) -> CopiedBatch:
        seen = _seen(alias, start, end, clause, params, conn)
        total = sum(c for _, c, _ in seen)
        conn.execute("SAVEPOINT warmenv_batch")
        before = conn.total_changes
        conn.execute(sql, args)
        changes = conn.total_changes - before
        if changes == total:
            imported = seen
        elif changes == 0:
            imported = []
        else:
            conn.execute("ROLLBACK TO warmenv_batch")
            rows = conn.execute(sql + " RETURNING namespace, length(key) + length(value)", args)
            by_ns: dict[str, list[int]] = {}
            for namespace, size in rows.fetchall():
                entry = by_ns.setdefault(namespace, [0, 0])
                entry[0] += 1
                entry[1] += size
            imported = [(n, c, b) for n, (c, b) in sorted(by_ns.items())]
        conn.execute("RELEASE warmenv_batch")
        return CopiedBatch(
            seen=total,
            seen_bytes=sum(b for _, _, b in seen),
            imported=imported,
            last_namespace=seen[-1][0] if seen else "",
            following=following,
        )

    return schema.transaction(conn, body)
