"""Whether the cache pays off: hits, misses and seconds saved, counted cheaply, kept for good.

A hit must stay a dict lookup, so a store never writes per hit and never
even resolves what a hit was worth: it appends the key it served to a list
(one C call), and counts misses and computations in plain integers. Every
few seconds, and when a store or its environment closes, the lists and
integers are drained into one batch and handed to the environment's storage,
which resolves each hit key against its entry (origin, recorded `cost`, the
bundle it came from) and adds the counts to the database by UPSERT
increments, so counts from several processes add up and survive restarts.
The same batch records the hit keys' recency, for eviction.

A batch is written in slices of a bounded number of rows (`cut`), each its
own short transaction and its own call to the connection's worker: the
flush shares that one connection with every other storage call, so a miss
reading through waits behind one slice, never behind a whole flush of
10,000 namespaces. A namespace with more hit keys than a slice holds is
split across slices (its misses and computations go with its first part);
the parts add up, as counts from several processes do. A slice that fails
is put back in memory with everything after it, for the next flush; the
slices before it stay written.

Counters belong to the environment, one per namespace, not to a store: a
store that is dropped without being closed leaves its counts with the
environment, which flushes them on close.
"""

from __future__ import annotations

import enum
import logging
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import NamedTuple, cast, final

import anyio
import attrs

from warmenv.persistence.codec import JsonCodec, encode_str
from warmenv.persistence.storage import NamespaceSummary, Origin

_JSON_KEYS: JsonCodec[str, object] = JsonCodec()

__all__ = [
    "Batch",
    "BundleStatistics",
    "Counters",
    "Cursor",
    "EnvironmentStatistics",
    "ImportOutcome",
    "ImportRecord",
    "NamespaceStatistics",
    "Pending",
    "Recorder",
    "START",
    "Resolved",
    "Slice",
    "cut",
]

log = logging.getLogger("warmenv.statistics")

FLUSH_INTERVAL = 5.0
"""Seconds between background flushes (one flush per interval, written in short slices)."""

SLICE_ROWS = 1000
"""About this many rows (namespaces plus distinct hit keys; at most an eighth more) a slice.

Each slice is one transaction and one call to the connection's worker, so
this bounds how long another storage call waits behind a flush (see
docs/benchmarks.md for how it was chosen)."""

SLICE_SERVED = 50_000
"""At most this many served keys (hits, before they are counted) read by one slice.

A namespace hit very often on a few keys has few rows but a long list to
count: this bounds the counting a slice does."""


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
    """The recorded `cost` of each entry hit, added once per entry per process: the
    cold starts the hits avoided (a repeat hit in the same process saves nothing
    more; see docs/statistics.md for the clock `cost` is measured with)."""
    text: bool = True
    """Whether the namespace is stored as text, as every store writes it (see
    `NamespaceSummary.text`): False for rows something else wrote under a
    namespace of another SQLite type, whose content `namespace` holds as text."""
    hit_without_cost: int = 0
    """How many of its entries were hit (by any process) and have no recorded
    `cost` (inserted, or a compiler that records no compile time): what their
    hits saved is not known, and `saved_seconds` leaves it out."""


@attrs.frozen
class BundleStatistics:
    """One imported bundle: its entries still imported here, and the hits they served."""

    name: str
    digest: str
    entries: int
    """Its entries still imported here (not since overwritten, purged or evicted)."""
    hits: int
    """Every hit on them, repeats included."""
    saved_seconds: float
    """Their recorded `cost`, once per entry per process that hit it."""
    distinct_hits: int = 0
    """How many of `entries` were hit at least once (by any process)."""
    hit_without_cost: int = 0
    """How many of those have no recorded `cost`: `saved_seconds` leaves their hits out."""


class ImportOutcome(enum.Enum):
    """How a recorded import (a background warm-up) ended."""

    IMPORTED = "imported"
    """It ran to its end (`ImportRecord.imported` says how many entries it added)."""
    FAILED = "failed"
    """It stopped on an error (`ImportRecord.error`); what it committed before stays."""
    CANCELLED = "cancelled"
    """It was cancelled (the environment closed, the service stopped); whole batches stay."""


@attrs.frozen
class ImportRecord:
    """One import an environment recorded (a warm-up's outcome), kept with its statistics.

    The newest `IMPORT_RECORDS` are kept in the database, so `warmenv stats`
    in another process shows why a service started cold.
    """

    source: str
    """What was imported: a path, or a URL with its credentials hidden."""
    outcome: ImportOutcome
    at: float
    """When it ended, in unix seconds."""
    bundle: str | None = None
    """The bundle's manifest name, if it was read."""
    imported: int = 0
    skipped: int = 0
    failed: int = 0
    error: str | None = None
    """Why it failed, in one line (`None` unless `outcome` is `FAILED`)."""


IMPORT_RECORDS = 50
"""How many import records an environment keeps (the newest)."""


@attrs.frozen
class EnvironmentStatistics:
    """Every namespace and every imported bundle of an environment, with their counts."""

    namespaces: list[NamespaceStatistics]
    bundles: list[BundleStatistics]
    imports: list[ImportRecord] = attrs.field(factory=list)
    """The recorded imports (background warm-ups), newest first."""

    @property
    def hits(self) -> int:
        return sum(n.hits for n in self.namespaces)

    @property
    def misses(self) -> int:
        return sum(n.misses for n in self.namespaces)

    @property
    def saved_seconds(self) -> float:
        return sum(n.saved_seconds for n in self.namespaces)

    @property
    def saved_known(self) -> bool:
        """Whether every entry hit has a recorded cost, so `saved_seconds` is all they saved."""
        return not any(n.hit_without_cost for n in self.namespaces)


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
        """Each key served, encoded, once, with how many times it was served (see `cut`)."""
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

    @property
    def end(self) -> Cursor:
        """The cursor past the batch's last namespace: everything written."""
        return Cursor(len(self.namespaces), len(self.served))

    def written(self, cursor: Cursor) -> bool:
        """Whether a flush that reached `cursor` wrote the whole batch."""
        return cursor.namespace >= len(self.namespaces)

    def rest(self, start: Cursor) -> Batch:
        """What a flush that reached `start` has not written, as a batch of its own.

        A namespace cut at `start` keeps only its keys from there; its misses
        and computations went with its first part, unless that is `start`.
        """
        rest = Batch()
        i, at = start.namespace, start.served
        ends = self.ends
        for j in range(i, len(ends)):
            begin = ends[j - 1] if j else 0
            first = j > i or at == begin
            rest.add(
                self.namespaces[j],
                self.served[at if j == i else begin : ends[j]],
                self.misses[j] if first else 0,
                self.computes[j] if first else 0,
                self.compute_seconds[j] if first else 0.0,
            )
        return rest

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
class Cursor:
    """How far a flush got through a batch: its next namespace, and its next served key.

    A cursor at a namespace's first served key (or at a namespace with no
    hits) means nothing of it is written yet, its misses included.
    """

    namespace: int
    served: int


START = Cursor(0, 0)
"""A flush that has written nothing yet."""


@attrs.frozen
class Slice:
    """One slice of a batch, as flat parameters for SQL, and where the next slice starts."""

    namespaces: list[object]
    """(batch index, namespace, misses, computes, compute seconds), one after the other;
    a namespace continued from an earlier slice has zeros (they went with its first part)."""
    hits: list[int | str | bytearray]
    """(batch index, encoded key, times served), one after the other (see `hit_params`)."""
    end: Cursor


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
        writer (`cut`), off the event loop.
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
        """Flush the environment's counts (every namespace's, in short slices)."""
        await self.recorder.flush()


Flush = Callable[[Batch, Cursor], Awaitable[Cursor | None]]
"""Write the slice of a batch that starts at the cursor (the writer sizes it, see
`cut`), in one transaction; return where it ended, or None if it was not written."""


@final
class Recorder:
    """An environment's counters, one per namespace, and the flush that empties them.

    `write` stores one slice of a batch and says where it ended (None if it
    could not: that slice and the rest are then kept for the next flush).
    Flushes are serialised by a lock, so a store's close and the background
    flush never write the same counts twice.
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
        """Write every namespace's counts so far, slice by slice; False if some were kept.

        Another storage call waits behind one slice at most: each is its own
        call to the worker, queued after whatever was asked for meanwhile.
        A slice runs shielded from cancellation, so whether it committed is
        always known (a cancelled wait would not stop the worker's COMMIT,
        and restoring its counts then would count them twice); a cancelled
        flush stops between slices and keeps the rest for the next one.
        """
        async with self._lock:
            batch = self.drain()
            if not batch:
                return True
            done = START
            try:
                while not batch.written(done):
                    await anyio.lowlevel.checkpoint_if_cancelled()
                    with anyio.CancelScope(shield=True):
                        reached = await self._write(batch, done)
                    if reached is None:
                        return False
                    done = reached
            finally:
                if not batch.written(done):
                    self.restore(batch.rest(done))
            return True

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


# A namespace as read from a file and whether it is stored as text: a BLOB `app/1/k`
# and the text `app/1/k` are two namespaces, never added up.
Name = tuple[str, bool]


def assemble(
    totals: list[NamespaceSummary],
    counters: dict[Name, tuple[int, int, float]],
    origins: dict[tuple[Name, int], tuple[int, float]],
    bundles: list[tuple[int, str, str, int, int, int]],
    bundle_hits: dict[int, tuple[int, float]],
    pending: Batch,
    resolved: Resolved,
    without_cost: dict[Name, int] | None = None,
) -> EnvironmentStatistics:
    """Stored counts plus this process's pending ones, as the public value classes.

    `totals`: what each namespace holds; `counters`: namespace -> (misses,
    computes, compute seconds); `origins`: (namespace, origin) -> (hits,
    saved); `bundles`: (id, name, digest, entries still imported, of them hit, of
    those without a cost); `without_cost`: namespace -> its entries hit without a
    cost. Pending and resolved counts are a store's, so of text namespaces.
    """
    unpriced = without_cost or {}
    counts = dict(counters)
    for p in pending:
        misses, computes, seconds = counts.get((p.namespace, True), (0, 0, 0.0))
        counts[(p.namespace, True)] = (
            misses + p.misses,
            computes + p.computes,
            seconds + p.compute_seconds,
        )
    by_origin = dict(origins)
    for (namespace, origin), (hits, saved) in resolved.by_origin.items():
        old_hits, old_saved = by_origin.get(((namespace, True), origin), (0, 0.0))
        by_origin[((namespace, True), origin)] = (old_hits + hits, old_saved + saved)
    per_bundle = dict(bundle_hits)
    for ident, (hits, saved) in resolved.by_bundle.items():
        old_hits, old_saved = per_bundle.get(ident, (0, 0.0))
        per_bundle[ident] = (old_hits + hits, old_saved + saved)

    sizes = {(s.namespace, s.text): (s.entries, s.bytes) for s in totals}
    names = sorted(set(sizes) | set(counts) | {name for name, _ in by_origin} | set(unpriced))
    hit_origins: dict[Name, dict[Origin, tuple[int, float]]] = {}
    for (name, origin), value in by_origin.items():
        hit_origins.setdefault(name, {})[_origin(origin)] = value
    namespaces = []
    for name in names:
        entries, size = sizes.get(name, (0, 0))
        misses, computes, seconds = counts.get(name, (0, 0, 0.0))
        origin_counts = hit_origins.get(name, {})
        namespaces.append(
            NamespaceStatistics(
                namespace=name[0],
                entries=entries,
                bytes=size,
                hits=sum(h for h, _ in origin_counts.values()),
                misses=misses,
                hits_by_origin={o: h for o, (h, _) in sorted(origin_counts.items())},
                computes=computes,
                compute_seconds=seconds,
                saved_seconds=sum(s for _, s in origin_counts.values()),
                text=name[1],
                hit_without_cost=unpriced.get(name, 0),
            )
        )
    bundle_list = [
        BundleStatistics(
            name=name,
            digest=digest,
            entries=entries,
            hits=per_bundle.get(ident, (0, 0.0))[0],
            saved_seconds=per_bundle.get(ident, (0, 0.0))[1],
            distinct_hits=hit,
            hit_without_cost=hit_without_cost,
        )
        for ident, name, digest, entries, hit, hit_without_cost in bundles
    ]
    return EnvironmentStatistics(namespaces=namespaces, bundles=bundle_list)


def cut(
    batch: Batch,
    start: Cursor,
    *,
    rows: int | None = None,
    served: int | None = None,
    text: bool = False,
) -> Slice:
    """The slice of `batch` from `start`: about `rows` rows, at most `served` keys counted.

    `rows` and `served` default to `SLICE_ROWS` and `SLICE_SERVED`.

    Rows are namespaces and distinct hit keys (what a slice inserts and
    resolves in SQL). A namespace that does not fit is cut after the keys
    that do, and the next slice goes on from there. Runs on the writer's
    thread: the counting and encoding never happen on the event loop.
    Parameters are flat, keys as `bytearray` or ASCII `str` (see `hit_params`).
    A key served as a JSON store's `str` and as its encoding is one row: the
    SQL adds an entry's saving once without grouping per entry (1.4x dearer).
    """
    namespaces: list[object] = []
    params: list[int | str | bytearray] = []
    add = namespaces.extend
    keys, ends = batch.served, batch.ends
    i, at = start.namespace, start.served
    left = SLICE_ROWS if rows is None else rows
    unread = SLICE_SERVED if served is None else served
    while i < len(ends) and left > 0 and unread > 0:
        end, name = ends[i], batch.namespaces[i]
        if at == (ends[i - 1] if i else 0):
            add((i, name, batch.misses[i], batch.computes[i], batch.compute_seconds[i]))
        else:  # continued: its misses and computations went with its first part
            add((i, name, 0, 0, 0.0))
        left -= 1
        if at < end:
            counts, stop = _count(keys, at, end, max(left, 1), unread)
            unread -= stop - at
            left -= len(counts)
            at = stop
            _add_hits(params, i, counts, text)
            if at < end:
                break
        i += 1
    return Slice(namespaces, params, Cursor(i, at))


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
    `str` and as its encoding comes once, its counts added up (see `cut`).
    """
    return cut(batch, START, rows=sys.maxsize, served=sys.maxsize, text=text).hits


def _count(
    keys: list[bytes | str], start: int, end: int, most: int, unread: int
) -> tuple[dict[bytes | str, int], int]:
    """Count `keys[start:end]` until about `most` distinct ones or `unread` read; where it stopped.

    The distinct keys of a run are at most its length, so a run of at most
    `most` keys is counted whole; a longer one a step at a time, each step
    no longer than the distinct keys still allowed, but an eighth of `most`
    at least: near the bound, many repeats of a few keys are still counted
    in a few steps, at the price of up to `most / 8` keys more.
    """
    stop = min(end, start + unread)
    if stop - start <= most:
        run = keys[start:stop]
        if len(run) > 64:
            return Counter(run), stop  # counted in C
        counts: dict[bytes | str, int] = {}  # a Counter's set-up costs more than a few keys
        get = counts.get
        for key in run:
            counts[key] = get(key, 0) + 1
        return counts, stop
    counter: Counter[bytes | str] = Counter()
    at = start
    least = max(most // 8, 1)
    while at < stop and len(counter) < most:
        step = min(stop, at + max(most - len(counter), least))
        counter.update(keys[at:step])
        at = step
    return counter, at


def _add_hits(
    params: list[int | str | bytearray], i: int, counts: dict[bytes | str, int], text: bool
) -> None:
    add = params.extend
    encode, blob = encode_str, bytearray
    first = len(params)
    kinds = 0  # 1: a bytes key, 2: a str key
    try:  # a JsonCodec's encoding of a str key, inlined
        for key, n in counts.items():
            if isinstance(key, bytes):
                kinds |= 1
                add((i, blob(key), n))
            else:
                kinds |= 2
                encoded = encode(key)
                add((i, encoded if text and encoded.isascii() else blob(encoded, "utf-8"), n))
    except UnicodeEncodeError:  # a lone surrogate: the codec's own path says why
        kinds = 3
    if kinds == 3:
        del params[first:]  # both kinds: one row per entry (see `cut`)
        merged: Counter[bytes] = Counter()
        for key, n in counts.items():
            merged[_encoded(key)] += n
        for encoded_key, n in merged.items():
            add((i, blob(encoded_key), n))


def _encoded(key: bytes | str) -> bytes:
    return key if isinstance(key, bytes) else _JSON_KEYS.encode_key(key)


def _origin(value: int) -> Origin:
    try:
        return Origin(value)
    except ValueError:
        return Origin.LOCAL
