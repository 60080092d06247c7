"""A typed map over one namespace's storage, with an in-process copy.

The storage is the shared truth (other processes, imported bundles); the
store keeps what it has seen in memory so a hit costs a dict lookup, not a
thread hop. `EAGER` loads the whole namespace at open, the mode for start-up
caches; `LAZY` reads each key the first time it is asked for. In both modes
a key the store does not hold is looked up in the storage before it is
reported missing, so a bundle imported while the application serves, or an
entry another process computed, is found rather than recomputed.

What the store holds, and the hit path that hands it out (each caller its
own copy, a mutable value decoded afresh or copied from the hot set), are
`warmenv.persistence._held`, shared with the store's synchronous face
(`warmenv.blocking.BlockingStore`), which reaches them through `Store.held`
and computes through `Store.compute_held`.

Concurrent askers of one missing key share one storage read and, in
`get_or_compute`, one run of the computation and its outcome, value or
exception (`warmenv.persistence._flight`). Across processes and hosts, a
storage with a shared tier arbitrates (`Storage.lease`): one of them
computes, the others wait for its value. Without one, each process runs its
own computation and the insert rules decide whose value the storage keeps.
"""

from __future__ import annotations

import datetime
import enum
import functools
import inspect
import sys
import time
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
)
from typing import (
    Any,
    Final,
    Generic,
    ParamSpec,
    final,
    overload,
)

import anyio

from warmenv._backend import native_task
from warmenv._faces import AsyncWith
from warmenv.persistence._flight import Flights, awaited, unless_imported, waits_for_itself
from warmenv.persistence._held import ABSENT, Held
from warmenv.persistence._ttl import Expiry, check_dated, check_ttl
from warmenv.persistence.codec import Codec, JsonCodec, canonical_arguments
from warmenv.persistence.explain import explain_first_miss
from warmenv.persistence.hot import DEFAULT_HOT_BYTES
from warmenv.persistence.statistics import Counters
from warmenv.persistence.storage import Conflict, Failed, Insertion, Purged, Storage, Stored

__all__ = ["DEFAULT_HOT_BYTES", "MISSING", "CacheMode", "Missing", "Store"]

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:
    from typing_extensions import TypeVar

# A store opened without a codec is a JsonCodec store of any keys and values:
# `store = await env.store(ns)` is a Store[Any, Any] (PEP 696 defaults), and
# an annotation (`store: Store[str, int] = ...`) narrows it.
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
D = TypeVar("D")
P = ParamSpec("P")


class CacheMode(enum.Enum):
    """When a `Store` reads its storage."""

    EAGER = "eager"
    """Load the namespace at open; keys not held are read through on demand."""
    LAZY = "lazy"
    """Read each key from storage on first access."""


class Missing(enum.Enum):
    """The type of `MISSING`, for `store.get(key, MISSING)`."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = Missing.MISSING
"""A default for `Store.get` that no stored value can equal (a stored `None` can)."""


@final
class Store(AsyncWith, Generic[K, V]):
    """Typed keys to typed values over a `Storage`, with a local copy."""

    _async_form = "await env.store(namespace) as store"

    __slots__ = (
        "_arrivals",
        "_computes",
        "_counters",
        "_epoch",
        "_expiry",
        "_held",
        "_hit",
        "_memoized",
        "_mode",
        "_reads",
        "_storage",
    )

    def __init__(
        self,
        storage: Storage,
        codec: Codec[K, V],
        mode: CacheMode,
        max_entries: int | None = None,
        counters: Counters | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | datetime.timedelta | None = None,
    ) -> None:
        seconds = check_ttl(ttl)
        if seconds is not None:
            check_dated(storage)
        if max_entries is not None and (type(max_entries) is not int or max_entries < 1):
            raise ValueError(f"max_entries must be a positive int or None, got {max_entries!r}")
        if type(hot_bytes) is not int or hot_bytes < 0:
            raise ValueError(f"hot_bytes must be an int >= 0, got {hot_bytes!r}")
        self._storage = storage
        self._mode = mode
        self._held: Held[K, V] = Held(codec, max_entries, hot_bytes, counters, storage.describe)
        # With a ttl, the hit path looks values up through their deadlines (`_ttl`).
        self._expiry = None if seconds is None else Expiry(seconds, self._held)
        self._hit = self._held.hit  # the hit path, bound once (after the expiry's)
        self._reads: Flights[bytes, Any] = Flights()
        self._computes: Flights[bytes, tuple[Any, bool]] = Flights()
        self._epoch = 0
        self._memoized: str | None = None
        self._counters = counters
        storage.forget_on_close(self._held)  # a closed environment's store holds nothing
        self._arrivals = storage.arrivals()  # imports that may answer a run (`unless_imported`)
        if self._arrivals is not None:
            self._arrivals.want(storage.namespace)

    @overload
    @classmethod
    async def open(
        cls,
        storage: Storage,
        codec: None = None,
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        counters: Counters | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | datetime.timedelta | None = None,
    ) -> Store[Any, Any]: ...
    @overload
    @classmethod
    async def open(
        cls,
        storage: Storage,
        codec: Codec[K, V],
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        counters: Counters | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | datetime.timedelta | None = None,
    ) -> Store[K, V]: ...
    @classmethod
    async def open(
        cls,
        storage: Storage,
        codec: Codec[Any, Any] | None = None,
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        counters: Counters | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | datetime.timedelta | None = None,
    ) -> Store[Any, Any]:
        """A store over `storage`; in `EAGER` mode this loads the namespace.

        `max_entries` bounds the values held in memory (least recently used
        dropped first; they stay in the storage and are read back on demand).
        An `EAGER` store with a bound loads the first `max_entries` in key order.
        `counters` (handed out by an environment) count its hits, misses and
        computations for `Environment.statistics()`. `hot_bytes` bounds the
        memory of the decoded copies a `JsonCodec` store keeps of its most used
        `dict` and `list` values (0: none; each hit then decodes).

        `ttl` (seconds, or a `timedelta`; None: none) is how old an entry may
        be and still be a hit: an older one is a miss, and `get_or_compute`
        recomputes and replaces it. An entry's age is counted from when it
        was first written, wherever that was: an imported entry keeps the
        time its bundle carries (`warmenv.persistence._ttl`).
        """
        store: Store[Any, Any] = cls(
            storage,
            JsonCodec() if codec is None else codec,
            mode,
            max_entries,
            counters,
            hot_bytes,
            ttl,
        )
        if mode is CacheMode.EAGER:
            await store._load()
        return store

    @property
    def storage(self) -> Storage:
        """The storage under this store."""
        return self._storage

    def __repr__(self) -> str:
        return describe_store(self, self._storage, self._held)

    @property
    def mode(self) -> CacheMode:
        """When this store reads its storage."""
        return self._mode

    @property
    def max_entries(self) -> int | None:
        """The most values held in memory, or `None` for no bound."""
        return self._held.limit

    @property
    def hot_bytes(self) -> int:
        """The most memory held by decoded copies of hot values (0 for a non-JSON codec)."""
        return self._held.hot.limit

    @property
    def ttl(self) -> float | None:
        """Seconds an entry stays a hit after it was written, or `None` for no ttl."""
        return None if self._expiry is None else self._expiry.ttl

    @property
    def hit_path(self) -> Callable[..., Any]:
        """The hit path (`Held.hit`, through the ttl's check if any), for the synchronous face.

        Callers load it into a local and call that (`hit = self._hit; hit(key)`):
        `self._hit(key)` compiles to a method load, which CPython 3.11 cannot
        specialize for a function held in a slot, and costs about 90 machine
        instructions more per hit (callgrind).
        """
        return self._hit

    @property
    def held(self) -> Held[K, V]:
        """What this store holds in memory, for its synchronous face (not part of the API)."""
        return self._held

    def __len__(self) -> int:
        """Values held in memory (in `LAZY` mode, or with a bound, not all stored ones).

        With a `ttl`, an expired value is counted until it is next looked up (a miss,
        which forgets it), evicted or purged: `len` never reads the clock."""
        return len(self._held)

    # A hit returns without a checkpoint: it is a dict lookup, and yielding to
    # the event loop would cost several times the answer. Misses always await.

    @overload
    async def get(self, key: K) -> V | None: ...
    @overload
    async def get(self, key: K, default: D) -> V | D: ...
    async def get(self, key: K, default: Any = None) -> Any:
        """The value for `key`, or `default` if neither memory nor the storage holds it.

        A stored `None` is a value; pass `MISSING` as `default` to tell it apart
        from a miss.
        """
        hit = self._hit  # see `hit_path`: loaded, then called
        value = hit(key)
        if value is not ABSENT:
            return value
        held = self._held
        memo, encoded = held.keys(key)
        found = await self._read(encoded)
        if found is ABSENT:
            held.missed()
            return default
        held.counted(memo)
        return held.serve(memo, found)

    async def get_many(self, keys: Iterable[K]) -> dict[K, V]:
        """The values of those `keys` that memory or the storage holds, in their order.

        The keys not held in memory are read in one storage call
        (`Storage.get_many`: one SQLite query), however many they are. Each
        key counts as `get` counts it, a hit if found and a miss if not; a key
        given twice counts once. Keys missing from the storage are left out of
        the result, which is keyed by the keys as given: they must be hashable
        (a tuple for a JSON list key; an unhashable key raises `TypeError`
        before anything is read or counted).
        """
        wanted = dict.fromkeys(keys)
        held = self._held
        found: dict[K, Any] = {}
        pending: list[tuple[K, bytes | str, bytes]] = []
        for key in wanted:
            value = self._hit(key)
            if value is ABSENT:
                pending.append((key, *held.keys(key)))
            else:
                found[key] = value
        if not pending:
            return found
        epoch = self._epoch
        reading = dict.fromkeys(e for _, _, e in pending)
        stored: dict[bytes, tuple[bytes, float | None]]
        if self._expiry is None:
            stored = {k: (v, None) for k, v in (await self._storage.get_many(reading)).items()}
        else:
            stored = dict(await self._expiry.fresh(self._storage, reading))
        for key, memo, encoded in pending:
            data, deadline = stored.get(encoded, (None, None))
            if data is None:
                await explain_first_miss(self._storage.describe, self._storage.explain, encoded)
            current = held.lookup(memo)
            if current is ABSENT and epoch == self._epoch and data is not None:
                # As in `get`: an insert or purge that overtook the read is newer.
                current = self._remember(encoded, data, deadline)
            if current is ABSENT:
                held.missed()
            else:
                held.counted(memo)
                found[key] = held.serve(memo, current)
        return {key: found[key] for key in wanted if key in found}

    def get_nowait(self, key: K) -> V:
        """The value for `key` if it is held in memory, without awaiting.

        Raises `anyio.WouldBlock` when answering needs a storage read (then
        `await get(key)`). Safe to call from another thread than the store's
        event loop: it looks up and reorders dicts, each step atomic under the
        GIL, and changes what the store holds only under its lock.
        """
        hit = self._hit  # see `hit_path`: loaded, then called
        value = hit(key)
        if value is ABSENT:
            raise anyio.WouldBlock
        return value  # type: ignore[no-any-return]

    async def insert(self, key: K, value: V) -> Insertion:
        """Store `value`; a value the store already holds does not reach the storage."""
        held = self._held
        data = held.codec.encode_value(value)
        result, _ = await self._put(held.encode_key(key), data, keep_failed=False)
        return result

    async def get_or_compute(
        self, key: K, fn: Callable[P, Awaitable[V]], /, *args: P.args, **kwargs: P.kwargs
    ) -> V:
        """The stored value, or `await fn(*args, **kwargs)` run once for every concurrent asker.

        `key` and `fn` are positional-only, so `fn`'s keyword arguments may use
        any name (`key=` and `fn=` included); the arguments are not part of the
        key.

        Askers that arrive while a run is in progress wait for it and share its
        outcome: its value, or the exception it raised (the next call then
        starts a new run). A waiter that is cancelled stops waiting and the run
        goes on. If the task running `fn` is cancelled, the run is abandoned and
        one of the waiters starts a new one with its own `fn`, so no
        waiter is left without an answer or handed a cancellation not its own.
        If the storage already holds another value for the key (another
        process got there first), that value wins and is returned. `fn` asking
        for its own key, from its own task, raises `WarmenvError` (it would
        wait for itself).
        """
        hit = self._hit  # see `hit_path`: loaded, then called
        value = hit(key)
        if value is not ABSENT:
            return value  # type: ignore[no-any-return]
        held = self._held
        memo, encoded = held.keys(key)
        if kwargs:
            found, _ = await self.compute_held(
                memo, encoded, functools.partial(fn, *args, **kwargs), ()
            )
        else:
            found, _ = await self.compute_held(memo, encoded, fn, args)
        return held.serve(memo, found)

    @overload
    def memoize(
        self, fn: Callable[P, Coroutine[Any, Any, V]], /
    ) -> Callable[P, Coroutine[Any, Any, V]]: ...
    @overload
    def memoize(
        self, *, key: Callable[P, K]
    ) -> Callable[[Callable[P, Coroutine[Any, Any, V]]], Callable[P, Coroutine[Any, Any, V]]]: ...
    def memoize(self, fn: Any = None, *, key: Any = None) -> Any:
        """Decorate an async function so its calls go through `get_or_compute`.

        The key is the JSON list of the call's arguments, defaults applied (so
        `f(1)` and `f(1, b=2)` with default `b=2` share an entry, and
        `store.get([1, 2])` reads it), or `key(*args, **kwargs)` encoded by the
        store's codec. Without `key`, a store memoizes one function: a second
        one would share its keys.
        """

        def decorate(
            fn: Callable[..., Coroutine[Any, Any, V]],
        ) -> Callable[..., Coroutine[Any, Any, V]]:
            name = getattr(fn, "__qualname__", repr(fn))
            keys = None
            if key is None:
                self._memoized = claim_memoized(self._memoized, name, self._storage)
                keys = CallKeys(fn, name)

            @functools.wraps(fn)
            async def memoized(*args: Any, **kwargs: Any) -> V:
                held = self._held
                if keys is None:
                    given = key(*args, **kwargs)
                    value = self._hit(given)
                    if value is not ABSENT:
                        return value  # type: ignore[no-any-return]
                    memo, encoded = held.keys(given)
                else:
                    memo = encoded = keys.encoded(args, kwargs)
                    value = self._hit(memo, True)
                    if value is not ABSENT:
                        return value  # type: ignore[no-any-return]
                call = functools.partial(fn, *args, **kwargs)
                found, _ = await self.compute_held(memo, encoded, call, ())
                return held.serve(memo, found)

            return memoized

        return decorate if fn is None else decorate(fn)

    async def purge_key(self, key: K) -> Purged | Failed:
        """Forget one key here and delete it from the storage."""
        held = self._held
        encoded = held.encode_key(key)
        self._epoch += 1
        memo = held.memo(encoded)
        held.forget_undecodable(encoded)
        try:
            held.forget(memo)
            return await self._storage.purge_key(encoded)
        finally:
            held.forget(memo)  # and what a thread read while the delete ran (`Held.adopt`)

    async def purge(self) -> Purged | Failed:
        """Forget everything here and delete the namespace from the storage."""
        self._epoch += 1
        self._held.forget_undecodable(None)
        try:
            self._held.forget(None)
            return await self._storage.purge()
        finally:
            self._held.forget(None)  # and what threads read while the delete ran

    async def aclose(self) -> None:
        """Flush the counts of hits and misses so far (the environment's, in one write).

        A store holds no other resource: one dropped without `aclose` loses
        nothing, as its environment flushes every count on close.
        """
        if self._counters is not None:
            await self._counters.flush()

    async def __aenter__(self) -> Store[K, V]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()

    # --- for the store's faces (this one and warmenv.blocking's) -------------------

    async def compute_held(
        self,
        memo: bytes | str,
        encoded: bytes,
        fn: Callable[..., Awaitable[V]],
        args: tuple[Any, ...],
    ) -> tuple[Any, bool]:
        """The held form of a key not in memory, read through, else computed by one shared run.

        Also whether it was found (not computed). Every asker sharing the run
        counts once: a hit if it found a stored value, a miss if the value
        had to be computed (by this run's `fn`). Not part of the API.
        """
        found: tuple[Any, bool] = await self._computes.run(
            encoded,
            functools.partial(self._fill, encoded, fn, args),
            owner=native_task(),
            itself=functools.partial(waits_for_itself, fn, self._storage, memo),
        )
        if found[1]:
            self._held.counted(memo)
        else:
            self._held.missed()
        return found

    # --- internals -------------------------------------------------------------

    async def _load(self) -> None:
        held, limit, expiry = self._held, self._held.limit, self._expiry
        if expiry is not None:
            await self._load_fresh(expiry)
            return
        rows = self._storage.scan()
        try:
            async for encoded, data in rows:
                held.remember(encoded, data)
                if limit is not None and len(held) >= limit:
                    break
        finally:
            if isinstance(rows, AsyncGenerator):
                await rows.aclose()

    async def _load_fresh(self, expiry: Expiry) -> None:
        """`_load` for a store with a ttl: only the entries still fresh.

        Each row's value and write time come from the one scan
        (`scan_with_info`), as `Expiry.fresh` reads them for a lookup.
        """
        held, limit = self._held, self._held.limit
        rows = self._storage.scan_with_info()
        try:
            async for encoded, data, info in rows:
                deadline = expiry.deadline(info.written_at)
                if deadline is not None:
                    self._remember(encoded, data, deadline)
                    if limit is not None and len(held) >= limit:
                        break
        finally:
            if isinstance(rows, AsyncGenerator):
                await rows.aclose()

    def _remember(self, encoded: bytes, data: bytes, deadline: float | None) -> Any:
        """`Held.remember`, and with a ttl the value's `deadline` once it is held."""
        remembered = self._held.remember(encoded, data)
        if deadline is not None and remembered is not ABSENT:
            self._expiry.hold(self._held.memo(encoded), deadline)  # type: ignore[union-attr]
        return remembered

    async def _dated(self, encoded: bytes) -> tuple[bytes | None, float | None]:
        """With a ttl, the value under `encoded` and its deadline if fresh, from one read."""
        fresh = await self._expiry.fresh(self._storage, (encoded,))  # type: ignore[union-attr]
        return fresh.get(encoded, (None, None))

    async def _read(self, encoded: bytes) -> Any:
        """Read one key through to the storage, sharing the read with concurrent askers."""
        return await self._reads.run(encoded, functools.partial(self._fetch, encoded))

    async def _fetch(self, encoded: bytes) -> Any:
        epoch = self._epoch
        deadline = None
        if self._expiry is not None:
            data, deadline = await self._dated(encoded)
        elif self._mode is CacheMode.EAGER and self._held.limit is None:
            # It loaded the namespace: a key it lacks is most likely not stored.
            data = await self._storage.get_expecting_miss(encoded)
        else:
            data = await self._storage.get(encoded)
        if data is None:
            await explain_first_miss(self._storage.describe, self._storage.explain, encoded)
        held = self._held.lookup(self._held.memo(encoded))
        if held is not ABSENT or epoch != self._epoch:
            # An insert or purge here overtook the read: it is newer than what was read.
            return held
        return ABSENT if data is None else self._remember(encoded, data, deadline)

    async def _fill(
        self, encoded: bytes, fn: Callable[..., Awaitable[V]], args: tuple[Any, ...]
    ) -> tuple[Any, bool]:
        """What this store now holds for the key, and whether it was found (not computed)."""
        arrivals = self._arrivals
        seen = 0 if arrivals is None else arrivals.batches  # before the read: none missed
        held = await self._read(encoded)
        if held is not ABSENT:
            return held, True
        # Fleet-wide single flight: with a shared tier, one host computes the
        # key at a time and the others get its value (`Storage.lease`).
        async with self._storage.lease(encoded) as landed:
            deadline = None
            if landed is not None and self._expiry is not None:
                # Judged by the stored row, value and time read together.
                landed, deadline = await self._dated(encoded)
            if landed is not None:
                held = self._remember(encoded, landed, deadline)
                if held is not ABSENT:
                    return held, True
            start = time.perf_counter()
            if arrivals is not None:
                # Watched whether or not an import runs now: one may start before it ends.
                read = functools.partial(self._read, encoded)
                was_imported, value = await unless_imported(read, fn, args, arrivals, seen)
                if was_imported:
                    return value, True
            else:
                value = await awaited(fn, args)
            cost = time.perf_counter() - start
            if self._counters is not None:
                self._counters.computed(cost)
            data = self._held.codec.encode_value(value)
            _, held = await self._put(encoded, data, keep_failed=True, cost=cost)
        return held, False

    async def _put(
        self, encoded: bytes, data: bytes, *, keep_failed: bool, cost: float | None = None
    ) -> tuple[Insertion, Any]:
        """Insert `data`, returning the outcome and what this store now holds for the key."""
        held, expiry = self._held, self._expiry
        memo = held.memo(encoded)
        current = held.lookup(memo)
        if (
            current is not ABSENT
            and held.data_of(current) == data
            and (expiry is None or expiry.live(memo))
        ):
            return Stored(), current
        held.changing()  # a thread's read that overlaps the write is not kept (`Held.adopt`)
        try:
            if held.is_undecodable(encoded):
                result: Insertion = await self._storage.replace(encoded, data, cost=cost)
            else:
                result = await self._storage.insert(encoded, data, cost=cost)
                if isinstance(result, Conflict):
                    existing = await self._kept(memo, encoded, result.existing)
                    if existing is not ABSENT:
                        return result, existing
                    result = await self._storage.replace(encoded, data, cost=cost)
            packed = held.pack(held.codec.decode_value(data), data)
            if isinstance(result, Stored) or keep_failed:
                # After a failed write the value is still served from memory: the
                # storage is a cache, and recomputing would not make it writable.
                held.keep(encoded, packed)
                if expiry is not None:
                    expiry.wrote(memo)
            return result, packed
        finally:
            held.changing()

    async def _kept(self, memo: bytes | str, encoded: bytes, existing: bytes) -> Any:
        """The held form of the value the storage kept over ours; `ABSENT` to replace it.

        A value that does not decode is replaced, and so, with a ttl, is one
        past it: the rules keep it (local never replaces local), but the
        store's own rule says it is gone.
        """
        if self._expiry is None:
            return self._held.remember(encoded, existing)
        data, deadline = await self._dated(encoded)  # the kept row's value with its own time
        return ABSENT if data is None else self._remember(encoded, data, deadline)


def describe_store(store: object, storage: Storage, held: Held[Any, Any]) -> str:
    """A store's repr, either face's: `<Store: SQLite /srv/envs/prod.db [app/1/k]>`,
    and `, closed` once its environment closed."""
    closed = ", closed" if held.closed else ""
    return f"<{type(store).__name__}: {storage.describe()}{closed}>"


def claim_memoized(memoized: str | None, name: str, storage: Storage) -> str:
    """`name`, the function a store memoizes by its arguments; one per store."""
    if memoized not in (None, name):
        raise ValueError(
            f"{storage.describe()} already memoizes {memoized}(); give {name}() its own"
            " namespace, or pass key= to tell their keys apart"
        )
    return name


@final
class CallKeys:
    """The key of a memoized call: its arguments, defaults applied, as a JSON list.

    The same for every store's face and codec, so that `store.get([1, 2])`
    reads what `f(1, 2)` stored, async or not.
    """

    __slots__ = ("_name", "_signature")

    def __init__(self, fn: Callable[..., object], name: str) -> None:
        self._signature = inspect.signature(fn)
        self._name = name

    def encoded(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return canonical_arguments(bound.arguments, f"{self._name}()")
