"""The bulk copy of an import: a bundle's entries copied inside SQLite, a batch at a time.

An import of a SQLite bundle that needs no check entry by entry attaches the
private, verified snapshot and copies its rows with INSERT ... SELECT over
rowid ranges, under the insert rule, never bringing a value into Python. This
module is the mechanism; whether an import copies in bulk or reads entry by
entry is the import's decision (`warmenv.bundle.importing`). What cannot be
copied in bulk (a flat bundle, a checked import) goes in by `insert_imported`,
keeping what each entry carries as the copy keeps a bundle's columns.

Every read of the source goes through its table by rowid (`NOT INDEXED`, as
`AS b NOT INDEXED`), never through its (namespace, key) index: a bundle's
digest vouches for its rows, not for its index, so what the copy imports is
what the rows hold, whatever the index says (tests/test_bundle_index.py).
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, final

import anyio
import attrs

from warmenv.persistence import carried
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.sqlite import schema, uris
from warmenv.persistence.storage import BundleRef, Origin, check_bundle, wall_clock

__all__ = ["BULK_CHECKPOINT_PAGES", "BulkCopies", "CopiedBatch", "insert_imported"]

log = logging.getLogger("warmenv.storage")
Run = Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]
"""How a function reaches the connection's worker (`SqliteDatabase.run`)."""


@final
class BulkCopies:
    """The bulk copies running into one database: they space its checkpoints out."""

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running = 0

    async def copy(
        self,
        run: Run,
        path: Path,
        source: Path,
        prefixes: list[str] | None,
        batch_size: int,
        *,
        bundle: BundleRef | None = None,
        first: Sequence[str] = (),
    ) -> AsyncGenerator[CopiedBatch, None]:
        """Copy the entries of the entry file `source` in, as IMPORTED, a batch at a time.

        The namespaces `first` (those the application has stores of) are copied
        before the rest, which follow in rowid order (`_parts`): each row is
        copied, and counted, in exactly one of the passes.

        The copy stays inside SQLite (ATTACH, then INSERT ... SELECT over rowid
        ranges of `batch_size` rows each, wherever the rowids lie); each batch is
        one transaction and obeys the insert rule. The
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
        self._running += 1
        try:
            if self._running == 1:
                await run(partial(_autocheckpoint, BULK_CHECKPOINT_PAGES))
            await run(partial(_attach, alias, source))
            clause, params = schema.prefix_sql(prefixes, column="b.namespace")
            try:
                provenance = await run(partial(_copy_provenance, alias, bundle))
            except sqlite3.Error as exc:
                # Recording the bundle is a write: read-only or full, the batches
                # fail too, and are counted as failed one by one below.
                log.warning("importing %s into %s: %s", source, path, exc)
                provenance = await run(partial(_copy_provenance, alias, None))
            for part in await run(partial(_parts, alias, clause, params, list(first))):
                start: int | None = part.start
                while start is not None:
                    # One hop to the worker a batch: its span is found inside the copy's call.
                    copy = partial(_copy_batch, part, start, batch_size, provenance)
                    try:
                        batch = await run(copy)
                    except sqlite3.Error as exc:
                        log.warning("importing %s into %s: a batch failed: %s", source, path, exc)
                        batch = await run(partial(_count_failed_batch, part, start, batch_size))
                    start = batch.following
                    yield batch
        finally:
            # The worker runs calls in order, so this detach follows even an
            # attach whose caller was cancelled while it ran.
            with anyio.CancelScope(shield=True):
                self._running -= 1
                try:
                    await run(partial(_detach, alias))
                except sqlite3.Error:
                    pass
                if not self._running:
                    await run(_end_bulk_checkpoints)


def insert_imported(
    namespace: str,
    entries: list[CarryingEntry],
    bundle: BundleRef | None,
    conn: sqlite3.Connection,
) -> int:
    now = wall_clock()
    origin = int(Origin.IMPORTED)

    def body(conn: sqlite3.Connection) -> int:
        bundle_id = None if bundle is None else schema.bundle_id(bundle, now, conn)
        before = conn.total_changes
        rows = (
            (namespace, key, value, origin, carried.as_of(written, now), cost, bundle_id)
            for key, value, written, cost in entries
        )
        conn.executemany(schema.INSERT, rows)
        return conn.total_changes - before

    return schema.transaction(conn, body)


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
    written_at = "NULL"  # a source that records no write times: each is unknown
    if "written_at" in columns:
        written_at = carried.received_sql("b.written_at", now)
    cost = carried.believed_sql("b.cost", carried.COST_LIMIT) if "cost" in columns else "NULL"
    bundle_id = None
    if bundle is not None:
        try:
            bundle_id = schema.transaction(conn, partial(schema.bundle_id, bundle, now))
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
    for uri in uris.open_uris(source, read_write=False):
        try:
            conn.execute(f"ATTACH DATABASE ? AS {alias}", (uri,))
            return
        except sqlite3.Error as exc:
            error = exc
    assert error is not None
    raise error


def _detach(alias: str, conn: sqlite3.Connection) -> None:
    conn.execute(f"DETACH DATABASE {alias}")


def _first_rowid(alias: str, conn: sqlite3.Connection) -> int | None:
    """The source's first rowid (None: it is empty)."""
    row = conn.execute(f"SELECT min(b.rowid) FROM {alias}.entries AS b NOT INDEXED").fetchone()
    return None if row[0] is None else int(row[0])


@attrs.frozen
class _Part:
    """One pass of a copy: the rows of `alias` that `clause` selects, from rowid `start`
    to `stop` (None: the end)."""

    alias: str
    clause: str
    params: tuple[str, ...]
    start: int
    stop: int | None = None


def _parts(
    alias: str, clause: str, params: list[str], first: list[str], conn: sqlite3.Connection
) -> list[_Part]:
    """The passes of a copy: the rows of the namespaces `first` (of those `clause`
    selects), then the others, so no row is in two passes.

    A bundle's rows are in key order, so one namespace's rows are one run of
    rowids: the namespaces first are copied over their run alone, and the rest
    over the rowids before and after it. Where their rows are not one run (a
    file made otherwise), the rest is every other row, wherever it lies.
    """
    start = _first_rowid(alias, conn)
    if start is None:
        return []
    if not first:
        return [_Part(alias, clause, tuple(params), start)]
    wanted = f"b.namespace IN ({', '.join('?' * len(first))})"
    low, high, count = conn.execute(
        f"SELECT min(b.rowid), max(b.rowid), count(*) FROM {alias}.entries AS b NOT INDEXED "
        f"WHERE ({clause}) AND {wanted}",
        (*params, *first),
    ).fetchone()
    rest = f"({clause}) AND NOT {wanted}"
    both = (*params, *first)
    if low is None:
        return [_Part(alias, clause, tuple(params), start)]
    (run,) = conn.execute(
        f"SELECT count(*) FROM {alias}.entries AS b NOT INDEXED WHERE b.rowid BETWEEN ? AND ?",
        (low, high),
    ).fetchone()
    firsts = _Part(alias, f"({clause}) AND {wanted}", both, low, high)
    if run != count:
        return [firsts, _Part(alias, rest, both, start)]
    around = [_Part(alias, rest, both, start, low - 1)] if start < low else []
    return [firsts, *around, _Part(alias, rest, both, high + 1)]


@attrs.frozen
class _Span:
    """A batch of a bulk copy: the source's rows from rowid `start` to `end`, and the
    rowid the next batch starts from (`following`; None: this is the last).

    A batch is `batch_size` rows, however far apart their rowids lie: export
    writes rowids without gaps, but a file made otherwise may space them 10^11
    apart, and a batch of `batch_size` rowids then held one row, one
    transaction per entry (issue 22, defect 14). The batch's last rowid is
    found by stepping `batch_size` rows along the table's b-tree (no column is
    decoded), over the pages the copy reads next.
    """

    alias: str
    start: int
    end: int
    following: int | None

    @classmethod
    def of(cls, part: _Part, start: int, batch_size: int, conn: sqlite3.Connection) -> _Span:
        """The batch of up to `batch_size` rows from the first rowid >= `start`, up to
        the part's `stop`."""
        stop = _LAST_ROWID if part.stop is None else part.stop
        ends = conn.execute(
            f"SELECT b.rowid FROM {part.alias}.entries AS b NOT INDEXED "
            "WHERE b.rowid BETWEEN ? AND ? ORDER BY b.rowid LIMIT 2 OFFSET ?",
            (start, stop, batch_size - 1),
        ).fetchall()
        if not ends:  # fewer rows than a batch are left: they are the last
            return cls(part.alias, start, stop, None)
        following = int(ends[1][0]) if len(ends) == 2 else None
        return cls(part.alias, start, int(ends[0][0]), following)


_LAST_ROWID = (1 << 63) - 1


def _seen(
    alias: str,
    start: int,
    end: int,
    clause: str,
    params: tuple[str, ...],
    conn: sqlite3.Connection,
) -> list[tuple[str, int, int]]:
    return schema.range_totals(
        conn,
        table=f"{alias}.entries AS b NOT INDEXED",
        where=f"b.rowid BETWEEN ? AND ? AND {clause}",
        params=(start, end, *params),
    )


def _count_failed_batch(
    part: _Part, start: int, batch_size: int, conn: sqlite3.Connection
) -> CopiedBatch:
    span = _Span.of(part, start, batch_size, conn)
    seen = _seen(span.alias, span.start, span.end, part.clause, part.params, conn)
    total = sum(c for _, c, _ in seen)
    return CopiedBatch(
        seen=total,
        seen_bytes=sum(b for _, _, b in seen),
        imported=[],
        last_namespace=seen[-1][0] if seen else "",
        following=span.following,
        failed=True,
    )


def _copy_batch(
    part: _Part,
    first: int,
    batch_size: int,
    provenance: _Provenance,
    conn: sqlite3.Connection,
) -> CopiedBatch:
    """Copy the batch of `batch_size` rows from rowid `first` in one transaction, in one
    call into the worker.

    Which rows were new is known without asking SQLite row by row when all
    or none of the batch went in; only a batch where some did (a resumed
    import, a few local values) is redone with RETURNING to count them.
    """
    span = _Span.of(part, first, batch_size, conn)
    start, end = span.start, span.end
    alias, clause, params = part.alias, part.clause, part.params
    source = (
        f"SELECT b.namespace, b.key, b.value, {int(Origin.IMPORTED)}, "
        f"{provenance.written_at}, {provenance.cost}, ? "
        f"FROM {alias}.entries AS b NOT INDEXED WHERE b.rowid BETWEEN ? AND ? AND {clause}"
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
            following=span.following,
        )

    return schema.transaction(conn, body)
