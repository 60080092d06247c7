"""Recency, quarantine and eviction of an environment's entries, in SQL, written once.

Eviction reads what the entries record: when each was written and, coarsely
(`schema.HIT_GRANULARITY`), when it was last hit. `gc` drops old versions of
an application's namespaces, then entries unused for a while, then the least
recently hit until the size fits, in one transaction; quarantine deletes what
one bundle imported and no local write replaced.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from warmenv.persistence.namespace import Namespace
from warmenv.persistence.sqlite import schema
from warmenv.persistence.storage import BundleRef, Origin, addressable, bundles_to_purge

__all__ = ["file_size", "gc", "purge_bundle", "touch", "vacuum"]

_TOUCH_CHUNK = 500


def touch(namespace: str, keys: list[bytes], now: int, conn: sqlite3.Connection) -> int:
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


def purge_bundle(digest_or_name: str, conn: sqlite3.Connection) -> int:
    """Delete what one bundle imported; which one is `storage.bundles_to_purge`'s rule."""

    def body(conn: sqlite3.Connection) -> int:
        # Only bundles with entries still imported: one already purged is no rival.
        ids: dict[BundleRef, list[int]] = {}
        for bundle_id, name, digest in conn.execute(
            "SELECT id, name, digest FROM bundles WHERE EXISTS (SELECT 1 FROM entries "
            "WHERE entries.origin = ? AND entries.bundle = bundles.id)",
            (int(Origin.IMPORTED),),
        ):
            ids.setdefault(BundleRef(str(name), str(digest)), []).append(int(bundle_id))
        removed = 0
        for bundle in bundles_to_purge(digest_or_name, ids):
            for bundle_id in ids[bundle]:
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


_WRITTEN = (
    "coalesce(written_at, (SELECT imported_at FROM bundles WHERE bundles.id = entries.bundle), ?)"
)
"""An entry's write time as gc ages it (one `?`: `_upgraded_at`).

A write time that is unknown (NULL: from before schema 2, carried by no
bundle, or not believed, `warmenv.persistence.carried`) stays unknown in the
row, so a ttl never counts it fresh; gc ages such an entry from when it came
here, where that is known (its bundle's import), else from the upgrade to
schema 2 (0 if none): the oldest, for a fetched value the fleet still has.
"""


def gc(
    max_bytes: int | None,
    older_than: float | None,
    keep_versions: int | None,
    now: float,
    conn: sqlite3.Connection,
) -> int:
    def body(conn: sqlite3.Connection) -> int:
        upgraded_at = _upgraded_at(conn)
        written = _WRITTEN
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
    with schema.foreign_text(conn):
        rows = conn.execute(
            f"SELECT namespace, max({_WRITTEN}) FROM entries "
            "WHERE typeof(namespace) = 'text' AND namespace != '' GROUP BY namespace",
            (upgraded_at,),
        ).fetchall()
    for namespace, newest in rows:
        # Text only (the query's typeof); text that is not UTF-8 (read with
        # surrogates) is no store's.
        if not addressable(namespace, text=True):
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
_EVICTION_ORDER = f"coalesce(last_hit, -1), {_WRITTEN}, rowid"


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
        f"SELECT h, w, r FROM (SELECT coalesce(last_hit, -1) AS h, {_WRITTEN} AS w, "
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


def vacuum(wait: float, conn: sqlite3.Connection) -> bool:
    """Rewrite the file compactly, waiting up to `wait` s for others; whether it is done.

    In WAL mode VACUUM writes the compacted database into the write-ahead
    log, and only the checkpoint moves it into the file; a reader of the old
    snapshot holds the checkpoint off, and SQLite says so in the result row
    (not as an error): then the file is left larger than before, and this
    returns False.
    """
    previous = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
    conn.execute(f"PRAGMA busy_timeout = {max(int(wait * 1000), 0)}")
    try:
        conn.execute("VACUUM")
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        conn.execute(f"PRAGMA busy_timeout = {previous}")
    return not busy


def file_size(path: Path) -> int:
    size = 0
    for candidate in (path, path.with_name(path.name + "-wal")):
        try:
            size += os.stat(candidate).st_size
        except FileNotFoundError:
            pass
    return size
