"""Storage in process memory, under exactly the contract SQLite keeps.

It serves tests and the degraded mode of an environment whose directory
cannot be written. Every operation is a checkpoint taken before the state
changes, and the change itself never awaits, so cancellation leaves a call
either wholly applied or not applied at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import final

from anyio.lowlevel import checkpoint

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

__all__ = ["MemoryStorage", "MemoryTable"]

Rows = dict[bytes, tuple[bytes, int]]


@final
class MemoryTable:
    """Every namespace's entries in memory: what one in-memory environment holds."""

    __slots__ = ("namespaces",)

    def __init__(self) -> None:
        self.namespaces: dict[str, Rows] = {}

    def summaries(self) -> list[NamespaceSummary]:
        return [_summarise(name, rows) for name, rows in sorted(self.namespaces.items()) if rows]


def _summarise(namespace: str, rows: Rows) -> NamespaceSummary:
    size = sum(len(k) + len(v) for k, (v, _) in rows.items())
    return NamespaceSummary(namespace=namespace, entries=len(rows), bytes=size)


def _apply(rows: Rows, key: bytes, value: bytes, origin: int) -> Insertion:
    existing = rows.get(key)
    if existing is None or may_replace(existing[1], origin):
        rows[key] = (value, origin)
        return Stored()
    return Conflict(existing[0])


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
        return None if found is None else found[0]

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        wanted = [check_key(k) for k in keys]
        await checkpoint()
        rows = self._rows
        return {k: rows[k][0] for k in wanted if k in rows}

    async def insert(self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL) -> Insertion:
        check_key(key)
        check_value(value)
        await checkpoint()
        return _apply(self._rows, key, value, int(origin))

    async def insert_many(self, items: InsertItems, origin: Origin = Origin.LOCAL) -> InsertSummary:
        if isinstance(items, AsyncIterable):
            pairs = [check_item(item) async for item in items]
        else:
            pairs = [check_item(item) for item in items]
        await checkpoint()
        stored = 0
        rows = self._rows
        for key, value in pairs:
            if isinstance(_apply(rows, key, value, int(origin)), Stored):
                stored += 1
        return InsertSummary(stored=stored, conflict=len(pairs) - stored, failed=0)

    async def replace(
        self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL
    ) -> Stored | Failed:
        check_key(key)
        check_value(value)
        await checkpoint()
        self._rows[key] = (value, int(origin))
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
                yield key, found[0]

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

    async def origin_of(self, key: bytes) -> Origin | None:
        """The origin of the stored value, or `None` (for tests and diagnostics)."""
        await checkpoint()
        found = self._rows.get(check_key(key))
        return None if found is None else Origin(found[1])
