"""Whether the cache pays off: hits, misses and seconds saved, counted cheaply, kept for good.

A hit must stay a dict lookup, so a store never writes per hit and never
even resolves what a hit was worth: it appends the key it served to a list
(one C call), and counts misses and computations in plain integers. Every
few seconds, and when a store or its environment closes, the lists and
integers are drained into one batch and handed to the environment's storage,
which resolves each hit key against its entry (origin, recorded `cost`, the
bundle it came from) and adds the counts to the database in one transaction
of UPSERT increments, so counts from several processes add up and survive
restarts. The same batch records the hit keys' recency, for eviction.

Counters belong to the environment, one per namespace, not to a store: a
store that is dropped without being closed leaves its counts with the
environment, which flushes them on close.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import NamedTuple, cast, final

import anyio
import attrs

from warmenv.persistence.codec import JsonCodec, _encode_str
from warmenv.persistence.storage import Origin

_JSON_KEYS: JsonCodec[str, object] = JsonCodec()

__all__ = [
    "Batch",
    "BundleStatistics",
    "Counters",
    "EnvironmentStatistics",
    "NamespaceStatistics",
    "Pending",
    "Recorder",
    "Resolved",
]

log = logging.getLogger("warmenv.statistics")

FLUSH_INTERVAL = 5.0
"""Seconds between background flushes (at most one write transaction per interval)."""


@attrs.frozen
class NamespaceStatistics:
    """One namespace: what it holds, and how its lookups went since counting began."""

    namespace: str
    entries: int
    bytes: int
    hits: int
    misses: int
    hits_by_origin: dict[Origin, int]
    """Hits by the origin of the entry served (an entry gone by the time the hit
    was recorded counts as `LOCAL`)."""
    computes: int
    compute_seconds: float
    saved_seconds: float
    """The recorded `cost` of every entry hit, added up: time the hits did not spend."""


@attrs.frozen
class BundleStatistics:
    """One imported bundle: its entries still imported here, and the hits they served."""

    name: str
    digest: str
    entries: int
    hits: int
    saved_seconds: float


@attrs.frozen
class EnvironmentStatistics:
    """Every namespace and every imported bundle of an environment, with their counts."""

    namespaces: list[NamespaceStatistics]
    bundles: list[BundleStatistics]

    @property
    def hits(self) -> int:
        return sum(n.hits for n in self.namespaces)

    @property
    def misses(self) -> int:
        return sum(n.misses for n in self.namespaces)

    @property
    def saved_seconds(self) -> float:
        return sum(n.saved_seconds for n in self.namespaces)


class Pending(NamedTuple):
    """One namespace's counts taken from memory, not yet in the database: a row of a `Batch`.

    Built only where a namespace at a time is wanted (the in-memory storage,
    `statistics()`, a failed flush putting counts back); SQLite's flush reads
    the batch's columns.
    """

    namespace: str
    served: list[bytes | str]
    """The keys stores served, one per hit, as the stores hold them (see `Counters`)."""
    misses: int = 0
    computes: int = 0
    compute_seconds: float = 0.0

    def counted(self) -> list[tuple[bytes, int]]:
        """Each key served, encoded, with how many times it was served.

        A key a JSON store served both as its `str` and as its encoding (the
        read-through path holds the latter) comes twice: adding up, as SQL
        and `hits()` do, makes it one.
        """
        params = hit_params(Batch.of([self]))  # keys as bytearray (no `text`)
        pairs = zip(params[1::3], params[2::3], strict=True)
        return [(bytes(cast(bytearray, key)), cast(int, n)) for key, n in pairs]

    def hits(self) -> dict[bytes, int]:
        """Each hit key, encoded, with how many times it was served."""
        hits: dict[bytes, int] = {}
        for key, n in self.counted():
            hits[key] = hits.get(key, 0) + n
        return hits


@final
class Batch:
    """Every namespace's counts taken from memory in one drain, as columns.

    Columns rather than an object per namespace: a drain runs on the event
    loop, and with 10,000 namespaces, 20,000 objects (a tuple and a list
    each) made it slow and, as they lived through the flush, brought on the
    cyclic garbage collector's passes (a full one takes tens of milliseconds
    in a large process). Here a drain appends to six lists.
    """

    __slots__ = ("compute_seconds", "computes", "ends", "misses", "namespaces", "served")

    def __init__(self) -> None:
        self.namespaces: list[str] = []
        self.served: list[bytes | str] = []
        """Every namespace's served keys, one per hit, one namespace after the other."""
        self.ends: list[int] = []
        """Where each namespace's keys end in `served` (they start where the last ended)."""
        self.misses: list[int] = []
        self.computes: list[int] = []
        self.compute_seconds: list[float] = []

    @classmethod
    def of(cls, pending: Iterable[Pending]) -> Batch:
        batch = cls()
        for p in pending:
            batch.add(p.namespace, p.served, p.misses, p.computes, p.compute_seconds)
        return batch

    def add(
        self, namespace: str, served: list[bytes | str], misses: int, computes: int, seconds: float
    ) -> None:
        self.namespaces.append(namespace)
        self.served += served
        self.ends.append(len(self.served))
        self.misses.append(misses)
        self.computes.append(computes)
        self.compute_seconds.append(seconds)

    def __len__(self) -> int:
        return len(self.namespaces)

    def __iter__(self) -> Iterator[Pending]:
        start = 0
        for i, end in enumerate(self.ends):
            yield Pending(
                self.namespaces[i],
                self.served[start:end],
                self.misses[i],
                self.computes[i],
                self.compute_seconds[i],
            )
            start = end


@attrs.frozen
class Resolved:
    """Pending hits resolved against their entries, ready to be added up."""

    by_origin: dict[tuple[str, int], tuple[int, float]]
    """(namespace, origin) -> (hits, saved seconds)."""
    by_bundle: dict[int, tuple[int, float]]
    """A `bundles` row id -> (hits, saved seconds)."""


@final
class Counters:
    """One namespace's counts in this process, between flushes.

    `hits` is appended to on the hit path (list.append is atomic, so a thread
    answering hits from memory may append while the event loop drains).
    """

    __slots__ = ("compute_seconds", "computes", "hits", "misses", "namespace", "recorder")

    def __init__(self, namespace: str, recorder: Recorder) -> None:
        self.namespace = namespace
        self.recorder = recorder
        # What stores served: encoded keys, or a JSON store's str keys as they
        # were asked for (not encoded on the hit path; encoded when drained).
        self.hits: list[bytes | str] = []
        self.misses = 0
        self.computes = 0
        self.compute_seconds = 0.0

    def computed(self, seconds: float) -> None:
        """A value was computed, taking `seconds` (its askers count their misses)."""
        self.computes += 1
        self.compute_seconds += seconds

    def drain(self, batch: Batch) -> None:
        """Move the counts so far (leaving zeros) into `batch`, if there are any.

        Only copies: counting and encoding the hit keys is left to the
        writer (`hit_params`), off the event loop.
        """
        hits = self.hits
        n = len(hits)
        if not (n or self.misses or self.computes):
            return
        # Copy then delete the same prefix: an append from another thread in
        # between lands after it and is kept for the next drain.
        batch.add(self.namespace, hits[:n], self.misses, self.computes, self.compute_seconds)
        del hits[:n]
        self.misses = self.computes = 0
        self.compute_seconds = 0.0

    def restore(self, pending: Pending) -> None:
        """Put counts back after a flush that failed, so none is lost."""
        self.hits.extend(pending.served)
        self.misses += pending.misses
        self.computes += pending.computes
        self.compute_seconds += pending.compute_seconds

    async def flush(self) -> None:
        """Flush the environment's counts (every namespace's: one transaction for all)."""
        await self.recorder.flush()


Flush = Callable[[Batch], Awaitable[bool]]


@final
class Recorder:
    """An environment's counters, one per namespace, and the flush that empties them.

    `write` stores a batch (returns False if it could not: the counts are
    then kept for the next flush). Flushes are serialised by a lock, so a
    store's close and the background flush never write the same counts twice.
    """

    __slots__ = ("_counters", "_lock", "_write", "enabled")

    def __init__(self, write: Flush, *, enabled: bool = True) -> None:
        self._counters: dict[str, Counters] = {}
        self._write = write
        self._lock = anyio.Lock()
        self.enabled = enabled

    def counters(self, namespace: str) -> Counters | None:
        """The counters a store of `namespace` adds to (`None` when counting is off)."""
        if not self.enabled:
            return None
        found = self._counters.get(namespace)
        if found is None:
            found = self._counters[namespace] = Counters(namespace, self)
        return found

    def drain(self) -> Batch:
        """Take every namespace's counts (see `Counters.drain`), on the event loop."""
        batch = Batch()
        for counters in self._counters.values():
            counters.drain(batch)
        return batch

    async def flush(self) -> bool:
        """Write every namespace's counts so far; False if they had to be kept for later."""
        async with self._lock:
            batch = self.drain()
            if not batch:
                return True
            written = False
            try:
                written = await self._write(batch)
            finally:
                if not written:
                    self.restore(batch)
            return written

    def restore(self, batch: Batch) -> None:
        for pending in batch:
            counters = self._counters.get(pending.namespace)
            if counters is None:
                counters = self._counters[pending.namespace] = Counters(pending.namespace, self)
            counters.restore(pending)

    def pending(self) -> Batch:
        """A copy of the counts not yet flushed, left in place (for `statistics()`)."""
        batch = self.drain()
        self.restore(batch)
        return batch

    async def run(self, interval: float = FLUSH_INTERVAL) -> None:
        """Flush every `interval` seconds, for ever (a background task; cancel to stop)."""
        while True:
            await anyio.sleep(interval)
            try:
                await self.flush()
            except Exception as exc:  # a background flush never takes the application down
                log.warning("flushing statistics failed, kept for the next flush: %s", exc)


def assemble(
    totals: list[tuple[str, int, int]],
    counters: dict[str, tuple[int, int, float]],
    origins: dict[tuple[str, int], tuple[int, float]],
    bundles: list[tuple[int, str, str, int]],
    bundle_hits: dict[int, tuple[int, float]],
    pending: Batch,
    resolved: Resolved,
) -> EnvironmentStatistics:
    """Stored counts plus this process's pending ones, as the public value classes.

    `totals`: (namespace, entries, bytes); `counters`: namespace -> (misses,
    computes, compute seconds); `origins`: (namespace, origin) -> (hits,
    saved); `bundles`: (id, name, digest, entries still imported).
    """
    counts = dict(counters)
    for p in pending:
        misses, computes, seconds = counts.get(p.namespace, (0, 0, 0.0))
        counts[p.namespace] = (
            misses + p.misses,
            computes + p.computes,
            seconds + p.compute_seconds,
        )
    by_origin = dict(origins)
    for key, (hits, saved) in resolved.by_origin.items():
        old_hits, old_saved = by_origin.get(key, (0, 0.0))
        by_origin[key] = (old_hits + hits, old_saved + saved)
    per_bundle = dict(bundle_hits)
    for ident, (hits, saved) in resolved.by_bundle.items():
        old_hits, old_saved = per_bundle.get(ident, (0, 0.0))
        per_bundle[ident] = (old_hits + hits, old_saved + saved)

    sizes = {namespace: (entries, size) for namespace, entries, size in totals}
    names = sorted(set(sizes) | set(counts) | {namespace for namespace, _ in by_origin})
    hit_origins: dict[str, dict[Origin, tuple[int, float]]] = {}
    for (namespace, origin), value in by_origin.items():
        hit_origins.setdefault(namespace, {})[_origin(origin)] = value
    namespaces = []
    for namespace in names:
        entries, size = sizes.get(namespace, (0, 0))
        misses, computes, seconds = counts.get(namespace, (0, 0, 0.0))
        origin_counts = hit_origins.get(namespace, {})
        namespaces.append(
            NamespaceStatistics(
                namespace=namespace,
                entries=entries,
                bytes=size,
                hits=sum(h for h, _ in origin_counts.values()),
                misses=misses,
                hits_by_origin={o: h for o, (h, _) in sorted(origin_counts.items())},
                computes=computes,
                compute_seconds=seconds,
                saved_seconds=sum(s for _, s in origin_counts.values()),
            )
        )
    bundle_list = [
        BundleStatistics(
            name=name,
            digest=digest,
            entries=entries,
            hits=per_bundle.get(ident, (0, 0.0))[0],
            saved_seconds=per_bundle.get(ident, (0, 0.0))[1],
        )
        for ident, name, digest, entries in bundles
    ]
    return EnvironmentStatistics(namespaces=namespaces, bundles=bundle_list)


def hit_params(batch: Batch, *, text: bool = False) -> list[int | str | bytearray]:
    """Every key a batch served as flat parameters: namespace's row, encoded key, times served.

    Flat (three items a key) rather than a tuple a key: a flush of 10,000
    namespaces builds these in its write transaction, and each tuple would
    live through it, counted by the cyclic garbage collector towards its
    next pass. Keys go as `bytearray`, which SQLite stores and compares as
    the same BLOB as `bytes`: the sqlite3 module binds a `bytearray`
    directly but passes `bytes` through its adapter lookup first, several
    times slower, 20,000 times in such a flush. With `text`, a `str` key
    whose encoding is ASCII goes as that `str`, cheaper still (no copy): the
    SQL casts it to the BLOB of its bytes, which are its encoding in a file
    whose text is UTF-8 (the caller's to know). A key served both as a
    `str` and as its encoding comes twice (see `Pending.counted`).
    """
    params: list[int | str | bytearray] = []
    add = params.extend
    encode, blob = _encode_str, bytearray
    served = batch.served
    start = 0
    for i, end in enumerate(batch.ends):
        keys = served[start:end]
        start = end
        counts: dict[bytes | str, int]
        if len(keys) > 64:
            counts = Counter(keys)  # counted in C
        else:  # a Counter's set-up costs more than a few keys
            counts = {}
            get = counts.get
            for key in keys:
                counts[key] = get(key, 0) + 1
        first = len(params)
        try:  # a JsonCodec's encoding of a str key, inlined
            for key, n in counts.items():
                if isinstance(key, bytes):
                    add((i, blob(key), n))
                else:
                    encoded = encode(key)
                    add((i, encoded if text and encoded.isascii() else blob(encoded, "utf-8"), n))
        except UnicodeEncodeError:  # a lone surrogate: the codec's own path says why
            del params[first:]
            for key, n in counts.items():
                add((i, blob(_encoded(key)), n))
    return params


def _encoded(key: bytes | str) -> bytes:
    return key if isinstance(key, bytes) else _JSON_KEYS.encode_key(key)


def _origin(value: int) -> Origin:
    try:
        return Origin(value)
    except ValueError:
        return Origin.LOCAL
