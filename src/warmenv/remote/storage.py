"""The shared tier behind a local storage: a fleet's warm state, as one `Storage`.

The local database stays the first tier and the truth for this machine; Redis
is a second tier that only ever saves work. A local miss asks Redis, and a
value found there is recorded locally with origin `REMOTE` (which replaces
nothing, and any local value replaces it). A value computed here (origin
`LOCAL`) is published if Redis has none for the key: `SET key value NX` (in a
script that also announces the value, `warmenv.remote.wire`) is the insert
rule applied server-side in one atomic step, because everything in Redis was
published as `LOCAL` and `may_replace(LOCAL, LOCAL)` is false, so the first
writer fleet-wide wins. A value is bytes handed to the store's codec, never
unpickled, and it carries what its entry carries in a bundle, when it was
written and what it cost (`warmenv.persistence.carried`, whose rules decide
what is believed), so that hits on it count the time they saved on every host.

A purge of one key (`purge_key`) deletes the fleet's copy too: a value worth
purging here (wrong, or made by a bad build) would otherwise come back from
Redis at the next lookup, on this host and on every host that has not fetched
it yet. A purge of a namespace stays local: it would be a scan of the whole
server, and one host's clean-up must not make the whole fleet recompute.

A remote hit costs the caller one round trip: the local copy of the fetched
value is written behind it (`warmenv.remote.backfill`: bounded, in batches,
written on close), served from the queue until it is written, and every
operation but a lookup waits for the queue first. A caller that expects a
miss here (`get_expecting_miss`: a store that loaded the whole namespace
and does not hold the key) asks Redis at once, beside the local read rather
than after it; the local value, if there is one, still wins.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, final

from warmenv.persistence.carried import CarryingEntry
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
    check_item,
    check_key,
    check_value,
    wall_clock,
)

if TYPE_CHECKING:
    from warmenv.persistence.arrivals import Arrivals
    from warmenv.persistence.explain import Explanation
    from warmenv.remote.tier import RemoteTier
    from warmenv.remote.wire import RemoteValue

__all__ = ["RemoteStorage"]


@final
class RemoteStorage(Storage):
    """A local storage with a shared tier behind it (see the module docstring)."""

    __slots__ = ("_local", "_namespace", "_tier")

    def __init__(self, local: Storage, tier: RemoteTier) -> None:
        self._local = local
        self._tier = tier
        self._namespace = local.namespace

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def local(self) -> Storage:
        """The first tier, this machine's storage."""
        return self._local

    @property
    def tier(self) -> RemoteTier:
        """The shared tier."""
        return self._tier

    async def get(self, key: bytes) -> bytes | None:
        queued = self._tier.backfill.pending(self._namespace, check_key(key))
        if queued is not None:
            return queued
        value = await self._local.get(key)
        if value is not None:
            return value
        return await self._backfill(key)

    async def get_expecting_miss(self, key: bytes) -> bytes | None:
        """`get`, asking Redis beside the local read rather than after it (see the module).

        The local read is begun on the local storage's worker (`start_get`)
        and Redis is asked meanwhile, on the caller's task: a remote hit
        spawns no task.
        """
        queued = self._tier.backfill.pending(self._namespace, check_key(key))
        if queued is not None:
            return queued
        local = self._local.start_get(key)
        fetched = await self._tier.fetch(self._namespace, key)
        value = await local.result()
        if value is not None:
            return value
        return None if fetched is None else await self._record(key, fetched)

    def get_blocking(self, key: bytes) -> bytes | None:
        # The local tier only: a miss here is `None`, and the caller then awaits
        # `get` on its event loop, which asks Redis there (within the tier's
        # timeout and backoff). Asking Redis from this thread would need a
        # client of its own per thread, or a wait on the loop thread anyway.
        queued = self._tier.backfill.pending(self._namespace, check_key(key))
        return queued if queued is not None else self._local.get_blocking(key)

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        keys = [check_key(key) for key in keys]
        await self._tier.backfill.settle()
        found = await self._local.get_many(keys)
        for key in keys:
            if key not in found:
                value = await self._backfill(key)
                if value is not None:
                    found[key] = value
        return found

    async def insert_fetched(self, entries: list[CarryingEntry]) -> InsertSummary:
        await self._tier.backfill.settle()
        return await self._local.insert_fetched(entries)

    async def insert(
        self,
        key: bytes,
        value: bytes,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        written_at: float | None = None,
    ) -> Insertion:
        await self._tier.backfill.settle()
        if origin == Origin.LOCAL and written_at is None:
            written_at = wall_clock()  # one time, here and carried: the same entry
        result = await self._local.insert(key, value, origin, cost=cost, written_at=written_at)
        if origin == Origin.LOCAL and not isinstance(result, Conflict):
            # A write that failed locally (read-only disk) still helps the fleet.
            await self._tier.publish(self._namespace, key, value, cost=cost, written_at=written_at)
        return result

    async def insert_many(
        self,
        items: InsertItems,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        bundle: BundleRef | None = None,
    ) -> InsertSummary:
        await self._tier.backfill.settle()
        if origin != Origin.LOCAL:
            return await self._local.insert_many(items, origin, cost=cost, bundle=bundle)
        pairs: list[tuple[bytes, bytes]] = []
        if isinstance(items, Iterable):
            pairs.extend(check_item(item) for item in items)
        else:
            pairs.extend([check_item(item) async for item in items])
        summary = await self._local.insert_many(pairs, origin, cost=cost, bundle=bundle)
        if summary.stored:
            for key, value in pairs:
                await self._tier.publish(self._namespace, key, value, cost=cost)
        return summary

    async def replace(
        self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL, *, cost: float | None = None
    ) -> Stored | Failed:
        await self._tier.backfill.settle()
        result = await self._local.replace(key, value, origin, cost=cost)
        if origin == Origin.LOCAL:
            await self._tier.publish(self._namespace, key, value, cost=cost)
        return result

    async def scan(
        self, batch_size: int = DEFAULT_SCAN_BATCH
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        await self._tier.backfill.settle()
        rows = self._local.scan(batch_size)
        try:
            async for row in rows:
                yield row
        finally:
            if isinstance(rows, AsyncGenerator):
                await rows.aclose()

    def scan_with_info(
        self, batch_size: int = DEFAULT_SCAN_BATCH
    ) -> AsyncIterator[tuple[bytes, bytes, EntryInfo]]:
        return self._local.scan_with_info(batch_size)

    async def purge(self) -> Purged | Failed:
        await self._tier.backfill.settle()
        return await self._local.purge()

    async def purge_key(self, key: bytes) -> Purged | Failed:
        """Delete the entry here and the fleet's copy in Redis (see the module docstring).

        Redis first: a lookup here in between still finds the local entry,
        rather than fetching the copy back. The count is of this environment's
        entries. A copy that could not be deleted (Redis unavailable) is
        `Failed`, after the local entry is gone: it may come back from Redis,
        so the purge is worth repeating once Redis answers.
        """
        await self._tier.backfill.settle()
        unreached = await self._tier.purge(self._namespace, check_key(key))
        purged = await self._local.purge_key(key)
        if unreached is None or isinstance(purged, Failed):
            return purged
        return Failed(
            f"the entry is purged from {self._local.describe()}, but not the shared copy"
            f" from {self._tier.describe()} ({unreached}); purge the key again once it answers"
        )

    async def summary(self) -> NamespaceSummary:
        await self._tier.backfill.settle()
        return await self._local.summary()

    async def info(self, key: bytes) -> EntryInfo | None:
        await self._tier.backfill.settle()
        return await self._local.info(key)

    async def dated(self, keys: Iterable[bytes]) -> dict[bytes, tuple[bytes, float | None]]:
        # The local rows first (the queued copies settled into them); a key not
        # there is fetched, its value and its host's write time in one answer.
        keys = [check_key(key) for key in keys]
        await self._tier.backfill.settle()
        found = await self._local.dated(keys)
        for key in keys:
            if key not in found:
                fetched = await self._tier.fetch(self._namespace, key)
                if fetched is not None:
                    found[key] = (await self._record(key, fetched), fetched.written_at)
        return found

    async def touch(self, keys: Iterable[bytes]) -> int:
        await self._tier.backfill.settle()
        return await self._local.touch(keys)

    def describe(self) -> str:
        return f"{self._local.describe()}, shared through {self._tier.describe()}"

    def forget_on_close(self, held: HeldValues) -> None:
        self._local.forget_on_close(held)

    def arrivals(self) -> Arrivals | None:
        return self._local.arrivals()

    async def explain(self, key: bytes | None = None) -> Explanation | None:
        # The shared tier lists no namespaces: the local storage explains.
        await self._tier.backfill.settle()
        return await self._local.explain(key)

    @asynccontextmanager
    async def lease(self, key: bytes) -> AsyncIterator[bytes | None]:
        """One computation of `key` fleet-wide (see `RemoteTier.lease`).

        A value another host computed is recorded locally, as a fetched one is.
        """
        async with self._tier.lease(self._namespace, check_key(key)) as landed:
            yield None if landed is None else await self._record(key, landed)

    async def _backfill(self, key: bytes) -> bytes | None:
        fetched = await self._tier.fetch(self._namespace, check_key(key))
        if fetched is None:
            return None
        return await self._record(key, fetched)

    async def _record(self, key: bytes, fetched: RemoteValue) -> bytes:
        """The fetched value, its local copy queued (written behind the caller)."""
        value = check_value(fetched.value)
        entry = (key, value, fetched.written_at, fetched.cost)
        await self._tier.backfill.put(self._local, key, entry)
        return value
