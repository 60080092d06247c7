"""What a store holds in memory, and the hit path that hands it out.

A `Store` and its synchronous face (`warmenv.blocking.BlockingStore`) answer
hits from the same memory, so both go through the one hit path here
(`Held.hit`): the lookup, the LRU's order, the hit's count, and the caller's
own copy of the value. Neither face touches what is held any other way.

Each value is held once, in the form that lets every caller have its own
copy: immutable values (`str`, `int`, `float`, `bool`, `None`) as they are,
a `bytes` value boxed in a 1-tuple (a `BytesCodec` store's as they are: they
are their own encoding), anything else as its encoded bytes (what
the storage holds), decoded afresh on each hit. A caller that mutates what it
got therefore never changes what the next caller gets. For JSON, bytes that
already decoded once are decoded by the C scanner directly, skipping the
checks `json.loads` makes for untrusted input; the most used JSON containers
are also held decoded, in a bounded hot set (`warmenv.persistence.hot`), and
a hit on one copies it instead of decoding.

A `JsonCodec` store holds a `str` key's value under the `str` itself, not its
encoding (its "memo"): a hit then costs one dict lookup on a hash the key
already carries. Every other key is held under its encoded bytes; the two
never collide (`str` never equals `bytes`).

What is held changes under a lock, on the event loop's thread and on
warmenv.blocking's threads (reads they made, values they made hot); hits read
without it, each lookup atomic under the GIL.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar, final

from warmenv.persistence.codec import BytesCodec, Codec, JsonCodec, encode_str, scan_canonical
from warmenv.persistence.hot import SAMPLE_EVERY, Hot, HotSet, copied
from warmenv.persistence.statistics import Counters

__all__ = ["ABSENT", "Held"]

K = TypeVar("K")
V = TypeVar("V")

log = logging.getLogger("warmenv.store")

ABSENT: Final[Any] = object()
"""Not held (the hit path's miss), or not readable here."""

Hit = Callable[..., Any]
"""`hit(key, encoded=False, found=ABSENT)`, see `_hit_path`."""

Lookup = Callable[[Any, Any], Any]
"""`lookup(memo, default)`: what is held under `memo` (its held form), else `default`."""

# How a value is held (the hit path tells them apart by exact type):
#   bytes      a mutable value as its codec bytes; each hit decodes a fresh copy
#              (a BytesCodec's value, which is its own encoding: handed out as it is)
#   tuple      a 1-tuple boxing a `bytes` value of another codec, which is immutable
#   Hot        a JSON container also held decoded (the hot set): each hit copies it
#   otherwise  an immutable value, handed out as it is
# Plain bytes for the common case: a bytes subclass would carry a GC header.
_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


@final
class Held(Generic[K, V]):
    """One store's values in memory, at most `limit` of them (least recently used leave)."""

    __slots__ = (
        "__weakref__",
        "_changes",
        "_closed",
        "_counters",
        "_describe",
        "_hits",
        "_lock",
        "_looked_up",
        "_lru",
        "_undecodable",
        "_values",
        "_warned",
        "codec",
        "dropped",
        "hit",
        "hot",
        "json",
        "limit",
        "raw",
    )

    def __init__(
        self,
        codec: Codec[K, V],
        limit: int | None,
        hot_bytes: int,
        counters: Counters | None,
        describe: Callable[[], str],
    ) -> None:
        self.codec = codec
        self.limit = limit
        self.json = type(codec) is JsonCodec
        # A BytesCodec's values are their own encoding, and immutable: held as they are.
        self.raw = type(codec) is BytesCodec
        # Only a JsonCodec's values are known to be plain containers and leaves.
        self.hot = HotSet(hot_bytes if self.json else 0)
        self._lru: OrderedDict[bytes | str, Any] | None = None if limit is None else OrderedDict()
        # Keyed by memo (see `memo`): the key itself for a JsonCodec str key.
        self._values: dict[bytes | str, Any] = {} if self._lru is None else self._lru
        self._describe = describe  # the storage's, for the one warning below
        self._undecodable: set[bytes] = set()
        self._warned = False  # about a value that does not decode: once per store
        # Bumped before and after every write or purge: a read made on another
        # thread (`adopt`) is held only if none overlapped it.
        self._changes = 0
        self._lock = threading.Lock()
        self._closed = False  # `close`: nothing is held any more
        self._counters = counters
        # The hit path's one statistics step: append the key served (None: not counted).
        # Memos (a str key of a JSON store, else the encoded key): encoded at drain.
        self._hits: list[bytes | str] | None = None if counters is None else counters.hits
        self.dropped: Callable[[bytes | str | None], None] | None = None
        """Told each memo whose value leaves memory (None: every one), if set (`_ttl`)."""
        self._looked_up: Callable[[Lookup], Lookup] | None = None  # `look_up_through`
        self.hit: Hit = self._hit_path()
        """The hit path (see `_hit_path`), made once for this store."""

    def __len__(self) -> int:
        return len(self._values)

    # --- the hit path (`_hit_path`, below, makes `hit`) ------------------------------

    def _hit_path(self) -> Hit:
        """`held`'s hit path, made once: a function over what it reads, bound as locals.

        Everything a hit reads is fixed for the store's life (the dict of
        values, the LRU, the statistics' list, the codec), so it is looked up
        here once rather than as attributes on each hit, and everything a hit
        does is written out in the one function below: a call costs a tenth of
        a hit, an attribute a thirtieth.

        Being a function of its own is the price of one home: a `str` hit of
        `Store.get` ran 2,770 machine instructions (callgrind, the awaiting
        loop included) with the path written into `get` (5b3dc65), 3,500 as
        this call, on asyncio and trio alike. What is left of the difference
        is the call itself (its frame, its closure's cells), so the
        signature stays as short as its callers allow and the cells few.
        """
        values_get: Lookup = self._values.get
        if self._looked_up is not None:
            values_get = self._looked_up(values_get)
        lru = self._lru
        move_to_end = None if lru is None else lru.move_to_end
        append = None if self._hits is None else self._hits.append
        codec = self.codec
        encode_key = codec.encode_key
        decode_value = None if self.json else codec.decode_value
        # The key type held under itself, unencoded: a JsonCodec's `str` keys (see
        # `Held.memo`), a BytesCodec's `bytes` keys (its encoding is the key itself).
        own = str if self.json else bytes if self.raw else None
        sampled = self._sampled
        decodes = 0  # every SAMPLE_EVERY-th decode is a sample for the hot set
        absent = ABSENT

        def hit(key: Any, encoded: bool = False, found: Any = absent) -> Any:
            """The caller's own copy of `key`'s value, counted as a hit; `ABSENT` if not held.

            `encoded`: `key` is already the encoded key (a memoized call's
            arguments), held under itself. `found`: the held form to hand out
            (read or computed just now) instead of looking `key` up, not
            counted (its caller counts it: `counted`). Any thread.
            """
            nonlocal decodes
            # Tested in the order a plain hit (`hit(key)`) decides soonest.
            memo: Any = key if type(key) is own or encoded else encode_key(key)
            if found is absent:
                held: Any = values_get(memo, absent)
                if held is absent:
                    return absent
                if append is not None:
                    append(memo)
            else:
                held = found
            if move_to_end is not None:
                try:
                    move_to_end(memo)
                except KeyError:
                    pass  # dropped by another thread just now: still a hit
            kind = type(held)
            if kind is bytes:
                if decode_value is not None:
                    # A BytesCodec's value is held as its own encoding (`own`: bytes).
                    return held if own is bytes else decode_value(held)
                value = scan_canonical(held.decode(), 0)[0]
                # Racing threads may lose a count: it only shifts which decode is a sample.
                decodes += 1
                if decodes & (SAMPLE_EVERY - 1):
                    return value
                return sampled(memo, held, value)
            if kind is Hot:
                value = held.value.copy()  # Hot.copy, inlined
                for inner_key in held.flat:
                    value[inner_key] = value[inner_key].copy()
                for inner_key, inner in held.deep:
                    value[inner_key] = copied(value[inner_key], inner)
                return value
            if kind is tuple:
                return held[0]
            return held

        return hit

    def look_up_through(self, wrap: Callable[[Lookup], Lookup]) -> None:
        """Have the hit path look values up through `wrap(lookup)` from now on.

        `lookup` is the plain one (`Lookup`): a ttl's deadline check
        (`Expiry`) wraps it, so that a hit runs it with the memo the hit path
        computed, the one place a key's memo is made on a hit; a store
        without a ttl looks up in the dict directly, as before.
        """
        self._looked_up = wrap
        self.hit = self._hit_path()

    def serve(self, memo: bytes | str, held: Any) -> V:
        """The caller's own copy of `held` (read or computed just now), not counted."""
        return self.hit(memo, True, held)  # type: ignore[no-any-return]

    def counted(self, memo: bytes | str) -> None:
        """Count a hit on a value found by a read rather than in memory; any thread."""
        if self._hits is not None:
            self._hits.append(memo)

    def missed(self) -> None:
        """Count a lookup that found nothing; on the event loop's thread only."""
        if self._counters is not None:
            self._counters.misses += 1

    def _sampled(self, memo: bytes | str, data: bytes, value: Any) -> Any:
        """`value`, decoded from `data` for a sampled hit: turned hot if the hot set admits it."""
        if not self.hot.sampled(memo, value):
            return value
        with self._lock:
            hot = self.hot.promote(self._values, memo, data, value)
        # `value` is held now; the caller gets a copy of it.
        return value if hot is None else hot.copy()

    # --- keys --------------------------------------------------------------------

    def encode_key(self, key: K) -> bytes:
        """The storage's key for `key`."""
        if self.json and type(key) is str:
            try:
                return encode_str(key).encode("utf-8")  # type: ignore[arg-type]
            except UnicodeEncodeError:
                pass  # the codec says where and why
        return self.codec.encode_key(key)

    def keys(self, key: K) -> tuple[bytes | str, bytes]:
        """What `key`'s value is held under (see `memo`), and the storage's key for it."""
        encoded = self.encode_key(key)
        if self.json and type(key) is str:
            return key, encoded  # type: ignore[return-value]
        return encoded, encoded

    def memo(self, encoded: bytes) -> bytes | str:
        """What the value of the key encoded as `encoded` is held under.

        For a JsonCodec store, the canonical encoding of a `str` key maps to
        that `str` (what `hit` looks up without encoding); anything else,
        including a non-canonical spelling of a string, stays bytes, so that
        only the key that encodes to exactly these bytes finds it.
        """
        if not self.json or encoded[:1] != b'"':
            return encoded
        try:
            text = encoded.decode()
            key, end = scan_canonical(text, 0)
        except (ValueError, StopIteration):  # UnicodeDecodeError is a ValueError
            return encoded
        if end == len(text) and type(key) is str and encode_str(key) == text:
            return key
        return encoded

    # --- what is held ------------------------------------------------------------

    def lookup(self, memo: bytes | str) -> Any:
        """What is held under `memo` (in its held form), or `ABSENT`; no hit counted."""
        return self._values.get(memo, ABSENT)

    def pack(self, value: object, data: bytes) -> Any:
        """The held form of `value`, which encodes to `data`."""
        kind = type(value)
        if kind in _IMMUTABLE:
            return value
        if kind is bytes:
            return data if self.raw else (value,)
        return data

    def data_of(self, held: Any) -> bytes:
        """The encoded form of a held value."""
        if type(held) is bytes:
            return held
        if type(held) is Hot:
            return held.data
        kind = type(held)
        value = held[0] if kind is tuple else held
        return self.codec.encode_value(value)

    @property
    def changes(self) -> int:
        """A count of the writes and purges begun and ended (see `adopt`)."""
        return self._changes

    def changing(self) -> None:
        """Note that a write or a purge begins, or ends: a read overlapping it is stale."""
        self._changes += 1

    def is_undecodable(self, encoded: bytes) -> bool:
        """Whether the storage holds a value for `encoded` that the codec cannot decode."""
        return encoded in self._undecodable

    def forget(self, memo: bytes | str | None) -> None:
        """Drop `memo`'s value (None: every value), and ignore reads that overlap this."""
        with self._lock:
            self._changes += 1
            if memo is None:
                self._values.clear()
                self.hot.clear()
            else:
                self._values.pop(memo, None)
                self.hot.drop(memo)
            if self.dropped is not None:
                self.dropped(memo)

    @property
    def closed(self) -> bool:
        """Whether its environment closed (`close`): it holds nothing any more."""
        return self._closed

    def close(self) -> None:
        """Hold nothing from now on: every lookup misses, so it reaches the closed storage.

        Its environment calls this when it closes: the hit path then finds
        nothing and falls to the miss path, which raises `ClosedError`. The
        hit path itself checks nothing (it costs a hit nothing).
        """
        with self._lock:
            self._closed = True
        self.forget(None)

    def forget_undecodable(self, encoded: bytes | None) -> None:
        """The storage no longer holds `encoded`'s undecodable value (None: any; purged)."""
        if encoded is None:
            self._undecodable.clear()
        else:
            self._undecodable.discard(encoded)

    def keep(self, encoded: bytes, held: Any) -> None:
        """Hold `held` (a held form, see `pack`) for the key encoded as `encoded`."""
        with self._lock:
            self._hold(encoded, held)

    def _hold(self, encoded: bytes, held: Any) -> None:
        """`keep`, with the lock held."""
        if self._closed:
            return  # a read that ended after its environment closed
        self._undecodable.discard(encoded)
        memo = self.memo(encoded)
        self._values[memo] = held
        self.hot.drop(memo)
        lru = self._lru
        if lru is not None:
            lru.move_to_end(memo)
            while len(lru) > self.limit:  # type: ignore[operator]
                dropped, _ = lru.popitem(last=False)
                self.hot.drop(dropped)
                if self.dropped is not None:
                    self.dropped(dropped)

    def remember(self, encoded: bytes, data: bytes) -> Any:
        """Hold the value `data` decodes to, in its held form; `ABSENT` (noted) if it does not."""
        try:
            value = self.codec.decode_value(data)
        except ValueError:
            memo = self.memo(encoded)
            with self._lock:
                self._undecodable.add(encoded)
                self._values.pop(memo, None)
                self.hot.drop(memo)
                if self.dropped is not None:
                    self.dropped(memo)
                warn, self._warned = not self._warned, True
            if warn:
                # Silent, this looked like a cache that never hits: say why, once.
                log.warning(
                    "%s holds a value its codec cannot decode: it is a miss, and the value "
                    "computed next replaces it (a codec that changed needs a new namespace "
                    "version)",
                    self._describe(),
                )
            return ABSENT
        held = self.pack(value, data)
        self.keep(encoded, held)
        return held

    def adopt(self, memo: bytes | str, encoded: bytes, data: bytes, since: int) -> Any:
        """A value read on another thread than the loop's: `(value, held form)`, or `ABSENT`.

        Held unless a write or purge (counted by `changes`, read as `since`
        before the read) overlapped the read, or the key is held already.
        `ABSENT` if the value does not decode: the loop's `get` decides then
        (and notes it). Not counted: the caller counts its hit.
        """
        try:
            value = self.codec.decode_value(data)
        except ValueError:
            return ABSENT
        held = self.pack(value, data)
        with self._lock:
            # A write or purge that overlapped the read may have made it stale.
            if since == self._changes and memo not in self._values:
                self._hold(encoded, held)
        return value, held
