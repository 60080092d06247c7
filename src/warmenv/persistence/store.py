"""A typed map over one namespace's storage, with an in-process copy.

The storage is the shared truth (other processes, imported bundles); the
store keeps what it has seen in memory so a hit costs a dict lookup, not a
thread hop. `EAGER` loads the whole namespace at open, the mode for start-up
caches; `LAZY` reads each key the first time it is asked for. In both modes
a key the store does not hold is looked up in the storage before it is
reported missing, so a bundle imported while the application serves, or an
entry another process computed, is found rather than recomputed.

Each value is held once, in the form that lets every caller have its own
copy: immutable values (`str`, `int`, `float`, `bool`, `None`, `bytes`) as
they are, anything else as its encoded bytes (what the storage holds),
decoded afresh on each hit. A caller that mutates what it got therefore
never changes what the next caller gets. For JSON, bytes that already
decoded once are decoded by the C scanner directly, skipping the checks
`json.loads` makes for untrusted input.

Decoded objects cost three to four times their JSON in memory, so only the
most used JSON containers are also held decoded, in a bounded hot set
(`warmenv.persistence.hot`); a hit on one copies it instead of decoding.

A `JsonCodec` store holds a `str` key's value under the `str` itself, not
its encoding: a hit then costs one dict lookup on a hash the key already
carries, instead of encoding the key first. Every other key is held under
its encoded bytes; the two never collide (`str` never equals `bytes`).

Concurrent askers of one missing key share one storage read and, in
`get_or_compute`, one run of the computation and its outcome, value or
exception. Across processes and hosts, a storage with a shared tier
arbitrates (`Storage.lease`): one of them computes, the others wait for its
value. Without one, each process runs its own computation and the insert
rules decide whose value the storage keeps.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from types import TracebackType
from typing import (
    Any,
    Final,
    Generic,
    ParamSpec,
    TypeVarTuple,
    final,
    overload,
)

import anyio
import attrs

from warmenv.persistence.codec import Codec, JsonCodec, canonical_arguments
from warmenv.persistence.codec import _encode_str as _encode_json_str
from warmenv.persistence.codec import _scan_canonical as _scan_json
from warmenv.persistence.explain import explain_first_miss
from warmenv.persistence.hot import DEFAULT_HOT_BYTES, SAMPLE_EVERY, Hot, HotSet, copied
from warmenv.persistence.statistics import Counters
from warmenv.persistence.storage import Conflict, Failed, Insertion, Purged, Storage, Stored

log = logging.getLogger("warmenv.store")

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
Ts = TypeVarTuple("Ts")


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


# How a value is held (the hit path tells them apart by exact type):
#   bytes      a mutable value as its codec bytes; each hit decodes a fresh copy
#   tuple      a 1-tuple boxing a `bytes` value, which is immutable
#   Hot        a JSON container also held decoded (the hot set): each hit copies it
#   otherwise  an immutable value, handed out as it is
# Plain bytes for the common case: a bytes subclass would carry a GC header.
_ABSENT: Any = object()
# Values handed out as they are: nothing a caller does can change them.
_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


@attrs.define(eq=False)
class _Flight:
    """One shared run (a storage read, or a computation) for one key."""

    done: anyio.Event = attrs.field(factory=anyio.Event)
    outcome: Any = _ABSENT
    error: Exception | None = None
    traceback: TracebackType | None = None
    abandoned: bool = False
    """The starter was cancelled (or interrupted): a waiter starts a new run."""


@final
class Store(Generic[K, V]):
    """Typed keys to typed values over a `Storage`, with a local copy."""

    __slots__ = (
        "_changes",
        "_codec",
        "_computes",
        "_counters",
        "_decodes",
        "_epoch",
        "_hits",
        "_hot",
        "_json",
        "_limit",
        "_lock",
        "_lru",
        "_memoized",
        "_mode",
        "_reads",
        "_storage",
        "_undecodable",
        "_values",
        "_warned",
    )

    def __init__(
        self,
        storage: Storage,
        codec: Codec[K, V],
        mode: CacheMode,
        max_entries: int | None = None,
        counters: Counters | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
    ) -> None:
        if max_entries is not None and (type(max_entries) is not int or max_entries < 1):
            raise ValueError(f"max_entries must be a positive int or None, got {max_entries!r}")
        if type(hot_bytes) is not int or hot_bytes < 0:
            raise ValueError(f"hot_bytes must be an int >= 0, got {hot_bytes!r}")
        self._storage = storage
        self._codec = codec
        self._mode = mode
        self._limit = max_entries
        self._lru: OrderedDict[bytes | str, Any] | None = (
            None if max_entries is None else OrderedDict()
        )
        # Keyed by `_memo(encoded)`: the key itself for a JsonCodec str key.
        self._values: dict[bytes | str, Any] = {} if self._lru is None else self._lru
        self._json = type(codec) is JsonCodec
        # Only a JsonCodec's values are known to be plain containers and leaves.
        self._hot = HotSet(hot_bytes if self._json else 0)
        self._decodes = 0  # counted on the hit path: every SAMPLE_EVERY-th is a sample
        self._undecodable: set[bytes] = set()
        self._warned = False  # about a value that does not decode: once per store
        self._reads: dict[bytes, _Flight] = {}
        self._computes: dict[bytes, _Flight] = {}
        self._epoch = 0
        # Bumped before and after every write or purge: a read made on another
        # thread (`_read_here`) is held only if none overlapped it.
        self._changes = 0
        self._lock = threading.Lock()
        self._memoized: str | None = None
        self._counters = counters
        # The hit path's one statistics step: append the key served (None: not counted).
        # Memos (a str key of a JSON store, else the encoded key): encoded at drain.
        self._hits: list[bytes | str] | None = None if counters is None else counters.hits

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
    ) -> Store[Any, Any]:
        """A store over `storage`; in `EAGER` mode this loads the namespace.

        `max_entries` bounds the values held in memory (least recently used
        dropped first; they stay in the storage and are read back on demand).
        An `EAGER` store with a bound loads the first `max_entries` in key order.
        `counters` (handed out by an environment) count its hits, misses and
        computations for `Environment.statistics()`. `hot_bytes` bounds the
        memory of the decoded copies a `JsonCodec` store keeps of its most used
        `dict` and `list` values (0: none; each hit then decodes).
        """
        store: Store[Any, Any] = cls(
            storage,
            JsonCodec() if codec is None else codec,
            mode,
            max_entries,
            counters,
            hot_bytes,
        )
        if mode is CacheMode.EAGER:
            await store._load()
        return store

    @property
    def storage(self) -> Storage:
        """The storage under this store."""
        return self._storage

    @property
    def mode(self) -> CacheMode:
        """When this store reads its storage."""
        return self._mode

    @property
    def max_entries(self) -> int | None:
        """The most values held in memory, or `None` for no bound."""
        return self._limit

    @property
    def hot_bytes(self) -> int:
        """The most memory held by decoded copies of hot values (0 for a non-JSON codec)."""
        return self._hot.limit

    def __len__(self) -> int:
        """Values held in memory (in `LAZY` mode, or with a bound, not all stored ones)."""
        return len(self._values)

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
        # _memo_of, inlined: this is the hit path.
        memo: Any = key if type(key) is str and self._json else self._codec.encode_key(key)
        held: Any = self._values.get(memo, _ABSENT)
        if held is _ABSENT:
            held = await self._read(self._encode_key(key))
            if held is _ABSENT:
                self._missed()
                return default
        elif self._lru is not None:
            try:
                self._lru.move_to_end(memo)
            except KeyError:
                pass  # dropped by a warmenv.blocking thread just now: still a hit
        if self._hits is not None:
            self._hits.append(memo)
        kind = type(held)
        if kind is Hot:
            value = held.value.copy()  # Hot.copy, inlined
            for inner_key in held.flat:
                value[inner_key] = value[inner_key].copy()
            for inner_key, inner in held.deep:
                value[inner_key] = copied(value[inner_key], inner)
            return value
        if kind is bytes:
            if not self._json:
                return self._codec.decode_value(held)
            value = _scan_json(held.decode(), 0)[0]  # _decoded, inlined
            self._decodes = count = self._decodes + 1
            if count & (SAMPLE_EVERY - 1):
                return value
            return self._sampled(memo, held, value)
        if kind is tuple:
            return held[0]
        return held

    def get_nowait(self, key: K) -> V:
        """The value for `key` if it is held in memory, without awaiting.

        Raises `anyio.WouldBlock` when answering needs a storage read (then
        `await get(key)`). Safe to call from another thread than the store's
        event loop: it looks up and reorders dicts, each step atomic under the
        GIL, and changes what the store holds only under its lock.
        """
        memo = self._memo_of(key)
        held = self._values.get(memo, _ABSENT)
        if held is _ABSENT:
            raise anyio.WouldBlock
        if self._lru is not None:
            try:
                self._lru.move_to_end(memo)
            except KeyError:
                pass  # dropped by another thread just now: still a hit
        if self._hits is not None:
            self._hits.append(memo)
        return self._handout(memo, held)

    def _handout(self, memo: bytes | str, held: Any) -> V:
        """The caller's own copy of the held value (decoded, or a copy of a hot one)."""
        if type(held) is bytes:
            return self._decoded(memo, held)  # type: ignore[no-any-return]
        return self._unpack(held)  # type: ignore[no-any-return]

    async def insert(self, key: K, value: V) -> Insertion:
        """Store `value`; a value the store already holds does not reach the storage."""
        encoded = self._encode_key(key)
        result, _ = await self._put(encoded, self._codec.encode_value(value), keep_failed=False)
        return result

    async def get_or_compute(self, key: K, fn: Callable[[*Ts], Awaitable[V]], *args: *Ts) -> V:
        """The stored value, or `await fn(*args)` run once for every concurrent asker.

        Askers that arrive while a run is in progress wait for it and share its
        outcome: its value, or the exception it raised (the next call then
        starts a new run). A waiter that is cancelled stops waiting and the run
        goes on. If the task running `fn` is cancelled, the run is abandoned and
        one of the waiters starts a new one with its own `fn(*args)`, so no
        waiter is left without an answer or handed a cancellation not its own.
        If the storage already holds another value for the key (another
        process got there first), that value wins and is returned.
        """
        memo: Any = key if type(key) is str and self._json else self._codec.encode_key(key)
        held: Any = self._values.get(memo, _ABSENT)
        if held is _ABSENT:
            held = await self._compute(memo, self._encode_key(key), fn, args)
        else:
            if self._lru is not None:
                try:
                    self._lru.move_to_end(memo)
                except KeyError:
                    pass  # dropped by a warmenv.blocking thread just now: still a hit
            if self._hits is not None:
                self._hits.append(memo)
        kind = type(held)
        if kind is Hot:
            value = held.value.copy()  # Hot.copy, inlined
            for inner_key in held.flat:
                value[inner_key] = value[inner_key].copy()
            for inner_key, inner in held.deep:
                value[inner_key] = copied(value[inner_key], inner)
            return value  # type: ignore[no-any-return]
        if kind is bytes:
            if not self._json:
                return self._codec.decode_value(held)
            value = _scan_json(held.decode(), 0)[0]  # _decoded, inlined
            self._decodes = count = self._decodes + 1
            if count & (SAMPLE_EVERY - 1):
                return value  # type: ignore[no-any-return]
            return self._sampled(memo, held, value)  # type: ignore[no-any-return]
        if kind is tuple:
            return held[0]  # type: ignore[no-any-return]
        return held  # type: ignore[no-any-return]

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
            signature = None
            if key is None:
                if self._memoized not in (None, name):
                    raise ValueError(
                        f"{self._storage.describe()} already memoizes {self._memoized}();"
                        f" give {name}() its own namespace, or pass key= to tell their keys apart"
                    )
                self._memoized = name
                signature = inspect.signature(fn)

            @functools.wraps(fn)
            async def memoized(*args: Any, **kwargs: Any) -> V:
                if signature is None:
                    given = key(*args, **kwargs)
                    memo = self._memo_of(given)
                else:
                    bound = signature.bind(*args, **kwargs)
                    bound.apply_defaults()
                    memo = canonical_arguments(bound.arguments, f"{name}()")  # a list: bytes
                held = self._values.get(memo, _ABSENT)
                if held is _ABSENT:
                    encoded = memo if type(memo) is bytes else self._encode_key(given)
                    held = await self._compute(
                        memo, encoded, functools.partial(fn, *args, **kwargs), ()
                    )
                else:
                    if self._lru is not None:
                        try:
                            self._lru.move_to_end(memo)
                        except KeyError:
                            pass  # dropped by a warmenv.blocking thread just now
                    if self._hits is not None:
                        self._hits.append(memo)
                if type(held) is bytes:
                    return self._decoded(memo, held)  # type: ignore[no-any-return]
                return self._unpack(held)  # type: ignore[no-any-return]

            return memoized

        return decorate if fn is None else decorate(fn)

    async def purge_key(self, key: K) -> Purged | Failed:
        """Forget one key here and delete it from the storage."""
        encoded = self._encode_key(key)
        self._epoch += 1
        memo = self._memo(encoded)
        self._undecodable.discard(encoded)
        try:
            self._forget(memo)
            return await self._storage.purge_key(encoded)
        finally:
            self._forget(memo)  # and what a thread read while the delete ran (`_read_here`)

    async def purge(self) -> Purged | Failed:
        """Forget everything here and delete the namespace from the storage."""
        self._epoch += 1
        self._undecodable.clear()
        try:
            self._forget(None)
            return await self._storage.purge()
        finally:
            self._forget(None)  # and what threads read while the delete ran

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

    # --- internals -------------------------------------------------------------

    def _encode_key(self, key: K) -> bytes:
        if self._json and type(key) is str:
            try:
                return _encode_json_str(key).encode("utf-8")  # type: ignore[arg-type]
            except UnicodeEncodeError:
                pass  # the codec says where and why
        return self._codec.encode_key(key)

    def _memo_of(self, key: K) -> bytes | str:
        """What `key`'s value is held under (see `_memo`), without encoding a str key."""
        if self._json and type(key) is str:
            return key  # type: ignore[return-value]
        return self._codec.encode_key(key)

    def _memo(self, encoded: bytes) -> bytes | str:
        """What the value of the key encoded as `encoded` is held under.

        For a JsonCodec store, the canonical encoding of a `str` key maps to
        that `str` (what `get` looks up without encoding); anything else,
        including a non-canonical spelling of a string, stays bytes, so that
        only the key that encodes to exactly these bytes finds it.
        """
        if not self._json or encoded[:1] != b'"':
            return encoded
        try:
            text = encoded.decode()
            key, end = _scan_json(text, 0)
        except (ValueError, StopIteration):  # UnicodeDecodeError is a ValueError
            return encoded
        if end == len(text) and type(key) is str and _encode_json_str(key) == text:
            return key
        return encoded

    def _unpack(self, held: Any) -> Any:
        """The value `held` stands for, a copy of its own for a container; any thread."""
        kind = type(held)
        if kind is Hot:
            return held.copy()
        if kind is bytes:
            if self._json:
                return _scan_json(held.decode(), 0)[0]
            return self._codec.decode_value(held)
        if kind is tuple:
            return held[0]
        return held

    def _pack(self, value: object, data: bytes) -> Any:
        kind = type(value)
        if kind in _IMMUTABLE:
            return value
        if kind is bytes:
            return (value,)
        return data

    def _data_of(self, held: Any) -> bytes:
        if type(held) is bytes:
            return held
        if type(held) is Hot:
            return held.data
        return self._codec.encode_value(self._unpack(held))

    # What a store holds changes under `_lock`, on the event loop's thread and
    # on warmenv.blocking's threads (reads they made, values they made hot);
    # hits read without it, each lookup atomic under the GIL.

    def _forget(self, memo: bytes | str | None) -> None:
        """Drop `memo`'s value (None: every value), and ignore reads that overlap this."""
        with self._lock:
            self._changes += 1
            if memo is None:
                self._values.clear()
                self._hot.clear()
            else:
                self._values.pop(memo, None)
                self._hot.drop(memo)

    def _keep(self, encoded: bytes, held: Any) -> None:
        with self._lock:
            self._hold(encoded, held)

    def _hold(self, encoded: bytes, held: Any) -> None:
        """`_keep`, with `_lock` held."""
        self._undecodable.discard(encoded)
        memo = self._memo(encoded)
        self._values[memo] = held
        self._hot.drop(memo)
        lru = self._lru
        if lru is not None:
            lru.move_to_end(memo)
            while len(lru) > self._limit:  # type: ignore[operator]
                dropped, _ = lru.popitem(last=False)
                self._hot.drop(dropped)

    def _remember(self, encoded: bytes, data: bytes) -> Any:
        """Hold the value `data` decodes to; `_ABSENT` (and noted) if it does not."""
        try:
            value = self._codec.decode_value(data)
        except ValueError:
            memo = self._memo(encoded)
            with self._lock:
                self._undecodable.add(encoded)
                self._values.pop(memo, None)
                self._hot.drop(memo)
                warn, self._warned = not self._warned, True
            if warn:
                # Silent, this looked like a cache that never hits: say why, once.
                log.warning(
                    "%s holds a value its codec cannot decode: it is a miss, and the value "
                    "computed next replaces it (a codec that changed needs a new namespace "
                    "version)",
                    self._storage.describe(),
                )
            return _ABSENT
        held = self._pack(value, data)
        self._keep(encoded, held)
        return held

    def _decoded(self, memo: bytes | str, data: bytes) -> Any:
        """A fresh decode of the held `data` for a hit (any thread), sampled for the hot set."""
        if not self._json:
            return self._codec.decode_value(data)
        value = _scan_json(data.decode(), 0)[0]
        # Racing threads may lose a count: it only shifts which decode is a sample.
        self._decodes = count = self._decodes + 1
        if count & (SAMPLE_EVERY - 1):
            return value
        return self._sampled(memo, data, value)

    def _sampled(self, memo: bytes | str, data: bytes, value: Any) -> Any:
        """`value`, decoded from `data` for a sampled hit: turned hot if the hot set admits it."""
        if not self._hot.sampled(memo, value):
            return value
        with self._lock:
            hot = self._hot.promote(self._values, memo, data, value)
        # `value` is held now; the caller gets a copy of it.
        return value if hot is None else hot.copy()

    async def _load(self) -> None:
        rows = self._storage.scan()
        try:
            async for encoded, data in rows:
                self._remember(encoded, data)
                if self._limit is not None and len(self._values) >= self._limit:
                    break
        finally:
            if isinstance(rows, AsyncGenerator):
                await rows.aclose()

    async def _read(self, encoded: bytes) -> Any:
        """Read one key through to the storage, sharing the read with concurrent askers."""
        return await self._share(self._reads, encoded, functools.partial(self._fetch, encoded))

    async def _fetch(self, encoded: bytes) -> Any:
        epoch = self._epoch
        data = await self._storage.get(encoded)
        if data is None:
            await explain_first_miss(self._storage, encoded)
        held = self._values.get(self._memo(encoded), _ABSENT)
        if held is not _ABSENT or epoch != self._epoch:
            # An insert or purge here overtook the read: it is newer than what was read.
            return held
        return _ABSENT if data is None else self._remember(encoded, data)

    def _read_here(self, memo: bytes | str, encoded: bytes) -> Any:
        """For `warmenv.blocking`: a key not held, read on this thread, not the loop's.

        The value (a decode of its own), or `_ABSENT` when the storage cannot
        answer here or does not hold it: then ask `get` on the event loop,
        which decides (and explains a first miss, or notes an undecodable
        value). Concurrent threads each read; the reads are local and cheap.
        """
        if encoded in self._undecodable:
            return _ABSENT
        changes = self._changes
        data = self._storage.get_blocking(encoded)
        if data is None:
            return _ABSENT
        try:
            value = self._codec.decode_value(data)
        except ValueError:
            return _ABSENT
        held = self._pack(value, data)
        with self._lock:
            # A write or purge that overlapped the read may have made it stale.
            if changes == self._changes and memo not in self._values:
                self._hold(encoded, held)
        if self._hits is not None:
            self._hits.append(memo)
        return value

    async def _compute(
        self,
        memo: bytes | str,
        encoded: bytes,
        fn: Callable[[*Ts], Awaitable[V]],
        args: tuple[*Ts],
    ) -> Any:
        """The held value for a key not in memory: read through, else one shared run.

        Every asker sharing the run counts once: a hit if it found a stored
        value, a miss if the value had to be computed (by this run's `fn`).
        """
        held, found = await self._share(
            self._computes, encoded, functools.partial(self._fill, encoded, fn, args)
        )
        if found:
            if self._hits is not None:
                self._hits.append(memo)
        else:
            self._missed()
        return held

    def _missed(self) -> None:
        """Count a lookup that found nothing (on the event loop's thread)."""
        if self._counters is not None:
            self._counters.misses += 1

    async def _fill(
        self, encoded: bytes, fn: Callable[[*Ts], Awaitable[V]], args: tuple[*Ts]
    ) -> tuple[Any, bool]:
        """What this store now holds for the key, and whether it was found (not computed)."""
        held = await self._read(encoded)
        if held is not _ABSENT:
            return held, True
        # Fleet-wide single flight: with a shared tier, one host computes the
        # key at a time and the others get its value (`Storage.lease`).
        async with self._storage.lease(encoded) as landed:
            if landed is not None:
                held = self._remember(encoded, landed)
                if held is not _ABSENT:
                    return held, True
            start = time.perf_counter()
            value = await fn(*args)
            cost = time.perf_counter() - start
            if self._counters is not None:
                self._counters.computed(cost)
            data = self._codec.encode_value(value)
            _, held = await self._put(encoded, data, keep_failed=True, cost=cost)
        return held, False

    async def _put(
        self, encoded: bytes, data: bytes, *, keep_failed: bool, cost: float | None = None
    ) -> tuple[Insertion, Any]:
        """Insert `data`, returning the outcome and what this store now holds for the key."""
        held = self._values.get(self._memo(encoded), _ABSENT)
        if held is not _ABSENT and self._data_of(held) == data:
            return Stored(), held
        self._changes += 1  # a thread's read that overlaps the write is not kept (`_adopt`)
        try:
            if encoded in self._undecodable:
                result: Insertion = await self._storage.replace(encoded, data, cost=cost)
            else:
                result = await self._storage.insert(encoded, data, cost=cost)
                if isinstance(result, Conflict):
                    existing = self._remember(encoded, result.existing)
                    if existing is not _ABSENT:
                        return result, existing
                    result = await self._storage.replace(encoded, data, cost=cost)
            held = self._pack(self._codec.decode_value(data), data)
            if isinstance(result, Stored) or keep_failed:
                # After a failed write the value is still served from memory: the
                # storage is a cache, and recomputing would not make it writable.
                self._keep(encoded, held)
            return result, held
        finally:
            self._changes += 1

    async def _share(
        self, flights: dict[bytes, _Flight], encoded: bytes, run: Callable[[], Awaitable[Any]]
    ) -> Any:
        """`await run()` once for every concurrent caller with this key; all share its outcome."""
        while True:
            flight = flights.get(encoded)
            if flight is None:
                flight = flights[encoded] = _Flight()
                try:
                    flight.outcome = await run()
                except Exception as exc:
                    flight.error, flight.traceback = exc, exc.__traceback__
                    raise
                except BaseException:
                    # Cancellation is the starter's, not an outcome to share.
                    flight.abandoned = True
                    raise
                finally:
                    if flights.get(encoded) is flight:
                        del flights[encoded]
                    flight.done.set()
                return flight.outcome
            await flight.done.wait()
            if flight.abandoned:
                continue
            if flight.error is not None:
                raise flight.error.with_traceback(flight.traceback)
            return flight.outcome
