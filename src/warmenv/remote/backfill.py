"""Values fetched from the shared tier, written to the local tier behind the caller.

A remote hit is one Redis round trip plus a local write; the caller needs
only the first. The value is already checked bytes (`wire.unframe`), so the
local copy can follow: `put` queues it and returns, and one flusher task
writes what is queued in batches (one transaction per namespace and batch,
after at most `LINGER` seconds or `BATCH` entries), on the local storage's
worker, while the caller goes on.

What keeps this safe:
- Bounded: at most `RemoteSettings.max_backfill` values wait. A caller
  that finds the queue full waits for a flush to make room (counted in
  `waits`), so a local tier slower than Redis slows callers down rather
  than growing the queue.
- Nothing a caller was promised is queued: what it computes and inserts is
  written before `insert` returns, as without a remote. Only copies of
  values Redis holds wait here, so a crash loses at most local copies that
  the next lookup fetches again.
- Never lost on close: `close` (the tier's exit, which comes before the
  environment closes its database) writes everything still queued.
- Read your writes: a queued value is served by the lookups that would
  otherwise miss locally (`pending`), and every other operation of the
  storage first waits for the queue to be written (`settle`), so a purge,
  a scan or a summary sees the local tier as if the write had not waited.
- A write that fails (a read-only or busy file) loses only the local copy,
  logged as any failed write is; the values stay in Redis.
- A fetched value replaces nothing (`Origin.REMOTE`), so a late write can
  never overwrite a value computed or imported here meanwhile: the insert
  rule keeps theirs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, final

import anyio
import attrs

from warmenv.persistence.carried import CarryingEntry

if TYPE_CHECKING:
    from warmenv.persistence.storage import Storage

__all__ = ["BATCH", "LINGER", "Backfill"]

log = logging.getLogger("warmenv.remote")

LINGER: Final = 0.005
"""Seconds the flusher waits after the first queued value for more to join its batch."""
BATCH: Final = 256
"""Values that make a batch without waiting out `LINGER`."""


@final
@attrs.define(eq=False, repr=False)
class Backfill:
    """The write-behind queue of one environment's fetched values (see the module docstring)."""

    bound: int
    _pending: dict[tuple[str, bytes], tuple[Storage, CarryingEntry]] = attrs.field(
        init=False, factory=dict
    )
    # The batch being written: still served by `pending`, still counted against the bound.
    _writing_now: dict[tuple[str, bytes], tuple[Storage, CarryingEntry]] = attrs.field(
        init=False, factory=dict
    )
    _queued: anyio.Event = attrs.field(init=False, factory=anyio.Event)
    _full: anyio.Event = attrs.field(init=False, factory=anyio.Event)
    _room: anyio.Event = attrs.field(init=False, factory=anyio.Event)
    # Taken without a checkpoint when free (anyio's opt-in): a flush runs shielded,
    # where the checkpoint could only yield, once per batch, for nothing.
    _writing: anyio.Lock = attrs.field(init=False, factory=lambda: anyio.Lock(fast_acquire=True))
    written: int = attrs.field(init=False, default=0)
    """Values written to the local tier so far (stored, or kept out by the insert rule)."""
    waits: int = attrs.field(init=False, default=0)
    """Callers that found the queue full and waited for a flush."""
    failed: int = attrs.field(init=False, default=0)
    """Values whose local write failed (they stay in Redis)."""

    def __len__(self) -> int:
        """Values queued or being written, not yet in the local tier."""
        return len(self._pending) + len(self._writing_now)

    def pending(self, namespace: str, key: bytes) -> bytes | None:
        """The queued value of `key`, or `None`. Safe from any thread (dict lookups)."""
        queued = self._pending.get((namespace, key)) or self._writing_now.get((namespace, key))
        return None if queued is None else queued[1][1]

    async def put(self, local: Storage, key: bytes, entry: CarryingEntry) -> None:
        """Queue `entry` (key, value, written_at, cost) for `local`; waits while it is full."""
        while len(self) >= self.bound:
            self.waits += 1
            self._full.set()
            if self._room.is_set():
                self._room = anyio.Event()
            await self._room.wait()
        self._pending[local.namespace, key] = (local, entry)
        self._queued.set()
        if len(self._pending) >= BATCH:
            self._full.set()

    async def settle(self) -> None:
        """Return once every value queued before the call is written (or failed)."""
        if self._pending or self._writing.locked():
            await self.flush()

    async def flush(self) -> None:
        """Write what is queued now, one transaction per namespace (a cancelled caller's
        batch is still written: the flush is shielded)."""
        with anyio.CancelScope(shield=True):
            async with self._writing:
                while self._pending:
                    self._writing_now, self._pending = self._pending, {}
                    try:
                        await self._write(self._writing_now)
                    finally:
                        self._writing_now = {}
                        self._room.set()

    async def run(self) -> None:
        """The flusher: write batches as values are queued, until cancelled."""
        while True:
            await self._queued.wait()
            self._queued = anyio.Event()
            with anyio.move_on_after(LINGER):
                await self._full.wait()
            self._full = anyio.Event()
            await self.flush()

    async def close(self) -> None:
        """Write everything still queued (shielded: closing never drops a value)."""
        await self.flush()

    async def _write(self, batch: dict[tuple[str, bytes], tuple[Storage, CarryingEntry]]) -> None:
        by_storage: dict[str, tuple[Storage, list[CarryingEntry]]] = {}
        for (namespace, _), (local, entry) in batch.items():
            by_storage.setdefault(namespace, (local, []))[1].append(entry)
        for local, entries in by_storage.values():
            try:
                summary = await local.insert_fetched(entries)
            except Exception as exc:  # a closed environment: nothing to write to any more
                log.warning(
                    "writing %d fetched values to %s failed: %s",
                    len(entries),
                    local.describe(),
                    exc,
                )
                self.failed += len(entries)
                continue
            self.written += summary.stored + summary.conflict
            self.failed += summary.failed
