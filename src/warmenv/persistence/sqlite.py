"""Namespaces stored in one SQLite database file (an environment).

Every operation is one function run on the connection's worker thread (one
hop). A write is a whole transaction inside that function, BEGIN IMMEDIATE to
COMMIT, so other processes see it all or nothing, the insert-rule check and
the write cannot be split by another writer, and a cancelled caller can never
leave a transaction open. WAL lets readers carry on while a writer commits;
the busy timeout makes writers of several processes queue rather than fail.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import sqlite3
import sys
import warnings
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from functools import partial
from pathlib import Path
from typing import TypeVar, final

import anyio
import anyio.to_thread
import attrs

from warmenv import _sqlite
from warmenv._errors import WarmenvError, WarmenvWarning
from warmenv._fs import non_regular_kind
from warmenv.persistence import carried, schema
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.explain import Explanation, explain
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.statistics import (
    START,
    Batch,
    Cursor,
    EnvironmentStatistics,
    Resolved,
    Slice,
    assemble,
    cut,
)
from warmenv.persistence.storage import (
    DEFAULT_SCAN_BATCH,
    BundleRef,
    Conflict,
    EntryInfo,
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
    check_bundle,
    check_cost,
    check_item,
    check_key,
    check_value,
    may_replace,
    wall_clock,
)

__all__ = ["SqliteDatabase", "SqliteStorage", "open_database"]

log = logging.getLogger("warmenv.storage")
T = TypeVar("T")

_GET_MANY_CHUNK = 500
_INSERT = schema.UPSERT.format(table="entries", source="VALUES (?, ?, ?, ?, ?, ?, ?)")
_REPLACE = (
    "INSERT OR REPLACE INTO entries (namespace, key, value, origin, written_at, cost, bundle) "
    "VALUES (?, ?, ?, ?, ?, ?, NULL)"
)


@final
class SqliteDatabase:
    """One open environment database: the connection every namespace shares."""

    __slots__ = ("_bulk_copies", "connection", "path", "read_only", "version")

    def __init__(
        self,
        connection: _sqlite.Connection,
        path: Path,
        *,
        read_only: bool,
        version: int = int(schema.ENVIRONMENT_VERSION),
    ) -> None:
        self.connection = connection
        self.path = path
        self.read_only = read_only
        self.version = version
        """The schema version read: 2, or 1 for a version-1 file that could not be upgraded."""
        self._bulk_copies = 0  # running `copy_from`s: they space the checkpoints out

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
        self,
        source: Path,
        prefixes: list[str] | None,
        batch_size: int,
        *,
        bundle: BundleRef | None = None,
    ) -> AsyncGenerator[CopiedBatch, None]:
        """Copy the entries of the entry file `source` in, as IMPORTED, a batch at a time.

        The copy stays inside SQLite (ATTACH, then INSERT ... SELECT over rowid
        ranges); each batch is one transaction and obeys the insert rule. The
        caller must own `source` (a private, verified snapshot): it is read by
        path. A batch that fails is reported `failed` and the copy goes on.
        Copied entries record `bundle` as where they came from, and the
        source's `written_at` and `cost` where its entries table has them
        (else the time of the copy, and no cost).

        While copies run, the connection checkpoints the WAL every
        `BULK_CHECKPOINT_PAGES` instead of SQLite's 1,000 pages, and the last
        copy to end checkpoints once more. Each checkpoint syncs the WAL and
        the database file: every 1,000 pages, copying 100 MB of entries waits
        for the disk about 100 times, for what it writes anyway. Nothing committed
        is less durable for it: in WAL mode with synchronous=NORMAL a commit
        reaches the disk at the next checkpoint, which without a copy running
        may be much later still, and when the copy ends everything it and
        anyone else committed meanwhile is on disk.
        """
        # A name of its own, so that imports into one environment can overlap.
        alias = f"warmenv_bundle_{next(_aliases)}"
        bundle = check_bundle(bundle, Origin.IMPORTED)
        self._bulk_copies += 1
        try:
            if self._bulk_copies == 1:
                await self.run(partial(_autocheckpoint, BULK_CHECKPOINT_PAGES))
            await self.run(partial(_attach, alias, source))
            clause, params = schema.prefix_sql(prefixes, column="b.namespace")
            try:
                provenance = await self.run(partial(_copy_provenance, alias, bundle))
            except sqlite3.Error as exc:
                # Recording the bundle is a write: read-only or full, the batches
                # fail too, and are counted as failed one by one below.
                log.warning("importing %s into %s: %s", source, self.path, exc)
                provenance = await self.run(partial(_copy_provenance, alias, None))
            start, last = await self.run(partial(_rowid_range, alias))
            while start is not None:
                span = _Span(alias, start, min(start + batch_size - 1, last), last)
                copy = partial(_copy_batch, span, clause, params, provenance)
                try:
                    batch = await self.run(copy)
                except sqlite3.Error as exc:
                    log.warning("importing %s into %s: a batch failed: %s", source, self.path, exc)
                    batch = await self.run(partial(_count_failed_batch, span, clause, params))
                start = batch.following
                yield batch
        finally:
            # The worker runs calls in order, so this detach follows even an
            # attach whose caller was cancelled while it ran.
            with anyio.CancelScope(shield=True):
                self._bulk_copies -= 1
                try:
                    await self.run(partial(_detach, alias))
                except sqlite3.Error:
                    pass
                if not self._bulk_copies:
                    await self.run(_end_bulk_checkpoints)

    async def insert_imported(
        self,
        namespace: str,
        entries: list[CarryingEntry],
        bundle: BundleRef | None,
    ) -> InsertSummary:
        """Insert `(key, value, written_at, cost)` entries as IMPORTED, in one transaction.

        An import's path for what it cannot copy in bulk (a flat bundle, a
        bundle checked entry by entry): each entry keeps the written_at (else
        now) and cost it carries, as the bulk copy keeps a bundle's columns.
        The values come from a bundle reader, which believed them already.
        """
        bundle = check_bundle(bundle, Origin.IMPORTED)
        try:
            stored = await self.run(partial(_insert_imported, namespace, entries, bundle))
        except sqlite3.Error as exc:
            reason = self._failed("import", exc).reason
            return InsertSummary(stored=0, conflict=0, failed=len(entries), reason=reason)
        return InsertSummary(stored=stored, conflict=len(entries) - stored, failed=0)

    async def touch(self, namespace: str, keys: Iterable[bytes]) -> int:
        """Record that `keys` of `namespace` were hit now: eviction keeps them longest.

        For a store to call with the keys it served since its last call, in
        batches (every few seconds, and at close), never per hit. Coarse: an
        entry hit within the last `HIT_GRANULARITY` seconds is not written
        again. Returns how many entries were updated; a failure (read-only,
        busy) is logged and counts 0, as recency is only a hint.
        """
        wanted = [check_key(k) for k in keys]
        if not wanted or self.read_only or self.version < 2:
            return 0
        try:
            return await self.run(partial(_touch, namespace, wanted, int(wall_clock())))
        except sqlite3.Error as exc:
            log.warning("recording hits in %s failed: %s", self.path, exc)
            return 0

    async def purge_bundle(self, digest_or_name: str) -> Purged | Failed:
        """Delete the entries still carrying that bundle's origin (imported from it)."""
        try:
            return Purged(await self.run(partial(_purge_bundle, digest_or_name)))
        except sqlite3.Error as exc:
            return self._failed("purge_bundle", exc)

    async def gc(
        self,
        *,
        max_bytes: int | None = None,
        older_than: float | None = None,
        keep_versions: int | None = None,
    ) -> Purged | Failed:
        """Evict entries by version, age and size, in one transaction; how many went.

        `keep_versions`: per application name and path, only the versions
        written most recently are kept. `older_than` (seconds): entries neither
        written nor hit for that long go. `max_bytes`: then the least recently
        hit entries (never hit first, oldest written first) go until the keys
        and values left add up to at most that.
        """
        now = wall_clock()
        try:
            return Purged(await self.run(partial(_gc, max_bytes, older_than, keep_versions, now)))
        except sqlite3.Error as exc:
            return self._failed("gc", exc)

    async def vacuum(self) -> tuple[int, int]:
        """Give the space of deleted entries back to the file system; sizes before and after.

        Sizes are the database file plus its write-ahead log, in bytes.
        """
        if self.read_only:
            raise WarmenvError(
                f"cannot vacuum {self.path}: it is open read-only; vacuum it where it is writable"
            )
        before = await anyio.to_thread.run_sync(_file_size, self.path)
        try:
            await self.run(_vacuum)
        except sqlite3.Error as exc:
            raise WarmenvError(
                f"vacuum of {self.path} failed ({exc}); it needs free disk about the file's "
                "size and no other process inside a transaction: retry when both hold"
            ) from None
        after = await anyio.to_thread.run_sync(_file_size, self.path)
        return before, after

    async def flush_statistics(self, batch: Batch, start: Cursor = START) -> Cursor | None:
        """Add one slice of a batch, from `start`, in one transaction; where it ended, or None.

        One slice (`statistics.cut`: about `SLICE_ROWS` rows) per call, so a
        call queued behind it waits for that slice only; the caller calls
        again from where this one ended. Each hit key is resolved against its
        entry (origin, cost, bundle) inside the transaction, and its recency
        recorded, so the hit path never reads provenance. A read-only or
        version-1 file keeps nothing (the counts stay in memory for
        `statistics()`); a failure (busy, full disk) is logged and the caller
        keeps this slice and the rest for the next flush.
        """
        if self.read_only or self.version < 2:
            return None
        try:
            return await self.run(partial(_flush_statistics, batch, start, int(wall_clock())))
        except sqlite3.Error as exc:
            log.warning("recording statistics in %s failed (kept for later): %s", self.path, exc)
            return None

    async def explain(self, namespace: str, key: bytes | None) -> Explanation:
        """Why a lookup in `namespace` (of `key`) misses here, read in one hop.

        A failing read explains over nothing rather than raising (logged):
        an explanation is a diagnosis, never a new error.
        """
        try:
            return await self.run(partial(_explain, namespace, key))
        except sqlite3.Error as exc:
            log.warning("explaining a miss in %s failed: %s", self.path, exc)
            return explain([], namespace, key, lambda names, key: set())

    async def statistics(self, pending: Batch) -> EnvironmentStatistics:
        """The stored counts of every namespace and bundle, plus `pending` (not yet stored)."""
        return await self.run(partial(_statistics, pending, self.version))

    def _failed(self, operation: str, exc: sqlite3.Error) -> Failed:
        reason = f"{operation} on {self.path} failed: {exc}"
        log.warning("%s", reason)
        return Failed(reason)


@contextlib.contextmanager
def _foreign_text(conn: sqlite3.Connection) -> Iterator[None]:
    """Read text that is not UTF-8 (written by something else) instead of failing on it:
    such a namespace is listed, not hidden (`schema.decode_text`)."""
    previous = conn.text_factory
    conn.text_factory = schema.decode_text
    try:
        yield
    finally:
        conn.text_factory = previous


def _namespaces(conn: sqlite3.Connection) -> list[tuple[str, int, int]]:
    with _foreign_text(conn):
        return schema.namespace_totals(conn)


async def open_database(path: Path, *, create: bool = True) -> SqliteDatabase:
    """Open (and if need be create) the database at `path`, read-write if possible.

    Falls back to read-only (`schema.open_uris`) when the file exists but
    cannot be written. Raises `sqlite3.Error` or `OSError` when neither works.
    """
    kind = await anyio.to_thread.run_sync(non_regular_kind, path)
    if kind is not None:  # SQLite would block on a FIFO or read a device forever
        raise OSError(errno.EINVAL, f"{path} is {kind}, not a database file", str(path))
    exists = await anyio.to_thread.run_sync(path.exists)
    if not exists and not create:
        raise FileNotFoundError(path)
    if exists and not await anyio.to_thread.run_sync(schema.writable, path):
        # Never offered to a read-write open: SQLite would quietly open it
        # read-only, leave -wal and -shm files, and accept writes that all fail.
        return await _open_readonly(path)
    try:
        connection, prepared = await _sqlite.open_with(str(path), schema.prepare_writable)
    except sqlite3.Error:
        if not exists:
            raise
    else:
        if prepared.rebuilt_from is not None:
            warnings.warn(
                f"{path}: schema version {prepared.rebuilt_from} is not one this warmenv "
                f"reads (1 or {schema.ENVIRONMENT_VERSION}); its entries were dropped and "
                "the table rebuilt",
                WarmenvWarning,
                stacklevel=3,
            )
        if prepared.upgraded_from is not None:
            log.info(
                "%s: upgraded from schema version %s to %s in place",
                path,
                prepared.upgraded_from,
                schema.ENVIRONMENT_VERSION,
            )
        return SqliteDatabase(connection, path, read_only=False)
    return await _open_readonly(path)


async def _open_readonly(path: Path) -> SqliteDatabase:
    """Open an environment that cannot be written (`schema.open_uris`; read-write failed)."""
    uris = await anyio.to_thread.run_sync(partial(schema.open_uris, path, read_write=False))
    error: sqlite3.Error | None = None
    for uri in uris:
        try:
            connection, version = await _sqlite.open_with(uri, schema.prepare_readonly, uri=True)
        except sqlite3.Error as exc:
            error = exc
            continue
        return SqliteDatabase(connection, path, read_only=True, version=version)
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
            return await self._db.run(partial(schema.value_of, self._namespace, key))
        except sqlite3.Error as exc:
            log.warning("read of %s failed, treated as a miss: %s", self.describe(), exc)
            return None

    def get_blocking(self, key: bytes) -> bytes | None:
        check_key(key)
        try:
            return self._db.connection.run_here(partial(schema.value_of, self._namespace, key))
        except sqlite3.Error:
            return None  # `get` reads again, and logs if it fails too

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

    async def info(self, key: bytes) -> EntryInfo | None:
        check_key(key)
        try:
            found = await self._db.run(partial(_info, self._namespace, key, self._db.version))
        except sqlite3.Error as exc:
            log.warning("reading the provenance in %s failed: %s", self.describe(), exc)
            return None
        if found is None:
            return None
        origin, written_at, cost, name, digest = found
        return EntryInfo(
            origin=Origin(origin),
            written_at=None if written_at is None else float(written_at),
            cost=None if cost is None else float(cost),
            bundle=None if digest is None else BundleRef(str(name), str(digest)),
        )

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

    async def explain(self, key: bytes | None = None) -> Explanation:
        return await self._db.explain(self._namespace, None if key is None else check_key(key))

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
        written = carried.as_of(
            carried.believed(written_at, carried.WRITTEN_AT_LIMIT), wall_clock()
        )
        conn.execute(_REPLACE, (namespace, key, value, origin, written, cost))
        return Stored()

    return schema.transaction(conn, body)


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
        bundle_id = None if bundle is None else _bundle_id(bundle, now, conn)
        before = conn.total_changes
        conn.executemany(_INSERT, counter.rows(namespace, origin, now, cost, bundle_id))
        return conn.total_changes - before

    return schema.transaction(conn, body)


def _insert_imported(
    namespace: str,
    entries: list[CarryingEntry],
    bundle: BundleRef | None,
    conn: sqlite3.Connection,
) -> int:
    now = wall_clock()
    origin = int(Origin.IMPORTED)

    def body(conn: sqlite3.Connection) -> int:
        bundle_id = None if bundle is None else _bundle_id(bundle, now, conn)
        before = conn.total_changes
        rows = (
            (namespace, key, value, origin, carried.as_of(written, now), cost, bundle_id)
            for key, value, written, cost in entries
        )
        conn.executemany(_INSERT, rows)
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


def _bundle_id(bundle: BundleRef, now: float, conn: sqlite3.Connection) -> int:
    """The `bundles` row of `bundle` (by digest), made or renamed as needed (in a transaction)."""
    row = conn.execute(
        "INSERT INTO bundles (name, digest, imported_at) VALUES (?, ?, ?) "
        "ON CONFLICT (digest) DO UPDATE SET name = excluded.name, "
        "imported_at = excluded.imported_at RETURNING id",
        (bundle.name, bundle.digest, now),
    ).fetchone()
    return int(row[0])


# --- statistics ---------------------------------------------------------------

# A slice of a batch goes into SQLite as two temporary tables: a row per namespace (its
# misses and computations) and a row per hit key, resolved against its entry
# as it is inserted (origin, cost, bundle, and the entry's rowid if its
# recency is older than this granule). Rows go in as multi-row VALUES, one
# statement per few hundred rows rather than one per row; everything after
# that is set-based: one GROUP BY feeds the UPSERT of the statistics, one the
# bundles', and the stale rowids the recency update. No key is looked up twice.
_NAMESPACES = "temp.warmenv_namespaces"
_HITS = "temp.warmenv_hits"
_BATCH_DDL = (
    f"CREATE TABLE IF NOT EXISTS {_NAMESPACES} (i INTEGER PRIMARY KEY, "
    "namespace TEXT NOT NULL, misses INTEGER NOT NULL, computes INTEGER NOT NULL, "
    "seconds REAL NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {_HITS} (i INTEGER NOT NULL, origin INTEGER NOT NULL, "
    "n INTEGER NOT NULL, cost REAL, bundle INTEGER, stale INTEGER)",
)
# ?1 is the recency granule; the VALUES rows are (namespace row, key, times hit),
# the key a BLOB or, in a UTF-8 file, an ASCII key's text: CAST makes it the same
# BLOB, and text is bound cheaper (see statistics.hit_params).
_RESOLVE = (
    f"INSERT INTO {_HITS} SELECT v.column1, coalesce(e.origin, {int(Origin.LOCAL)}), "
    "v.column3, e.cost, e.bundle, iif(e.last_hit IS NULL OR e.last_hit < ?1, e.rowid, NULL) "
    f"FROM ({{values}}) AS v CROSS JOIN {_NAMESPACES} AS ns ON ns.i = v.column1 "
    "LEFT JOIN main.entries AS e ON e.namespace = ns.namespace AND e.key = CAST(v.column2 AS BLOB)"
)
# Per (namespace, origin of the entry hit): hits and seconds saved; misses and
# computations go on the LOCAL row (every namespace with some has one: below).
_BY_ORIGIN = (
    "SELECT ns.namespace, h.origin, h.hits, h.saved, "
    f"iif(h.origin = {int(Origin.LOCAL)}, ns.misses, 0), "
    f"iif(h.origin = {int(Origin.LOCAL)}, ns.computes, 0), "
    f"iif(h.origin = {int(Origin.LOCAL)}, ns.seconds, 0) "
    "FROM (SELECT i, origin, sum(n) AS hits, sum(n * coalesce(cost, 0)) AS saved "
    f"FROM {_HITS} GROUP BY i, origin) AS h JOIN {_NAMESPACES} AS ns ON ns.i = h.i WHERE true"
)
_BY_BUNDLE = (
    f"SELECT bundle, sum(n), sum(n * coalesce(cost, 0)) FROM {_HITS} "
    f"WHERE origin = {int(Origin.IMPORTED)} AND bundle IS NOT NULL GROUP BY bundle"
)
_VALUES_ROWS = 500


def _text_keys(conn: sqlite3.Connection) -> bool:
    """Whether ASCII keys may go as text (the file's text is UTF-8: see `hit_params`)."""
    return str(conn.execute("PRAGMA main.encoding").fetchone()[0]).upper() == "UTF-8"


def _load_slice(piece: Slice, stamp: int, conn: sqlite3.Connection) -> None:
    """Put a slice in the temporary tables, each hit key resolved against its entry."""
    for statement in _BATCH_DDL:
        conn.execute(statement)
    _insert_values(conn, f"INSERT INTO {_NAMESPACES} {{values}}", piece.namespaces, 5)
    _insert_values(conn, _RESOLVE, piece.hits, 3, (stamp,))
    # A LOCAL row for each namespace with misses, for them to be added to.
    conn.execute(
        f"INSERT INTO {_HITS} (i, origin, n) SELECT i, {int(Origin.LOCAL)}, 0 "
        f"FROM {_NAMESPACES} WHERE misses OR computes"
    )


def _insert_values(
    conn: sqlite3.Connection,
    template: str,
    params: Sequence[object],
    width: int,
    leading: tuple[object, ...] = (),
) -> None:
    """Run `template` with `{values}` as multi-row VALUES of `params`, `width` a row.

    A statement per chunk of rows costs a fraction of `executemany`'s
    statement per row; chunks stay within the connection's limit on bound
    parameters. `params` is flat (a row's items one after the other): a
    tuple per row would be one more object per row for the garbage
    collector to count.
    """
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - len(leading)
    per = max(1, min(_VALUES_ROWS, limit // width)) * width
    row = "(" + ",".join("?" * width) + ")"
    for start in range(0, len(params), per):
        chunk = params[start : start + per]
        values = "VALUES " + ",".join([row] * (len(chunk) // width))
        conn.execute(template.format(values=values), (*leading, *chunk))


def _clear_batch(conn: sqlite3.Connection) -> None:
    conn.execute(f"DELETE FROM {_HITS}")
    conn.execute(f"DELETE FROM {_NAMESPACES}")


def _has_bundles(conn: sqlite3.Connection) -> bool:
    return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM main.bundles)").fetchone()[0])


def _resolve_hits(batch: Batch, conn: sqlite3.Connection) -> Resolved:
    """What a batch's hits were worth, read without writing (for a read-only file)."""
    if not batch.served:
        return Resolved(by_origin={}, by_bundle={})
    # Whole, in one call: nothing is written, and statistics() flushed first.
    whole = cut(batch, START, rows=sys.maxsize, served=sys.maxsize, text=_text_keys(conn))
    try:
        _load_slice(whole, 0, conn)
        by_origin = {
            (namespace, int(origin)): (int(hits), float(saved))
            for namespace, origin, hits, saved, _, _, _ in conn.execute(_BY_ORIGIN)
            if hits
        }
        by_bundle: dict[int, tuple[int, float]] = {}
        if _has_bundles(conn):
            by_bundle = {int(b): (int(h), float(s)) for b, h, s in conn.execute(_BY_BUNDLE)}
    finally:
        _clear_batch(conn)
    return Resolved(by_origin=by_origin, by_bundle=by_bundle)


def _flush_statistics(batch: Batch, start: Cursor, now: int, conn: sqlite3.Connection) -> Cursor:
    # Slices of one namespace add up: the UPSERTs add, a hit key's bundle is
    # resolved per slice, and an entry whose recency one slice wrote is no
    # longer stale for the next (same granule), so it is written once.
    stamp = now - now % schema.HIT_GRANULARITY
    piece = cut(batch, start, text=_text_keys(conn))

    def body(conn: sqlite3.Connection) -> None:
        _load_slice(piece, stamp, conn)
        conn.execute(
            "INSERT INTO statistics (namespace, origin, hits, saved_seconds, misses, computes, "
            f"compute_seconds) {_BY_ORIGIN} ON CONFLICT (namespace, origin) DO UPDATE SET "
            "hits = hits + excluded.hits, saved_seconds = saved_seconds + excluded.saved_seconds, "
            "misses = misses + excluded.misses, computes = computes + excluded.computes, "
            "compute_seconds = compute_seconds + excluded.compute_seconds"
        )
        if _has_bundles(conn):
            conn.execute(
                f"INSERT INTO bundle_statistics (bundle, hits, saved_seconds) {_BY_BUNDLE} "
                "ON CONFLICT (bundle) DO UPDATE SET hits = hits + excluded.hits, "
                "saved_seconds = saved_seconds + excluded.saved_seconds"
            )
        # Recency for eviction: the entries hit whose last_hit is older (coarse).
        conn.execute(
            f"UPDATE main.entries SET last_hit = ? WHERE rowid IN "
            f"(SELECT stale FROM {_HITS} WHERE stale IS NOT NULL)",
            (stamp,),
        )
        _clear_batch(conn)

    schema.transaction(conn, body)
    return piece.end


def _statistics(pending: Batch, version: int, conn: sqlite3.Connection) -> EnvironmentStatistics:
    with _foreign_text(conn):
        return _statistics_read(pending, version, conn)


def _statistics_read(
    pending: Batch, version: int, conn: sqlite3.Connection
) -> EnvironmentStatistics:
    totals = schema.namespace_totals(conn)
    tables = schema.table_names(conn) if version >= 2 else set()
    counters: dict[str, tuple[int, int, float]] = {}
    origins: dict[tuple[str, int], tuple[int, float]] = {}
    bundles: list[tuple[int, str, str, int]] = []
    bundle_hits: dict[int, tuple[int, float]] = {}
    if schema.STATISTICS_TABLES <= tables:
        for namespace, origin, hits, saved, misses, computes, seconds in conn.execute(
            f"SELECT {schema.namespace_read()}, origin, hits, saved_seconds, misses, computes, "
            "compute_seconds FROM statistics"
        ):
            if hits:
                origins[(namespace, int(origin))] = (int(hits), float(saved))
            old = counters.get(namespace, (0, 0, 0.0))
            counters[namespace] = (old[0] + misses, old[1] + computes, old[2] + seconds)
        for bundle, hits, saved in conn.execute(
            "SELECT bundle, hits, saved_seconds FROM bundle_statistics"
        ):
            bundle_hits[int(bundle)] = (int(hits), float(saved))
    if "bundles" in tables:
        bundles = [
            (int(ident), str(name), str(digest), int(entries))
            for ident, name, digest, entries in conn.execute(
                "SELECT b.id, b.name, b.digest, (SELECT count(*) FROM entries AS e "
                "WHERE e.bundle = b.id AND e.origin = ?) FROM bundles AS b ORDER BY b.name, b.id",
                (int(Origin.IMPORTED),),
            )
        ]
    try:
        resolved = _resolve_hits(pending, conn)
    except sqlite3.Error:  # no temporary table on this connection: pending hits unresolved
        resolved = Resolved(
            by_origin={
                (p.namespace, int(Origin.LOCAL)): (len(p.served), 0.0) for p in pending if p.served
            },
            by_bundle={},
        )
    return assemble(totals, counters, origins, bundles, bundle_hits, pending, resolved)


# --- explanations -----------------------------------------------------------------


def _explain(namespace: str, key: bytes | None, conn: sqlite3.Connection) -> Explanation:
    # Counts only: the primary key's index answers them without reading a
    # value, where sizes (as `namespaces()` gives) would read every row. A
    # namespace that is not UTF-8 text (written by something else) is listed too.
    with _foreign_text(conn):
        counts = conn.execute(
            f"SELECT {schema.namespace_read()}, count(*) FROM entries "
            "GROUP BY namespace ORDER BY namespace"
        ).fetchall()

    def holding(namespaces: list[str], key: bytes) -> set[str]:
        # One indexed lookup per namespace (the primary key is (namespace, key));
        # no store reaches a namespace that is not UTF-8 text, so none holds it for one.
        lookup = "SELECT 1 FROM entries WHERE namespace = ? AND key = ?"
        return {
            n
            for n in namespaces
            if schema.namespace_addressable(n)
            and conn.execute(lookup, (n, key)).fetchone() is not None
        }

    return explain(counts, namespace, key, holding)


# --- recency, quarantine, gc, vacuum ----------------------------------------------

_TOUCH_CHUNK = 500


def _touch(namespace: str, keys: list[bytes], now: int, conn: sqlite3.Connection) -> int:
    stamp = now - now % schema.HIT_GRANULARITY

    def body(conn: sqlite3.Connection) -> int:
        changed = 0
        for start in range(0, len(keys), _TOUCH_CHUNK):
            chunk = keys[start : start + _TOUCH_CHUNK]
            marks = ",".join("?" * len(chunk))
            changed += conn.execute(
                "UPDATE entries SET last_hit = ? WHERE namespace = ? "
                f"AND key IN ({marks}) AND (last_hit IS NULL OR last_hit < ?)",
                (stamp, namespace, *chunk, stamp),
            ).rowcount
        return changed

    return schema.transaction(conn, body)


def _purge_bundle(digest_or_name: str, conn: sqlite3.Connection) -> int:
    def body(conn: sqlite3.Connection) -> int:
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM bundles WHERE digest = ? OR name = ? "
                "OR substr(digest, instr(digest, ':') + 1) = ?",
                (digest_or_name, digest_or_name, digest_or_name),
            )
        ]
        removed = 0
        for bundle_id in ids:
            removed += conn.execute(
                "DELETE FROM entries WHERE origin = ? AND bundle = ?",
                (int(Origin.IMPORTED), bundle_id),
            ).rowcount
        return removed

    return schema.transaction(conn, body)


def _upgraded_at(conn: sqlite3.Connection) -> float:
    """When version 1 was upgraded (entries from before carry no `written_at`); 0 if never."""
    found = schema.meta_value(conn, "upgraded_at")
    try:
        return float(found) if found is not None else 0.0  # type: ignore[arg-type]
    except ValueError:
        return 0.0


def _gc(
    max_bytes: int | None,
    older_than: float | None,
    keep_versions: int | None,
    now: float,
    conn: sqlite3.Connection,
) -> int:
    def body(conn: sqlite3.Connection) -> int:
        upgraded_at = _upgraded_at(conn)
        written = "coalesce(written_at, ?)"
        removed = 0
        if keep_versions is not None:
            removed += _keep_versions(keep_versions, upgraded_at, conn)
        if older_than is not None:
            removed += conn.execute(
                f"DELETE FROM entries WHERE max({written}, coalesce(last_hit, 0)) < ?",
                (upgraded_at, now - older_than),
            ).rowcount
        if max_bytes is not None:
            removed += _evict_to(max_bytes, upgraded_at, conn)
        return removed

    return schema.transaction(conn, body)


def _keep_versions(keep: int, upgraded_at: float, conn: sqlite3.Connection) -> int:
    """Per (name, path), delete the namespaces of all but the `keep` newest-written versions."""
    groups: dict[tuple[str, str], list[tuple[float, str]]] = {}
    # Only namespaces a store can address have versions to keep: a row something else
    # wrote (not text, or text that is not UTF-8) is left alone, as purge leaves it.
    with _foreign_text(conn):
        rows = conn.execute(
            "SELECT namespace, max(coalesce(written_at, ?)) FROM entries "
            "WHERE typeof(namespace) = 'text' AND namespace != '' GROUP BY namespace",
            (upgraded_at,),
        ).fetchall()
    for namespace, newest in rows:
        # Text only (the query's typeof): a text namespace ending like a tag
        # ('app/1/img <BLOB>', a store's own) has versions too; text that is not
        # UTF-8 (read with surrogates) is no store's.
        try:
            namespace.encode("utf-8")
        except UnicodeEncodeError:
            continue
        parsed = Namespace.raw(namespace)
        groups.setdefault((parsed.name, parsed.path), []).append((float(newest), namespace))
    removed = 0
    for versions in groups.values():
        versions.sort(reverse=True)
        for _, namespace in versions[keep:]:
            removed += conn.execute(
                "DELETE FROM entries WHERE namespace = ?", (namespace,)
            ).rowcount
    return removed


# The eviction order: never hit first, then least recently hit; oldest written first.
_EVICTION_ORDER = "coalesce(last_hit, -1), coalesce(written_at, ?), rowid"


def _evict_to(max_bytes: int, upgraded_at: float, conn: sqlite3.Connection) -> int:
    """Delete entries in eviction order until keys and values add up to `max_bytes` at most.

    Inside SQLite: one pass sums the sizes, a window over the eviction order
    finds the last entry to go, and one DELETE removes every entry up to it.
    Python never holds more than one row.
    """
    total = int(
        conn.execute(
            "SELECT coalesce(sum(length(key) + length(value)), 0) FROM entries"
        ).fetchone()[0]
    )
    excess = total - max_bytes
    if excess <= 0:
        return 0
    cutoff = conn.execute(
        f"SELECT h, w, r FROM (SELECT coalesce(last_hit, -1) AS h, coalesce(written_at, ?) AS w, "
        f"rowid AS r, sum(length(key) + length(value)) OVER (ORDER BY {_EVICTION_ORDER} "
        "ROWS UNBOUNDED PRECEDING) AS run FROM entries) WHERE run >= ? LIMIT 1",
        (upgraded_at, upgraded_at, excess),
    ).fetchone()
    return int(
        conn.execute(
            f"DELETE FROM entries WHERE ({_EVICTION_ORDER}) <= (?, ?, ?)",
            (upgraded_at, *cutoff),
        ).rowcount
    )


def _vacuum(conn: sqlite3.Connection) -> None:
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _file_size(path: Path) -> int:
    size = 0
    for candidate in (path, path.with_name(path.name + "-wal")):
        try:
            size += os.stat(candidate).st_size
        except FileNotFoundError:
            pass
    return size


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


@attrs.frozen
class _Provenance:
    """What a bulk copy writes in the provenance columns: SQL over the source row `b`."""

    written_at: str
    cost: str
    bundle: int | None


def _copy_provenance(alias: str, bundle: BundleRef | None, conn: sqlite3.Connection) -> _Provenance:
    """Map the source's columns: its own `written_at`/`cost` if it has them (by name),
    where believed (`carried`): a value out of range is unknown, as in a flat bundle."""
    now = wall_clock()
    columns = {name for name, _ in schema.entry_columns(conn, alias)}
    written_at = repr(now)
    if "written_at" in columns:
        believed = carried.believed_sql("b.written_at", carried.WRITTEN_AT_LIMIT)
        written_at = carried.as_of_sql(believed, now)
    cost = carried.believed_sql("b.cost", carried.COST_LIMIT) if "cost" in columns else "NULL"
    bundle_id = None
    if bundle is not None:
        try:
            bundle_id = schema.transaction(conn, partial(_bundle_id, bundle, now))
        except sqlite3.Error as exc:
            # A file that cannot be written (read-only, full disk) fails each
            # batch too, and those failures are what the import reports.
            log.warning("recording bundle %r failed: %s", bundle.name, exc)
    return _Provenance(written_at=written_at, cost=cost, bundle=bundle_id)


BULK_CHECKPOINT_PAGES = 8192
"""The WAL size (pages) at which a connection checkpoints while bulk copies run."""
_DEFAULT_CHECKPOINT_PAGES = 1000  # SQLite's, which warmenv keeps otherwise


def _autocheckpoint(pages: int, conn: sqlite3.Connection) -> None:
    conn.execute(f"PRAGMA wal_autocheckpoint={pages}")


def _end_bulk_checkpoints(conn: sqlite3.Connection) -> None:
    """Back to the usual spacing, and a checkpoint now: what the copies wrote is on disk."""
    _autocheckpoint(_DEFAULT_CHECKPOINT_PAGES, conn)
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except sqlite3.Error as exc:  # read-only, or busy: the next checkpoint does it
        log.debug("checkpoint after a bulk copy failed: %s", exc)


def _attach(alias: str, source: Path, conn: sqlite3.Connection) -> None:
    """ATTACH `source` read-only (`schema.open_uris`): the first URI SQLite accepts."""
    error: sqlite3.Error | None = None
    for uri in schema.open_uris(source, read_write=False):
        try:
            conn.execute(f"ATTACH DATABASE ? AS {alias}", (uri,))
            return
        except sqlite3.Error as exc:
            error = exc
    assert error is not None
    raise error


def _detach(alias: str, conn: sqlite3.Connection) -> None:
    conn.execute(f"DETACH DATABASE {alias}")


def _rowid_range(alias: str, conn: sqlite3.Connection) -> tuple[int | None, int]:
    """The first and last rowid of the source (None, 0: it is empty)."""
    first, last = conn.execute(f"SELECT min(rowid), max(rowid) FROM {alias}.entries").fetchone()
    return (None, 0) if first is None else (int(first), int(last))


@attrs.frozen
class _Span:
    """A batch of a bulk copy: the rowids `start` to `end` of the source's `last`.

    A bundle's rowids run without gaps (export writes them in one go), so a
    batch is a range of `batch_size` rowids, with no query to find where it
    ends; a range that holds nothing (a file with gaps) skips to the next row.
    """

    alias: str
    start: int
    end: int
    last: int

    def following(self, seen: int, conn: sqlite3.Connection) -> int | None:
        """Where the next batch starts (None: this was the last)."""
        if self.end >= self.last:
            return None
        if seen:
            return self.end + 1
        row = conn.execute(
            f"SELECT min(rowid) FROM {self.alias}.entries WHERE rowid > ?", (self.end,)
        ).fetchone()
        return None if row[0] is None else int(row[0])


def _seen(
    alias: str, start: int, end: int, clause: str, params: list[str], conn: sqlite3.Connection
) -> list[tuple[str, int, int]]:
    return schema.range_totals(
        conn,
        table=f"{alias}.entries AS b",
        where=f"b.rowid BETWEEN ? AND ? AND {clause}",
        params=(start, end, *params),
    )


def _count_failed_batch(
    span: _Span, clause: str, params: list[str], conn: sqlite3.Connection
) -> CopiedBatch:
    seen = _seen(span.alias, span.start, span.end, clause, params, conn)
    total = sum(c for _, c, _ in seen)
    return CopiedBatch(
        seen=total,
        seen_bytes=sum(b for _, _, b in seen),
        imported=[],
        last_namespace=seen[-1][0] if seen else "",
        following=span.following(total, conn),
        failed=True,
    )


def _copy_batch(
    span: _Span,
    clause: str,
    params: list[str],
    provenance: _Provenance,
    conn: sqlite3.Connection,
) -> CopiedBatch:
    """Copy one rowid range in one transaction, in one call into the worker.

    Which rows were new is known without asking SQLite row by row when all
    or none of the batch went in; only a batch where some did (a resumed
    import, a few local values) is redone with RETURNING to count them.
    """
    alias, start, end = span.alias, span.start, span.end
    source = (
        f"SELECT b.namespace, b.key, b.value, {int(Origin.IMPORTED)}, "
        f"{provenance.written_at}, {provenance.cost}, ? "
        f"FROM {alias}.entries AS b WHERE b.rowid BETWEEN ? AND ? AND {clause}"
    )
    sql = schema.UPSERT.format(table="main.entries", source=source)
    args = (provenance.bundle, start, end, *params)

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
            following=span.following(total, conn),
        )

    return schema.transaction(conn, body)
