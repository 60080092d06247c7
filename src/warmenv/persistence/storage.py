"""The storage contract: what every backend of a namespace promises.

The insert rules live here, once, in `may_replace`, and every backend calls
it (SQLite registers it as an SQL function for its bulk paths): a value never
overwrites another of the same origin, a value computed here replaces one that
came from a bundle or from the shared tier (so a stale copy can never wedge an
application), and an imported or fetched value replaces nothing. The shared
tier applies the same rule server-side: everything in Redis was published as
`LOCAL`, and `LOCAL` never replaces `LOCAL`, so the first writer wins (`SET NX`).
Storage is a cache, so its failures are outcomes rather than exceptions: a
read that fails is a miss, a write that fails is `Failed`. Only programming errors raise.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeAlias, TypeVar

import attrs

from warmenv._errors import WarmenvError, require_number
from warmenv._text import is_utf8

if TYPE_CHECKING:  # explain.py builds on this module
    from warmenv.persistence.arrivals import Arrivals
    from warmenv.persistence.explain import Explanation

__all__ = [
    "AmbiguousBundleError",
    "BundleRef",
    "Conflict",
    "EntryInfo",
    "Failed",
    "HeldValues",
    "InsertItems",
    "InsertSummary",
    "Insertion",
    "NamespaceSummary",
    "Origin",
    "PendingGet",
    "Purged",
    "Storage",
    "Stored",
    "addressable",
    "bundles_to_purge",
    "may_replace",
    "names_bundle",
]

log = logging.getLogger("warmenv.storage")

DEFAULT_SCAN_BATCH = 1024

_clock = time.time


def wall_clock() -> float:
    """Unix seconds now: the one clock provenance, recency and gc read (tests replace it)."""
    return _clock()


class Origin(enum.IntEnum):
    """Where a stored value came from."""

    LOCAL = 0
    """Computed on this machine."""
    IMPORTED = 1
    """Copied in from a bundle."""
    REMOTE = 2
    """Fetched from the shared tier (Redis) after a local miss."""

    def __str__(self) -> str:
        """The origin's name as shown and as a JSON key: "local", "imported", "remote".

        An `IntEnum` shows as its number ("0"); the number is what is stored (`int(origin)`).
        """
        return self.name.lower()


def may_replace(existing: int, incoming: int) -> bool:
    """The insert rule: may a value of origin `incoming` replace one of `existing`?

    Only a local value replaces another, and only an imported or fetched one;
    equal origins never replace, and an imported or fetched value replaces nothing.
    """
    return incoming == Origin.LOCAL and existing != Origin.LOCAL


class _Outcome:
    """An insert's outcome, which is never read as a truth value.

    `if await store.insert(...)` would pass for a `Failed` write, so asking
    raises and says what to ask instead (as trio's `Event.__bool__` does).
    """

    __slots__ = ()

    def __bool__(self) -> NoReturn:
        raise TypeError(
            f"{type(self).__name__} cannot be used as a bool; test the outcome with"
            " isinstance(result, Stored) (or Conflict, Failed)"
        )


@attrs.frozen
class Stored(_Outcome):
    """The value is now in the storage."""


@attrs.frozen
class Conflict(_Outcome):
    """The storage kept the value it already had (someone got there first)."""

    existing: bytes


@attrs.frozen
class Failed(_Outcome):
    """Nothing was stored; `reason` says why (full disk, lock timeout, read-only file)."""

    reason: str


Insertion: TypeAlias = Stored | Conflict | Failed


@attrs.frozen
class Purged:
    """How many entries a purge removed."""

    count: int


@attrs.frozen
class BundleRef:
    """The bundle an imported entry came from: its manifest's name and its digest.

    `signer` (given to an import's writes, not read back by `info`) is the
    trusted key, as text, whose signature over the bundle was checked before
    it was imported, or None: the environment records it per digest
    (`Environment.bundle_signers`), for a restore that asks for signed code.
    """

    name: str
    digest: str
    signer: str | None = None


class AmbiguousBundleError(WarmenvError, ValueError):
    """A purge was given a name (or bare digest) that more than one imported bundle bears."""


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def digest(self) -> str: ...


_N = TypeVar("_N", bound=_Named)


def names_bundle(digest_or_name: str, bundle: _Named) -> bool:
    """Whether `digest_or_name` names `bundle`: its digest, with or without the algorithm
    prefix, or its manifest name."""
    return digest_or_name in (bundle.digest, bundle.name, bundle.digest.partition(":")[2])


def bundles_to_purge(
    digest_or_name: str, imported: Iterable[_N], *, where: str = "here"
) -> list[_N]:
    """The bundles a purge of `digest_or_name` takes, among those with entries still
    `imported` (`where`: the environment, for the message).

    A name two builds share (two digests) raises `AmbiguousBundleError`
    listing the digests: a quarantine must never take a good build with the
    bad one. The library's purge applies this in its transaction, and the
    CLI before its prompt, so both refuse alike.
    """
    found = [bundle for bundle in imported if names_bundle(digest_or_name, bundle)]
    digests = sorted({bundle.digest for bundle in found})
    if len(digests) > 1:
        raise AmbiguousBundleError(
            f"{digest_or_name!r} names {len(digests)} bundles imported {where} "
            f"({', '.join(digests)}); give the digest of the one to purge; nothing deleted"
        )
    return found


@attrs.frozen
class EntryInfo:
    """Where one entry came from, so a hit can be traced and what it saved known."""

    origin: Origin
    written_at: float | None
    """Unix seconds when it was stored here; None for entries older than schema 2."""
    cost: float | None
    """Seconds its computation took, when it was computed and timed; else None."""
    bundle: BundleRef | None
    """The bundle it was imported from, while it is still the imported value."""


@attrs.frozen
class InsertSummary:
    """The outcome of `insert_many`; the three counts add up to the items given."""

    stored: int
    conflict: int
    failed: int
    reason: str | None = None
    """Why the failed items failed, when any did."""


@attrs.frozen
class NamespaceSummary:
    """How many entries a namespace holds, and their size (keys plus values)."""

    namespace: str
    entries: int
    bytes: int
    text: bool = True
    """Whether the namespace is stored as text, as every store writes it. False for
    rows something else wrote with a namespace of another SQLite type (a BLOB, an
    INTEGER, REAL or NULL): `namespace` then holds its content read as text (a
    BLOB's bytes decoded as a text namespace's are, a NULL as `""`), and this flag
    alone says it is not text (a text namespace may hold the same characters)."""

    @property
    def addressable(self) -> bool:
        """Whether a store can address this namespace (`addressable`)."""
        return addressable(self.namespace, text=self.text)


def addressable(namespace: str, *, text: bool) -> bool:
    """Whether a namespace read from a file is one a store can address: non-empty UTF-8 text.

    False for a value of another SQLite type (`text` False), for text that is
    not UTF-8 (read with surrogates), and for the empty string (`Namespace.raw`
    refuses it): their rows are listed, left out of exports, and left alone by
    what works namespace by namespace (purge, gc's keep_versions).
    """
    return text and bool(namespace) and is_utf8(namespace)


InsertItems: TypeAlias = Iterable[tuple[bytes, bytes]] | AsyncIterable[tuple[bytes, bytes]]


class HeldValues(Protocol):
    """What a store holds in memory, as a storage sees it: something to empty on close."""

    def close(self) -> None:
        """Hold nothing from now on (every lookup then reaches the storage)."""
        ...


class PendingGet(Protocol):
    """A read `Storage.start_get` began: `get`'s answer, once awaited."""

    async def result(self) -> bytes | None:
        """The value, or `None` (a miss, or a read that failed), as `get` answers."""
        ...


@attrs.frozen
class _GetWhenAwaited:
    """`Storage.start_get`'s default: nothing begun, `get` when the answer is asked for."""

    storage: Storage
    key: bytes

    async def result(self) -> bytes | None:
        return await self.storage.get(self.key)


class Storage(Protocol):
    """Byte keys to byte values in one namespace, under the insert rules above.

    Failure contract: `get`, `get_many`, `scan` and `summary` treat a failing
    read as a miss (logged); every write returns `Failed` rather than raising.
    A closed environment or a key that is not `bytes` raises.
    """

    @property
    def namespace(self) -> str:
        """The full namespace string this storage is bound to."""
        ...

    async def get(self, key: bytes) -> bytes | None:
        """The value stored under `key`, or `None` (a miss, or a read that failed)."""
        ...

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        """The values of those `keys` that are stored; missing keys are left out."""
        ...

    async def get_expecting_miss(self, key: bytes) -> bytes | None:
        """`get` for a key the caller expects to be missing here, with the same answer.

        A store that loaded the whole namespace and does not hold `key` asks
        this way: a storage with a shared tier then asks it beside the local
        read rather than after it (`RemoteStorage`). This default is `get`.
        """
        return await self.get(key)

    def start_get(self, key: bytes) -> PendingGet:
        """`get` in two halves: begun now, its answer `await`ed later (`.result()`).

        For a caller with another wait to overlap with this read, and no task
        to spend on it: `RemoteStorage` asks Redis while a SQLite storage's
        worker reads (`warmenv._sqlite`'s `Connection.start`). An answer never
        awaited is dropped. This default begins nothing: the read is `get`,
        run when its answer is awaited.
        """
        return _GetWhenAwaited(self, key)

    def get_blocking(self, key: bytes) -> bytes | None:
        """The value under `key` read on the calling thread, a thread with no event loop.

        For `warmenv.blocking`, whose misses would otherwise cross to the
        event-loop thread. `None` means "not found here": not stored, a read
        that failed, or (this default) a storage that cannot read without its
        event loop; the caller then awaits `get` on that loop, which decides.
        Safe to call from any thread.
        """
        return None

    async def insert(
        self,
        key: bytes,
        value: bytes,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        written_at: float | None = None,
    ) -> Insertion:
        """Store `value` unless the rules keep the existing one (`Conflict`).

        `cost` is how many seconds computing `value` took, when known: hits on
        it then count as that much time saved. `written_at` is when a value
        that came from elsewhere (`REMOTE`) was first written, believed as a
        bundle's is (`warmenv.persistence.carried`): `None`, out of range or
        later than now is recorded as unknown (a miss for a store with a
        ttl), never as now. A `LOCAL` value without one was written now.
        """
        ...

    async def insert_many(
        self,
        items: InsertItems,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        bundle: BundleRef | None = None,
    ) -> InsertSummary:
        """Insert every item in one transaction: all of them are applied or none.

        `cost` applies to each item; `bundle` records where IMPORTED items came
        from (so `purge_bundle` can find them).
        """
        ...

    async def insert_fetched(
        self, entries: list[tuple[bytes, bytes, float | None, float | None]]
    ) -> InsertSummary:
        """Insert `(key, value, written_at, cost)` values fetched from the shared tier.

        Origin `REMOTE` (they replace nothing), each with what it carried, as
        `insert` records one; one transaction where the backend has them.
        This default inserts them one by one.
        """
        stored = conflict = failed = 0
        reason = None
        for key, value, written_at, cost in entries:
            result = await self.insert(key, value, Origin.REMOTE, cost=cost, written_at=written_at)
            if isinstance(result, Stored):
                stored += 1
            elif isinstance(result, Conflict):
                conflict += 1
            else:
                failed += 1
                reason = result.reason
        return InsertSummary(stored=stored, conflict=conflict, failed=failed, reason=reason)

    async def info(self, key: bytes) -> EntryInfo | None:
        """The provenance of the entry under `key`, or `None` if there is none."""
        ...

    async def dated(self, keys: Iterable[bytes]) -> dict[bytes, tuple[bytes, float | None]]:
        """Each of `keys` stored here: its value and write time (unix seconds; `None`: unknown).

        Keys not stored are left out; a read that fails leaves keys out
        (misses). What a store with a ttl reads instead of `get_many`
        (`warmenv.persistence._ttl`). The contract: the value and its time
        come from one read of the entry (one query, or one answer), so a
        replace in between cannot pair one entry's time with another's value.
        No default: `info` then `get` are two reads, and no check between
        them can tell a replaced entry from the one read first (a replace may
        carry the same provenance). A backend that cannot read them together
        delegates to one that can, or reads both in one transaction.
        """
        ...

    async def touch(self, keys: Iterable[bytes]) -> int:
        """Record hits on `keys`, for eviction's order; how many entries were updated.

        Coarse and meant to be batched (a store calls it with the keys it
        served since its last call): never once per hit. A failure counts 0.
        """
        ...

    async def replace(
        self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL, *, cost: float | None = None
    ) -> Stored | Failed:
        """Store `value` whatever is there (to repair a value that no longer decodes).

        `cost` is what computing the repaired value took, so that its hits still
        count the seconds they save.
        """
        ...

    def scan(self, batch_size: int = DEFAULT_SCAN_BATCH) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every entry in key order, `batch_size` at a time in memory."""
        ...

    def scan_with_info(
        self, batch_size: int = DEFAULT_SCAN_BATCH
    ) -> AsyncIterator[tuple[bytes, bytes, EntryInfo]]:
        """As `scan`, each entry with its provenance, the two read in the same query.

        What decides by provenance whether a value may be used (a restore
        under `require_signature`) must read this: a value from `scan` and a
        provenance from `info` are two reads, and an import between them
        makes them two entries' (an unsigned value, a signed one's origin).
        """
        ...

    async def purge(self) -> Purged | Failed:
        """Delete every entry of the namespace, in one transaction."""
        ...

    async def purge_key(self, key: bytes) -> Purged | Failed:
        """Delete one entry (`Purged(0)` if it was not there)."""
        ...

    async def summary(self) -> NamespaceSummary:
        """How many entries the namespace holds and their size."""
        ...

    def describe(self) -> str:
        """Where this storage keeps its entries, for messages and logs."""
        ...

    def __repr__(self) -> str:
        """`<SqliteStorage: SQLite /srv/envs/prod.db [app/1/k]>`: its class and `describe()`."""
        return f"<{type(self).__name__}: {self.describe()}>"

    async def explain(self, key: bytes | None = None) -> Explanation | None:
        """Why a lookup of `key` (of anything, for `None`) in this namespace may miss.

        The namespaces of the same environment that differ from this one only
        in some segments, nearest first, with their entry counts and whether
        they hold `key` (see `warmenv.persistence.explain`). `None` when the
        storage has no other namespaces to compare with (this default, for a
        storage of the application's own); a storage with a shared tier
        answers from its local one.
        """
        return None

    def forget_on_close(self, held: HeldValues) -> None:
        """Empty `held`, a store's values in memory, when this storage's environment closes.

        A store of a closed environment answers nothing from memory: its hit
        path checks nothing (a hit costs no check), so closing empties what
        it holds and every lookup reaches the storage, which raises
        `ClosedError`. Every `Store` registers here when it is made, however
        it was made (`env.store`, `Store.open(env.storage(ns))`, over the
        shared tier or not). This default: never (a storage that does not close).
        """
        return None

    def arrivals(self) -> Arrivals | None:
        """The imports into this storage's environment, announced batch by batch, or `None`.

        A store computing a key while an import runs takes the imported value
        if the import lands the key first (`warmenv.persistence.arrivals`).
        `None` (this default): nothing is imported behind the store's back.
        """
        return None

    def lease(self, key: bytes) -> AbstractAsyncContextManager[bytes | None]:
        """The right to compute `key` for the block, shared by every host of a fleet.

        Yields `None` when the caller should compute the value and insert it
        before the block ends, or the value another host stored meanwhile. A
        storage with no shared tier has no other host to wait for: it yields
        `None` at once (this default). With a remote, one host fleet-wide
        computes a key at a time (see `RemoteStorage.lease`).
        """
        return nullcontext()


def check_cost(cost: object) -> float | None:
    if cost is None:
        return None
    # Infinite is not a duration: it would read as "saved inf h" and break `--json`.
    if isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < math.inf:
        raise ValueError(f"cost is seconds (a finite number >= 0) or None, got {cost!r}")
    return float(cost)


def check_bundle(bundle: object, origin: Origin) -> BundleRef | None:
    if bundle is None:
        return None
    if not isinstance(bundle, BundleRef):
        raise TypeError(f"bundle must be a BundleRef or None, got {type(bundle).__name__}")
    if origin != Origin.IMPORTED:
        raise ValueError("only IMPORTED entries come from a bundle; pass origin=Origin.IMPORTED")
    return bundle


def check_key(key: object) -> bytes:
    if not isinstance(key, bytes):
        raise TypeError(f"storage keys are bytes, got {type(key).__name__}; encode it first")
    return key


def check_value(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"storage values are bytes, got {type(value).__name__}; encode it first")
    return value


def check_item(item: object) -> tuple[bytes, bytes]:
    if not isinstance(item, tuple) or len(item) != 2:
        raise TypeError(f"insert_many takes (key, value) pairs, got {item!r:.80}")
    return check_key(item[0]), check_value(item[1])


def check_batch_size(batch_size: int) -> int:
    """`batch_size` if it is a positive int; `TypeError` for another type (a bool too),
    `ValueError` for an int under 1."""
    rule = "batch_size must be a positive int"
    require_number(batch_size, rule, integral=True)
    if batch_size < 1:
        raise ValueError(f"{rule}, got {batch_size!r}")
    return batch_size
