"""Import: copy a bundle's entries into an environment, as IMPORTED.

Import is insert-only and idempotent: entries already present are skipped,
and a value computed locally is never overwritten (the storage's insert rule
decides, as for every write). The digest is checked before the first batch
is committed, so a bundle whose content does not match its manifest imports
nothing. Each batch is one transaction, so an import that is cancelled or
killed leaves whole batches behind, and running it again completes it.

A SQLite bundle going into a SQLite environment is copied inside SQLite
(ATTACH, then INSERT ... SELECT over rowid ranges); anything else streams
scan batches into `insert_many`. Either way memory stays bounded by the
batch size, whatever the bundle's size.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import final

import anyio
import attrs

from warmenv.bundle.base import Bundle, CorruptBundleError
from warmenv.bundle.events import (
    Event,
    EventStream,
    Finished,
    ImportReport,
    Progress,
    Started,
)
from warmenv.bundle.flat import FlatBundle
from warmenv.bundle.open import open_any
from warmenv.bundle.sqlite import SqliteBundle, bundle_uri
from warmenv.environment import Environment
from warmenv.persistence.namespace import matches_any, prefix_sql
from warmenv.persistence.sqlite import SqliteDatabase, transaction
from warmenv.persistence.storage import NamespaceSummary, Origin, Storage, check_batch_size

__all__ = ["ImportProgress", "content_digest", "import_bundle", "importing"]

Validate = Callable[[str, bytes, bytes], bool]
_aliases = itertools.count(1)
log = logging.getLogger("warmenv.bundle")


async def import_bundle(
    source: str | Path | Bundle,
    env: Environment,
    *,
    namespaces: list[str] | None = None,
    batch_size: int = 1024,
    validate: Validate | None = None,
    verify: bool = True,
) -> ImportReport:
    """Import every entry of `source` (a path or an open bundle) into `env`."""
    async with importing(
        source, env, namespaces=namespaces, batch_size=batch_size, validate=validate, verify=verify
    ) as progress:
        async for _ in progress:
            pass
    return progress.report


@asynccontextmanager
async def importing(
    source: str | Path | Bundle,
    env: Environment,
    *,
    namespaces: list[str] | None = None,
    batch_size: int = 1024,
    validate: Validate | None = None,
    verify: bool = True,
) -> AsyncIterator[ImportProgress]:
    """`async with importing(...) as progress: async for event in progress:` runs the import.

    The import advances as the events are consumed; leaving the block early
    stops it after the last whole batch.
    """
    check_batch_size(batch_size)
    owned = not _is_bundle(source)
    bundle = await open_any(Path(source)) if owned else source  # type: ignore[arg-type]
    assert not isinstance(bundle, str | Path)
    progress = ImportProgress(bundle, env, namespaces, batch_size, validate, verify)
    try:
        yield progress
    finally:
        with anyio.CancelScope(shield=True):
            await progress.aclose()
            if owned:
                await bundle.aclose()


def _is_bundle(source: object) -> bool:
    return isinstance(source, SqliteBundle | FlatBundle) or hasattr(source, "manifest")


@final
class ImportProgress(EventStream[ImportReport]):
    """The events of one import; `report` once it has finished."""

    _operation = "import"

    def __init__(
        self,
        bundle: Bundle,
        env: Environment,
        prefixes: list[str] | None,
        batch_size: int,
        validate: Validate | None,
        verify: bool,
    ) -> None:
        self._bundle = bundle
        self._env = env
        self._prefixes = prefixes
        self._batch_size = batch_size
        self._validate = validate
        self._verify = verify
        super().__init__()

    async def _run(self) -> AsyncGenerator[Event, None]:
        started_at = time.perf_counter()
        selected = [
            s for s in await self._bundle.namespaces() if matches_any(s.namespace, self._prefixes)
        ]
        total_entries = sum(s.entries for s in selected)
        total_bytes = sum(s.bytes for s in selected)
        yield Started(tuple(s.namespace for s in selected), total_entries, total_bytes)
        if self._verify:
            await _verify(self._bundle)
        tally = _Tally()
        for summary in selected:
            tally.by_ns[summary.namespace] = (0, 0)
        db = self._env.database
        if isinstance(self._bundle, SqliteBundle) and db is not None and self._validate is None:
            batches = _copy_in_sql(self._bundle, db, self._prefixes, self._batch_size, tally)
        else:
            batches = _copy_by_scan(self._bundle, self._env, selected, self, tally)
        async with aclosing(batches):
            async for namespace in batches:
                yield Progress(namespace, tally.done, total_entries, tally.bytes_done, total_bytes)
        report = ImportReport(
            namespaces=tuple(
                NamespaceSummary(ns, entries, size) for ns, (entries, size) in tally.by_ns.items()
            ),
            imported=tally.imported,
            skipped=tally.skipped,
            failed=tally.failed,
            rejected=tally.rejected,
            bytes=tally.imported_bytes,
            elapsed=time.perf_counter() - started_at,
        )
        self._report = report
        yield Finished(report)


class _Tally:
    def __init__(self) -> None:
        self.imported = self.skipped = self.failed = self.rejected = 0
        self.imported_bytes = self.done = self.bytes_done = 0
        self.by_ns: dict[str, tuple[int, int]] = {}

    def add_imported(self, namespace: str, entries: int, size: int) -> None:
        old = self.by_ns.get(namespace, (0, 0))
        self.by_ns[namespace] = (old[0] + entries, old[1] + size)
        self.imported += entries
        self.imported_bytes += size


async def content_digest(bundle: Bundle) -> str:
    """The digest of what `bundle` holds, to compare with `bundle.manifest.digest`."""
    if isinstance(bundle, FlatBundle):
        actual = await anyio.to_thread.run_sync(bundle.compute_digest)
    elif isinstance(bundle, SqliteBundle):
        actual = await bundle.compute_digest()
    else:  # any other Bundle: stream it in order
        from warmenv.bundle.manifest import Digest

        digest = Digest()
        for summary in await bundle.namespaces():
            raw = summary.namespace.encode("utf-8")
            async for key, value in bundle.scan(summary.namespace):
                digest.update(raw, key, value)
        actual = digest.value()
    return actual


async def _verify(bundle: Bundle) -> None:
    expected = bundle.manifest.digest
    actual = await content_digest(bundle)
    if actual != expected:
        raise CorruptBundleError(
            f"{bundle.describe()}: its content does not match its digest (manifest says "
            f"{expected}, content hashes to {actual}); nothing was imported"
        )


async def _copy_by_scan(
    bundle: Bundle,
    env: Environment,
    selected: list[NamespaceSummary],
    progress: ImportProgress,
    tally: _Tally,
) -> AsyncGenerator[str, None]:
    validate = progress._validate
    for summary in selected:
        namespace = summary.namespace
        storage = env.storage(namespace)
        batch: list[tuple[bytes, bytes]] = []
        scan = bundle.scan(namespace, progress._batch_size)
        async with aclosing(scan):  # type: ignore[type-var]
            async for key, value in scan:
                batch.append((key, value))
                if len(batch) >= progress._batch_size:
                    await _insert_batch(storage, namespace, batch, validate, tally)
                    batch = []
                    yield namespace
        if batch:
            await _insert_batch(storage, namespace, batch, validate, tally)
        yield namespace


async def _insert_batch(
    storage: Storage,
    namespace: str,
    batch: list[tuple[bytes, bytes]],
    validate: Validate | None,
    tally: _Tally,
) -> None:
    accepted = batch
    if validate is not None:
        accepted = [(k, v) for k, v in batch if validate(namespace, k, v)]
        tally.rejected += len(batch) - len(accepted)
    summary = await storage.insert_many(accepted, Origin.IMPORTED)
    size = sum(len(k) + len(v) for k, v in accepted)
    # insert_many counts but does not name what it stored; when only some
    # were, their bytes are estimated by their share of the batch.
    stored_bytes = (
        size
        if summary.stored == len(accepted)
        else (size * summary.stored // max(len(accepted), 1))
    )
    tally.add_imported(namespace, summary.stored, stored_bytes)
    tally.skipped += summary.conflict
    tally.failed += summary.failed
    tally.done += len(batch)
    tally.bytes_done += sum(len(k) + len(v) for k, v in batch)


async def _copy_in_sql(
    bundle: SqliteBundle,
    db: SqliteDatabase,
    prefixes: list[str] | None,
    batch_size: int,
    tally: _Tally,
) -> AsyncGenerator[str, None]:
    # A name of its own, so that imports into one environment can overlap.
    alias = f"warmenv_bundle_{next(_aliases)}"
    try:
        try:
            await db.run(partial(_attach, alias, bundle_uri(bundle.path)))
        except sqlite3.Error:
            await db.run(partial(_attach, alias, bundle_uri(bundle.path, immutable=True)))
        clause, params = prefix_sql(prefixes, column="b.namespace")
        start: int | None = await db.run(partial(_first_rowid, alias))
        while start is not None:
            copy = partial(_copy_batch, alias, start, batch_size, clause, params)
            try:
                batch = await db.run(copy)
            except sqlite3.Error as exc:
                log.warning("importing %s into %s: a batch failed: %s", bundle.path, db.path, exc)
                batch = await db.run(
                    partial(_count_failed_batch, alias, start, batch_size, clause, params)
                )
            start = batch.following
            for namespace, entries, size in batch.imported:
                tally.add_imported(namespace, entries, size)
            if batch.failed:
                tally.failed += batch.seen
            else:
                tally.skipped += batch.seen - sum(entries for _, entries, _ in batch.imported)
            tally.done += batch.seen
            tally.bytes_done += batch.seen_bytes
            if batch.seen:
                yield batch.last_namespace
    finally:
        # The worker runs calls in order, so this detach follows even an
        # attach whose caller was cancelled while it ran.
        with anyio.CancelScope(shield=True):
            try:
                await db.run(partial(_detach, alias))
            except sqlite3.Error:
                pass


def _attach(alias: str, uri: str, conn: sqlite3.Connection) -> None:
    conn.execute(f"ATTACH DATABASE ? AS {alias}", (uri,))


def _detach(alias: str, conn: sqlite3.Connection) -> None:
    conn.execute(f"DETACH DATABASE {alias}")


def _first_rowid(alias: str, conn: sqlite3.Connection) -> int | None:
    row = conn.execute(f"SELECT min(rowid) FROM {alias}.entries").fetchone()
    return None if row[0] is None else int(row[0])


@attrs.frozen
class _Batch:
    seen: int
    seen_bytes: int
    imported: list[tuple[str, int, int]]
    last_namespace: str
    following: int | None
    failed: bool = False


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
    return conn.execute(
        "SELECT namespace, count(*), coalesce(sum(length(key) + length(value)), 0) "
        f"FROM {alias}.entries AS b WHERE b.rowid BETWEEN ? AND ? AND {clause} "
        "GROUP BY namespace ORDER BY namespace",
        (start, end, *params),
    ).fetchall()


def _count_failed_batch(
    alias: str,
    start: int,
    batch_size: int,
    clause: str,
    params: list[str],
    conn: sqlite3.Connection,
) -> _Batch:
    end, following = _batch_bounds(alias, start, batch_size, conn)
    seen = _seen(alias, start, end, clause, params, conn)
    return _Batch(
        seen=sum(c for _, c, _ in seen),
        seen_bytes=sum(b for _, _, b in seen),
        imported=[],
        last_namespace=seen[-1][0] if seen else "",
        following=following,
        failed=True,
    )


_COPY = (
    "INSERT INTO main.entries (namespace, key, value, origin) "
    "SELECT b.namespace, b.key, b.value, {origin} "
    "FROM {alias}.entries AS b WHERE b.rowid BETWEEN ? AND ? AND {clause} "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
    "origin = excluded.origin WHERE warmenv_may_replace(entries.origin, excluded.origin)"
)


def _copy_batch(
    alias: str,
    start: int,
    batch_size: int,
    clause: str,
    params: list[str],
    conn: sqlite3.Connection,
) -> _Batch:
    """Copy one rowid range in one transaction, in one call into the worker.

    Which rows were new is known without asking SQLite row by row when all
    or none of the batch went in; only a batch where some did (a resumed
    import, a few local values) is redone with RETURNING to count them.
    """
    end, following = _batch_bounds(alias, start, batch_size, conn)
    sql = _COPY.format(origin=int(Origin.IMPORTED), alias=alias, clause=clause)
    args = (start, end, *params)

    def body(conn: sqlite3.Connection) -> _Batch:
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
        return _Batch(
            seen=total,
            seen_bytes=sum(b for _, _, b in seen),
            imported=imported,
            last_namespace=seen[-1][0] if seen else "",
            following=following,
        )

    return transaction(conn, body)
