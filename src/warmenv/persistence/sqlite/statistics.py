"""What an environment's tables say about their entries: listings, explanations, statistics.

The SQL side of `warmenv.persistence.statistics` (which counts lookups in
memory and assembles what is stored with what is pending) and of
`warmenv.persistence.explain` (which says why a lookup misses): counts per
namespace, the flush of a batch of counts in slices, and its reading back.
A flush is set-based, so its cost grows with the rows it adds and not with
the lookups per row; see the comments at `_NAMESPACES`.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Sequence

import attrs

from warmenv.persistence.explain import Explanation, explain
from warmenv.persistence.sqlite import schema
from warmenv.persistence.statistics import (
    IMPORT_RECORDS,
    START,
    Batch,
    Cursor,
    EnvironmentStatistics,
    ImportOutcome,
    ImportRecord,
    Name,
    Resolved,
    Slice,
    assemble,
    cut,
)
from warmenv.persistence.storage import NamespaceSummary, Origin, addressable

__all__ = ["entry_counts", "explain_miss", "flush", "namespaces", "read", "record_import"]


def namespaces(conn: sqlite3.Connection, under: str | None = None) -> list[NamespaceSummary]:
    """Every namespace's summary, one not UTF-8 text (or not text at all) included.

    `under`: only the namespaces of that name (their first segment), stored as
    text, read by a range of the primary key rather than the whole table.
    """
    with schema.foreign_text(conn):
        if under is None:
            return schema.namespace_summaries(conn)
        # '0' is the character after '/': the range holds exactly `under/...`.
        return schema.namespace_summaries(
            conn, where="namespace >= ? AND namespace < ?", params=(f"{under}/", f"{under}0")
        )


def entry_counts(conn: sqlite3.Connection, under: str) -> list[tuple[str, int]]:
    """`namespaces(conn, under)` without the sizes: each text namespace of that name and
    its entries, read from the primary key's index alone (a size needs every row's
    record, a count only the index)."""
    with schema.foreign_text(conn):
        rows = conn.execute(
            f"SELECT {schema.namespace_read()}, count(*) FROM entries "
            "WHERE namespace >= ? AND namespace < ? GROUP BY namespace ORDER BY namespace",
            (f"{under}/", f"{under}0"),
        )
        return [(str(namespace), int(count)) for namespace, count in rows]


# A slice of a batch goes into SQLite as two temporary tables: a row per namespace (its
# misses and computations) and a row per hit key, resolved against its entry
# as it is inserted (origin, cost, bundle, and the entry's rowid if its
# recency is older than this granule). Rows go in as multi-row VALUES, one
# statement per few hundred rows rather than one per row; everything after
# that is set-based: one GROUP BY feeds the UPSERT of the statistics, one the
# bundles', and the stale rowids the recency update. No key is looked up twice.
_NAMESPACES = "temp.warmenv_namespaces"
_HITS = "temp.warmenv_hits"
# The entries (rowids) whose saving this connection, so this process, has
# already credited: a saving is the cold start a hit avoided, counted once
# per entry per process however often it is hit again (docs/statistics.md).
# A temporary table, not a Python set: SQLite keeps it in its page cache
# (spilling to the temporary file past it), so 100,000s of entries cost no
# Python objects and the flush checks membership set-based, by primary key.
_CREDITED = "temp.warmenv_credited"
_BATCH_DDL = (
    f"CREATE TABLE IF NOT EXISTS {_NAMESPACES} (i INTEGER PRIMARY KEY, "
    "namespace TEXT NOT NULL, misses INTEGER NOT NULL, computes INTEGER NOT NULL, "
    "seconds REAL NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {_HITS} (i INTEGER NOT NULL, origin INTEGER NOT NULL, "
    "n INTEGER NOT NULL, cost REAL, bundle INTEGER, stale INTEGER, entry INTEGER, fresh INTEGER)",
    f"CREATE TABLE IF NOT EXISTS {_CREDITED} (entry INTEGER PRIMARY KEY)",
)
# ?1 is the recency granule; the VALUES rows are (namespace row, key, times hit),
# the key a BLOB or, in a UTF-8 file, an ASCII key's text: CAST makes it the same
# BLOB, and text is bound cheaper (see statistics.hit_params).
_RESOLVE = (
    f"INSERT INTO {_HITS} SELECT v.column1, coalesce(e.origin, {int(Origin.LOCAL)}), "
    "v.column3, e.cost, e.bundle, iif(e.last_hit IS NULL OR e.last_hit < ?1, e.rowid, NULL), "
    f"e.rowid, e.rowid IS NOT NULL AND e.rowid NOT IN (SELECT entry FROM {_CREDITED}) "
    f"FROM ({{values}}) AS v CROSS JOIN {_NAMESPACES} AS ns ON ns.i = v.column1 "
    "LEFT JOIN main.entries AS e ON e.namespace = ns.namespace AND e.key = CAST(v.column2 AS BLOB)"
)
# Per (namespace, origin of the entry hit): hits and seconds saved; misses and
# computations go on the LOCAL row (every namespace with some has one: below).
# A slice holds an entry in one row at most (`statistics.cut` merges a key served
# both as a JSON store's str and as its encoding), so one GROUP BY adds each
# entry's saving once; a second, per entry, made the flush 1.4x slower.
_BY_ORIGIN = (
    "SELECT ns.namespace, h.origin, h.hits, h.saved, "
    f"iif(h.origin = {int(Origin.LOCAL)}, ns.misses, 0), "
    f"iif(h.origin = {int(Origin.LOCAL)}, ns.computes, 0), "
    f"iif(h.origin = {int(Origin.LOCAL)}, ns.seconds, 0) "
    "FROM (SELECT i, origin, sum(n) AS hits, sum(iif(fresh, coalesce(cost, 0), 0)) AS saved "
    f"FROM {_HITS} GROUP BY i, origin) AS h JOIN {_NAMESPACES} AS ns ON ns.i = h.i WHERE true"
)
_BY_BUNDLE = (
    "SELECT bundle, sum(n), sum(iif(fresh, coalesce(cost, 0), 0)) "
    f"FROM {_HITS} WHERE origin = {int(Origin.IMPORTED)} AND bundle IS NOT NULL GROUP BY bundle"
)
_CREDIT = f"INSERT OR IGNORE INTO {_CREDITED} SELECT entry FROM {_HITS} WHERE fresh"
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


def flush(batch: Batch, start: Cursor, now: int, conn: sqlite3.Connection) -> Cursor:
    """Add one slice of `batch` from `start` in one transaction; where the slice ended."""
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
        conn.execute(_CREDIT)  # in the transaction: a slice rolled back credits nothing
        _clear_batch(conn)

    schema.transaction(conn, body)
    return piece.end


def read(pending: Batch, version: int, conn: sqlite3.Connection) -> EnvironmentStatistics:
    """The stored counts of every namespace and bundle, plus `pending` resolved (not stored)."""
    with schema.foreign_text(conn):
        return _statistics_read(pending, version, conn)


def _statistics_read(
    pending: Batch, version: int, conn: sqlite3.Connection
) -> EnvironmentStatistics:
    without_cost: dict[Name, int] = {}
    if version >= 2:
        # An entry hit at least once has a recency (imports write none: see flush); one
        # hit without a recorded cost makes what its namespace's hits saved not known.
        counted = schema.summaries_hit_without_cost(conn)
        totals = [summary for summary, _ in counted]
        without_cost = {(t.namespace, t.text): n for t, n in counted if n}
    else:
        totals = schema.namespace_summaries(conn)
    tables = schema.table_names(conn) if version >= 2 else set()
    counters: dict[Name, tuple[int, int, float]] = {}
    origins: dict[tuple[Name, int], tuple[int, float]] = {}
    bundles: list[tuple[int, str, str, int, int, int]] = []
    bundle_hits: dict[int, tuple[int, float]] = {}
    if schema.STATISTICS_TABLES <= tables:
        for namespace, text, origin, hits, saved, misses, computes, seconds in conn.execute(
            f"SELECT {schema.namespace_read()}, {schema.text_read()}, origin, hits, "
            "saved_seconds, misses, computes, compute_seconds FROM statistics"
        ):
            name = (namespace, bool(text))
            if hits:
                origins[(name, int(origin))] = (int(hits), float(saved))
            old = counters.get(name, (0, 0, 0.0))
            counters[name] = (old[0] + misses, old[1] + computes, old[2] + seconds)
        for bundle, hits, saved in conn.execute(
            "SELECT bundle, hits, saved_seconds FROM bundle_statistics"
        ):
            bundle_hits[int(bundle)] = (int(hits), float(saved))
    if "bundles" in tables:
        bundles = [
            (int(ident), str(name), str(digest), int(entries), int(hit or 0), int(unpriced or 0))
            for ident, name, digest, entries, hit, unpriced in conn.execute(
                "SELECT b.id, b.name, b.digest, count(e.rowid), count(e.last_hit), "
                "count(iif(e.cost IS NULL, e.last_hit, NULL)) "
                "FROM bundles AS b LEFT JOIN entries AS e ON e.bundle = b.id AND e.origin = ? "
                "GROUP BY b.id ORDER BY b.name, b.id",
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
    assembled = assemble(
        totals, counters, origins, bundles, bundle_hits, pending, resolved, without_cost
    )
    if schema.IMPORTS_TABLE not in tables:
        return assembled
    return attrs.evolve(assembled, imports=_imports(conn))


def _imports(conn: sqlite3.Connection) -> list[ImportRecord]:
    rows = conn.execute(
        "SELECT source, outcome, at, bundle, imported, skipped, failed, error FROM imports "
        "ORDER BY id DESC LIMIT ?",
        (IMPORT_RECORDS,),
    )
    records = []
    for source, outcome, at, bundle, imported, skipped, failed, error in rows:
        try:
            kind = ImportOutcome(outcome)
        except ValueError:  # written by a later warmenv: not one of ours to show
            continue
        records.append(
            ImportRecord(
                source=str(source),
                outcome=kind,
                at=float(at),
                bundle=None if bundle is None else str(bundle),
                imported=int(imported),
                skipped=int(skipped),
                failed=int(failed),
                error=None if error is None else str(error),
            )
        )
    return records


def record_import(record: ImportRecord, conn: sqlite3.Connection) -> None:
    """Add `record` to the imports, keeping the newest `IMPORT_RECORDS`, in one transaction."""

    def body(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO imports (at, source, outcome, bundle, imported, skipped, failed, error) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.at,
                record.source,
                record.outcome.value,
                record.bundle,
                record.imported,
                record.skipped,
                record.failed,
                record.error,
            ),
        )
        conn.execute(
            "DELETE FROM imports WHERE id <= (SELECT max(id) FROM imports) - ?", (IMPORT_RECORDS,)
        )

    schema.transaction(conn, body)


def explain_miss(namespace: str, key: bytes | None, conn: sqlite3.Connection) -> Explanation:
    """Why a lookup in `namespace` (of `key`) misses, from counts and indexed lookups."""
    # Counts only: the primary key's index answers them without reading a
    # value, where sizes (as `namespaces()` gives) would read every row. A
    # namespace that is not UTF-8 text (written by something else) is listed too; one
    # of another SQLite type is no namespace a store asks for, nor near one.
    with schema.foreign_text(conn):
        counts: list[tuple[str, int]] = conn.execute(
            f"SELECT namespace, count(*) FROM entries WHERE {schema.text_read()} "
            "GROUP BY namespace ORDER BY namespace"
        ).fetchall()
    reachable = {n for n, _ in counts if addressable(n, text=True)}

    def holding(namespaces: list[str], key: bytes) -> set[str]:
        # One indexed lookup per namespace (the primary key is (namespace, key));
        # no store reaches a namespace that is not UTF-8 text, so none holds it for one.
        lookup = "SELECT 1 FROM entries WHERE namespace = ? AND key = ?"
        return {
            n
            for n in namespaces
            if n in reachable and conn.execute(lookup, (n, key)).fetchone() is not None
        }

    return explain(counts, namespace, key, holding)
