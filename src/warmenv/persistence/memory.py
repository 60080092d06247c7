"""Storage in process memory, under exactly the contract SQLite keeps.

It serves tests and the degraded mode of an environment whose directory
cannot be written. Every operation is a checkpoint taken before the state
changes, and the change itself never awaits, so cancellation leaves a call
either wholly applied or not applied at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TypeVar, final

from anyio.lowlevel import checkpoint

from warmenv.persistence.carried import WRITTEN_AT_LIMIT, CarryingEntry, as_of, believed
from warmenv.persistence.explain import Explanation, explain
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.sqlite.schema import HIT_GRANULARITY
from warmenv.persistence.statistics import Batch, EnvironmentStatistics, Resolved, assemble
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

__all__ = ["MemoryStorage", "MemoryTable"]

T = TypeVar("T")


@final
class _Row:
    """One entry and its provenance (recency changes in place)."""

    __slots__ = ("bundle", "cost", "last_hit", "origin", "value", "written_at")

    def __init__(
        self,
        value: bytes,
        origin: int,
        cost: float | None,
        bundle: BundleRef | None,
        written_at: float | None = None,
    ) -> None:
        self.value = value
        self.origin = origin
        self.written_at = wall_clock() if written_at is None else written_at
        self.cost = cost
        self.bundle = bundle
        self.last_hit: int | None = None


Rows = dict[bytes, _Row]


@final
class MemoryTable:
    """Every namespace's entries in memory: what one in-memory environment holds."""

    __slots__ = ("_bundle_hits", "_bundle_ids", "_counters", "_origins", "namespaces")

    def __init__(self) -> None:
        self.namespaces: dict[str, Rows] = {}
        # Statistics, as the SQLite tables keep them (bundles numbered on sight).
        self._counters: dict[str, tuple[int, int, float]] = {}
        self._origins: dict[tuple[str, int], tuple[int, float]] = {}
        self._bundle_hits: dict[int, tuple[int, float]] = {}
        self._bundle_ids: dict[BundleRef, int] = {}

    def _resolve(self, batch: Batch) -> Resolved:
        by_origin: dict[tuple[str, int], tuple[int, float]] = {}
        by_bundle: dict[int, tuple[int, float]] = {}
        for pending in batch:
            rows = self.namespaces.get(pending.namespace, {})
            for key, n in pending.hits().items():
                row = rows.get(key)
                origin = Origin.LOCAL if row is None else row.origin
                saved = n * (row.cost or 0.0) if row is not None else 0.0
                _add(by_origin, (pending.namespace, int(origin)), n, saved)
                if row is not None and row.origin == Origin.IMPORTED and row.bundle is not None:
                    ident = self._bundle_ids.setdefault(row.bundle, len(self._bundle_ids) + 1)
                    _add(by_bundle, ident, n, saved)
        return Resolved(by_origin=by_origin, by_bundle=by_bundle)

    def flush_statistics(self, batch: Batch) -> None:
        """Add a batch of counts, as `SqliteDatabase.flush_statistics` does."""
        resolved = self._resolve(batch)
        for pending in batch:
            misses, computes, seconds = self._counters.get(pending.namespace, (0, 0, 0.0))
            self._counters[pending.namespace] = (
                misses + pending.misses,
                computes + pending.computes,
                seconds + pending.compute_seconds,
            )
            self.touch(pending.namespace, pending.hits())
        for origin_key, (hits, saved) in resolved.by_origin.items():
            _add(self._origins, origin_key, hits, saved)
        for ident, (hits, saved) in resolved.by_bundle.items():
            _add(self._bundle_hits, ident, hits, saved)

    def statistics(self, pending: Batch) -> EnvironmentStatistics:
        for rows in self.namespaces.values():
            for row in rows.values():
                if row.bundle is not None:
                    self._bundle_ids.setdefault(row.bundle, len(self._bundle_ids) + 1)
        entries: dict[int, int] = {}
        for rows in self.namespaces.values():
            for row in rows.values():
                if row.origin == Origin.IMPORTED and row.bundle is not None:
                    ident = self._bundle_ids[row.bundle]
                    entries[ident] = entries.get(ident, 0) + 1
        bundles = sorted(
            (ident, ref.name, ref.digest, entries.get(ident, 0))
            for ref, ident in self._bundle_ids.items()
        )
        bundles.sort(key=lambda b: (b[1], b[0]))
        totals = [(s.namespace, s.entries, s.bytes) for s in self.summaries()]
        return assemble(
            totals,
            self._counters,
            self._origins,
            bundles,
            self._bundle_hits,
            pending,
            self._resolve(pending),
        )

    def summaries(self) -> list[NamespaceSummary]:
        return [_summarise(name, rows) for name, rows in sorted(self.namespaces.items()) if rows]

    def insert_imported(
        self,
        namespace: str,
        entries: list[CarryingEntry],
        bundle: BundleRef | None,
    ) -> int:
        """As `SqliteDatabase.insert_imported`: how many entries were stored."""
        rows = self.namespaces.setdefault(namespace, {})
        stored = 0
        now = wall_clock()
        for key, value, written_at, cost in entries:
            written_at = as_of(written_at, now)
            outcome = _apply(rows, key, value, int(Origin.IMPORTED), cost, bundle, written_at)
            if isinstance(outcome, Stored):
                stored += 1
        return stored

    def touch(self, namespace: str, keys: Iterable[bytes]) -> int:
        """Record hits, as `SqliteDatabase.touch` does (coarse, for eviction order)."""
        now = int(wall_clock())
        stamp = now - now % HIT_GRANULARITY
        rows = self.namespaces.get(namespace, {})
        changed = 0
        for key in keys:
            row = rows.get(check_key(key))
            if row is not None and (row.last_hit is None or row.last_hit < stamp):
                row.last_hit = stamp
                changed += 1
        return changed

    def purge_bundle(self, digest_or_name: str) -> int:
        """Delete the entries still imported from that bundle (by digest or name)."""
        removed = 0
        for rows in self.namespaces.values():
            doomed = [
                key
                for key, row in rows.items()
                if row.origin == Origin.IMPORTED
                and row.bundle is not None
                and digest_or_name
                in (row.bundle.digest, row.bundle.name, row.bundle.digest.partition(":")[2])
            ]
            for key in doomed:
                del rows[key]
            removed += len(doomed)
        return removed

    def gc(
        self,
        *,
        max_bytes: int | None = None,
        older_than: float | None = None,
        keep_versions: int | None = None,
    ) -> int:
        """The same eviction as `SqliteDatabase.gc`, over the dicts."""
        removed = 0
        if keep_versions is not None:
            groups: dict[tuple[str, str], list[tuple[float, str]]] = {}
            for namespace, rows in self.namespaces.items():
                if rows:
                    parsed = Namespace.raw(namespace)
                    newest = max(r.written_at for r in rows.values())
                    groups.setdefault((parsed.name, parsed.path), []).append((newest, namespace))
            for versions in groups.values():
                versions.sort(reverse=True)
                for _, namespace in versions[keep_versions:]:
                    removed += len(self.namespaces.pop(namespace))
        if older_than is not None:
            cutoff = wall_clock() - older_than
            for rows in self.namespaces.values():
                doomed = [k for k, r in rows.items() if max(r.written_at, r.last_hit or 0) < cutoff]
                for key in doomed:
                    del rows[key]
                removed += len(doomed)
        if max_bytes is not None:
            removed += self._evict_to(max_bytes)
        return removed

    def _evict_to(self, max_bytes: int) -> int:
        everything = [
            (row.last_hit if row.last_hit is not None else -1, row.written_at, rows, key)
            for rows in self.namespaces.values()
            for key, row in rows.items()
        ]
        excess = sum(len(key) + len(rows[key].value) for _, _, rows, key in everything)
        excess -= max_bytes
        removed = 0
        everything.sort(key=lambda item: (item[0], item[1]))
        for _, _, rows, key in everything:
            if excess <= 0:
                break
            excess -= len(key) + len(rows.pop(key).value)
            removed += 1
        return removed


def _add(into: dict[T, tuple[int, float]], key: T, hits: int, saved: float) -> None:
    old_hits, old_saved = into.get(key, (0, 0.0))
    into[key] = (old_hits + hits, old_saved + saved)


def _summarise(namespace: str, rows: Rows) -> NamespaceSummary:
    size = sum(len(k) + len(r.value) for k, r in rows.items())
    return NamespaceSummary(namespace=namespace, entries=len(rows), bytes=size)


def _apply(
    rows: Rows,
    key: bytes,
    value: bytes,
    origin: int,
    cost: float | None = None,
    bundle: BundleRef | None = None,
    written_at: float | None = None,
) -> Insertion:
    existing = rows.get(key)
    if existing is None or may_replace(existing.origin, origin):
        row = _Row(value, origin, cost, bundle, written_at)
        if existing is not None:
            row.last_hit = existing.last_hit
        rows[key] = row
        return Stored()
    return Conflict(existing.value)


@final
class MemoryStorage(Storage):
    """A namespace held in a dict; the same contract as the SQLite storage."""

    __slots__ = ("_namespace", "_table")

    def __init__(self, namespace: Namespace | str, *, table: MemoryTable | None = None) -> None:
        self._namespace = str(Namespace.coerce(namespace))
        self._table = MemoryTable() if table is None else table

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def _rows(self) -> Rows:
        return self._table.namespaces.setdefault(self._namespace, {})

    async def get(self, key: bytes) -> bytes | None:
        check_key(key)
        await checkpoint()
        found = self._rows.get(key)
        return None if found is None else found.value

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        wanted = [check_key(k) for k in keys]
        await checkpoint()
        rows = self._rows
        return {k: rows[k].value for k in wanted if k in rows}

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
        written_at = as_of(believed(written_at, WRITTEN_AT_LIMIT), wall_clock())
        await checkpoint()
        return _apply(self._rows, key, value, int(origin), cost, None, written_at)

    async def insert_many(
        self,
        items: InsertItems,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        bundle: BundleRef | None = None,
    ) -> InsertSummary:
        cost = check_cost(cost)
        bundle = check_bundle(bundle, Origin(origin))
        if isinstance(items, AsyncIterable):
            pairs = [check_item(item) async for item in items]
        else:
            pairs = [check_item(item) for item in items]
        await checkpoint()
        stored = 0
        rows = self._rows
        for key, value in pairs:
            if isinstance(_apply(rows, key, value, int(origin), cost, bundle), Stored):
                stored += 1
        return InsertSummary(stored=stored, conflict=len(pairs) - stored, failed=0)

    async def info(self, key: bytes) -> EntryInfo | None:
        check_key(key)
        await checkpoint()
        row = self._rows.get(key)
        if row is None:
            return None
        bundle = row.bundle if row.origin == Origin.IMPORTED else None
        return EntryInfo(
            origin=Origin(row.origin), written_at=row.written_at, cost=row.cost, bundle=bundle
        )

    async def touch(self, keys: Iterable[bytes]) -> int:
        wanted = [check_key(k) for k in keys]
        await checkpoint()
        return self._table.touch(self._namespace, wanted)

    async def replace(
        self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL, *, cost: float | None = None
    ) -> Stored | Failed:
        check_key(key)
        check_value(value)
        cost = check_cost(cost)
        await checkpoint()
        self._rows[key] = _Row(value, int(origin), cost, None)
        return Stored()

    async def scan(
        self, batch_size: int = DEFAULT_SCAN_BATCH
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        check_batch_size(batch_size)
        rows = self._rows
        for key in sorted(rows):
            await checkpoint()
            found = rows.get(key)
            if found is not None:
                yield key, found.value

    async def purge(self) -> Purged | Failed:
        await checkpoint()
        rows = self._table.namespaces.pop(self._namespace, {})
        return Purged(len(rows))

    async def purge_key(self, key: bytes) -> Purged | Failed:
        check_key(key)
        await checkpoint()
        return Purged(0 if self._rows.pop(key, None) is None else 1)

    async def summary(self) -> NamespaceSummary:
        await checkpoint()
        return _summarise(self._namespace, self._table.namespaces.get(self._namespace, {}))

    def describe(self) -> str:
        return f"memory [{self._namespace}]"

    async def explain(self, key: bytes | None = None) -> Explanation:
        if key is not None:
            check_key(key)
        await checkpoint()
        namespaces = self._table.namespaces

        def holding(names: list[str], key: bytes) -> set[str]:
            return {name for name in names if key in namespaces.get(name, {})}

        counts = [(name, len(rows)) for name, rows in namespaces.items()]
        return explain(counts, self._namespace, key, holding)

    async def origin_of(self, key: bytes) -> Origin | None:
        """The origin of the stored value, or `None` (for tests and diagnostics)."""
        await checkpoint()
        found = self._rows.get(check_key(key))
        return None if found is None else Origin(found.origin)
