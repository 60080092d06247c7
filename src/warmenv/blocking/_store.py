"""Stores for synchronous code: the async `Store`'s memory, served on the caller's thread.

A `BlockingStore` is a second face of one `Store`, as httpx's `Client` is of
the core it shares with `AsyncClient`: the same memory (`Store.held`, whose
hit path both faces call), the same single-flight rules
(`warmenv.persistence._flight`), the same computations on a miss
(`Store.compute_held`), and nothing of the store's own beyond those. What it
adds is only where things run. A hit is answered on the caller's thread, as
cheap as a dict lookup: the one loop check (`event_loop_here`'s line, inlined:
the cheap first step of `waiting_refused`, which a thread running no loop
never goes beyond) and the store's hit path (`Held.hit`). A miss reads the
environment file on the caller's thread too, with a read-only connection of
its own (WAL readers never wait for the writer); only what that cannot
answer (a key the file does not hold, a shared tier, an environment in
memory) crosses to the loop thread.

`get_or_compute` runs the computation on the caller's thread: it is the
application's plain function, free to block, and running it on the loop
thread would stall every other thread's misses behind it. Threads asking
for a key that is being computed wait for that run and share its outcome,
its value (each thread gets its own copy) or its exception. This is single
flight within one `BlockingStore` in one process, as for the async `Store`.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, ParamSpec, final, overload

from warmenv._backend import event_loop_here, running_asyncio_loop, sniffio_thread
from warmenv.blocking._loop import (
    Ask,
    LoopThread,
    refuse_event_loop_thread,
    refused,
    waiting_refused,
)
from warmenv.persistence._flight import Flights, plain, refuse_async, waits_for_itself
from warmenv.persistence._held import ABSENT, Held
from warmenv.persistence.storage import Failed, Insertion, Purged
from warmenv.persistence.store import CacheMode, CallKeys, Store, claim_memoized, describe_store

__all__ = ["BlockingStore"]

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:
    from typing_extensions import TypeVar

# As for `Store`: `store = env.store(ns)` is a BlockingStore[Any, Any].
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
D = TypeVar("D")
P = ParamSpec("P")


@final
class BlockingStore(Generic[K, V]):
    """A `Store` for synchronous callers; hits never leave the calling thread."""

    __slots__ = ("_flights", "_held", "_hit", "_loop", "_memoized", "_owner", "_store")

    def __init__(self, store: Store[K, V], loop: LoopThread, *, owner: object = None) -> None:
        self._store = store
        self._held: Held[K, V] = store.held
        self._hit = store.hit_path  # the hit path (behind a ttl's check, if any), bound once
        self._loop = loop
        # This face's threads: one run per key among them, and through the
        # store's own flight, with the loop's tasks.
        self._flights: Flights[bytes, tuple[Any, bool]] = Flights()
        self._memoized: str | None = None
        # Its environment, kept open while the store is in use (a cursor keeps
        # its sqlite3 connection so): `store = blocking.open().store(ns)` works.
        self._owner = owner

    @property
    def store(self) -> Store[K, V]:
        """The async store underneath (usable only on the loop thread)."""
        return self._store

    def __repr__(self) -> str:
        return describe_store(self, self._store.storage, self._held)

    @property
    def mode(self) -> CacheMode:
        """When this store reads its storage."""
        return self._store.mode

    @property
    def max_entries(self) -> int | None:
        """The most values held in memory, or `None` for no bound."""
        return self._store.max_entries

    @property
    def ttl(self) -> float | None:
        """Seconds an entry stays a hit after it was written, or `None` for no ttl."""
        return self._store.ttl

    @property
    def hot_bytes(self) -> int:
        """The most memory held by decoded copies of hot values (0 for a non-JSON codec)."""
        return self._store.hot_bytes

    def __len__(self) -> int:
        """Values held in memory, an expired one (under a `ttl`) until it is looked up."""
        return len(self._held)

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: Any = None) -> Any:
        """The value for `key`, or `default`; a miss reads the storage on this thread.

        Only what the environment file cannot answer here goes to the loop thread.
        """
        # `event_loop_here()`, inlined (see there why)
        if (
            running_asyncio_loop() is not None or sniffio_thread.name is not None
        ) and waiting_refused():
            raise refused("get()")
        hit = self._hit  # see `Store.hit_path`: loaded, then called
        value = hit(key)
        if value is not ABSENT:
            return value
        held = self._held
        memo, encoded = held.keys(key)
        found = self._read_here(memo, encoded)
        if found is not ABSENT:
            held.counted(memo)
            return found[0]
        return self._loop.call(self._store.get, key, default)

    def get_many(self, keys: Iterable[K]) -> dict[K, V]:
        """The values of those `keys` that are stored, in their order; see `Store.get_many`.

        Hits are answered on this thread; the other keys cross to the loop
        thread together, for one storage read.
        """
        if event_loop_here() and waiting_refused():
            raise refused("get_many()")
        wanted = dict.fromkeys(keys)
        found: dict[K, Any] = {}
        rest: list[K] = []
        for key in wanted:
            value = self._hit(key)
            if value is ABSENT:
                rest.append(key)
            else:
                found[key] = value
        if not rest:
            return found
        found.update(self._loop.call(self._store.get_many, rest))
        return {key: found[key] for key in wanted if key in found}

    def insert(self, key: K, value: V) -> Insertion:
        """Store `value`; see `Store.insert`."""
        refuse_event_loop_thread("insert()")
        return self._loop.call(self._store.insert, key, value)

    def get_or_compute(self, key: K, fn: Callable[P, V], /, *args: P.args, **kwargs: P.kwargs) -> V:
        """The stored value, or `fn(*args, **kwargs)` run once, on this thread, for every asker.

        `key` and `fn` are positional-only, so `fn`'s keyword arguments may use
        any name; the arguments are not part of the key.

        Threads that ask while a run is in progress wait for it: they get the
        value it stored (each its own copy) or the exception it raised, and
        the next call starts a new run. If the storage already holds a value
        from another process, that value wins and is returned. `fn` asking
        for its own key raises `WarmenvError` (it would wait for itself).
        """
        # `event_loop_here()`, inlined (see there why)
        if (
            running_asyncio_loop() is not None or sniffio_thread.name is not None
        ) and waiting_refused():
            raise refused("get_or_compute()")
        hit = self._hit  # see `Store.hit_path`: loaded, then called
        value = hit(key)
        if value is not ABSENT:
            return value  # type: ignore[no-any-return]
        memo, encoded = self._held.keys(key)
        if kwargs:
            return self._compute(memo, encoded, functools.partial(fn, *args, **kwargs), ())
        return self._compute(memo, encoded, fn, args)

    @overload
    def memoize(self, fn: Callable[P, V], /) -> Callable[P, V]: ...
    @overload
    def memoize(self, *, key: Callable[P, K]) -> Callable[[Callable[P, V]], Callable[P, V]]: ...
    def memoize(self, fn: Any = None, *, key: Any = None) -> Any:
        """Decorate a plain function so its calls go through `get_or_compute`.

        Keys as for `Store.memoize`, whatever the codec: the JSON list of the
        call's arguments, defaults applied (so `store.get([1, 2])` reads what
        `f(1, 2)` stored, and an async `Store.memoize` of the same namespace
        shares the entries), or `key(*args, **kwargs)`.
        """

        def decorate(fn: Callable[..., V]) -> Callable[..., V]:
            refuse_async(fn)
            name = getattr(fn, "__qualname__", repr(fn))
            keys = None
            if key is None:
                self._memoized = claim_memoized(self._memoized, name, self._store.storage)
                keys = CallKeys(fn, name)

            @functools.wraps(fn)
            def memoized(*args: Any, **kwargs: Any) -> V:
                # `event_loop_here()`, inlined (see there why)
                if (
                    running_asyncio_loop() is not None or sniffio_thread.name is not None
                ) and waiting_refused():
                    raise refused(f"{name}() (memoized)")
                call = functools.partial(fn, *args, **kwargs)
                if keys is None:
                    given = key(*args, **kwargs)
                    value = self._hit(given)
                    if value is not ABSENT:
                        return value  # type: ignore[no-any-return]
                    memo, encoded = self._held.keys(given)
                    return self._compute(memo, encoded, call, ())
                encoded = keys.encoded(args, kwargs)
                value = self._hit(encoded, True)
                if value is not ABSENT:
                    return value  # type: ignore[no-any-return]
                return self._compute(encoded, encoded, call, ())

            return memoized

        return decorate if fn is None else decorate(fn)

    def purge_key(self, key: K) -> Purged | Failed:
        """Forget one key here and delete it from the storage."""
        refuse_event_loop_thread("purge_key()")
        return self._loop.call(self._store.purge_key, key)

    def purge(self) -> Purged | Failed:
        """Forget everything here and delete the namespace from the storage."""
        refuse_event_loop_thread("purge()")
        return self._loop.call(self._store.purge)

    # --- internals -------------------------------------------------------------

    def _read_here(self, memo: bytes | str, encoded: bytes) -> Any:
        """A key not held, read on this thread: `(value, held form)`, or `ABSENT`.

        `ABSENT` when the storage cannot answer here or does not hold it:
        then the loop's `get` decides (and explains a first miss, or notes an
        undecodable value). Concurrent threads each read; the reads are local
        and cheap.
        """
        held = self._held
        if held.is_undecodable(encoded) or self._store.ttl is not None:
            # With a ttl, the loop's read judges the entry's age (`Store._fetch`).
            return ABSENT
        since = held.changes
        data = self._store.storage.get_blocking(encoded)
        if data is None:
            return ABSENT
        return held.adopt(memo, encoded, data, since)

    def _compute(
        self, memo: bytes | str, encoded: bytes, fn: Callable[..., V], args: tuple[Any, ...]
    ) -> V:
        """A key not in memory: read here, else through the store, one run for all threads."""
        refuse_async(fn)  # before anything runs: its coroutine would never be awaited
        held = self._held
        mine: list[V] = []  # what this thread's own run hands it

        def lead() -> tuple[Any, bool]:
            found = self._read_here(memo, encoded)
            if found is not ABSENT:
                held.counted(memo)
                mine.append(found[0])
                return found[1], True
            shared = self._through_the_store(memo, encoded, fn, args)
            mine.append(held.serve(memo, shared[0]))
            return shared

        shared, was_found = self._flights.run_blocking(
            encoded,
            lead,
            owner=threading.current_thread(),
            itself=functools.partial(waits_for_itself, fn, self._store.storage, memo),
        )
        if mine:
            return mine[0]
        # A waiter counts as the run counted its starter: a hit, or a miss.
        if was_found:
            held.counted(memo)
        else:
            self._loop.soon(held.missed)
        return held.serve(memo, shared)

    def _through_the_store(
        self, memo: bytes | str, encoded: bytes, fn: Callable[..., V], args: tuple[Any, ...]
    ) -> tuple[Any, bool]:
        """`Store.compute_held` on the loop thread, with `fn` run on this thread.

        The store decides whether to compute, as for an async caller: after
        reading through (a value another process or host stored is returned)
        and, with a remote, holding the fleet's lease on the key, so that one
        host computes it. When it does, it hands the computation back here
        and waits: `fn` is the application's plain function and may block,
        and the store times it (`cost`) and counts it as for an async `fn`.
        An interruption here cancels the store's call (its lease released).
        """
        call = functools.partial(plain, fn, args)

        async def through(ask: Ask[V]) -> tuple[Any, bool]:
            return await self._store.compute_held(memo, encoded, ask, (call,))

        return self._loop.asking(through, hand_back_errors=True)
