"""The hot set: decoded copies of a JSON store's most used containers.

A `Store` holds each `dict` or `list` value as its JSON and decodes it afresh
on every hit, so that no caller can change what the next one gets. Decoded
objects cost three to four times their JSON in memory, so only the most used
containers are also held decoded here, within `hot_bytes` (the encoded form
stays the backing copy). A hit on one of them copies its containers and
shares its leaves (strings and numbers are immutable), following a copy plan
made once when the value turned hot: a quarter to a half of a decode.

Which values are hot is decided on the decode path alone, so a hit costs no
bookkeeping: every 4th decode is a sample, and a value sampled twice within
2,048 samples enters the hot set, the oldest entrant leaving first. Values
asked for evenly over a large store are seldom sampled twice that soon, and
entries are rationed (one per 32 decodes at most), so no pattern of keys
makes the churn cost more than a small share of the decoding.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from typing import Any, Final, final

__all__ = ["DEFAULT_HOT_BYTES", "SAMPLE_EVERY", "Hot", "HotSet", "copied"]

DEFAULT_HOT_BYTES: Final = 4 * 2**20
"""The default bound on a JSON store's decoded hot set."""
SAMPLE_EVERY: Final = 4
"""A power of two: the store's decode path samples when `count & (SAMPLE_EVERY - 1)` is 0."""
_SLOTS = 1 << 16  # the samples' marks: one byte per `hash(key) & (_SLOTS - 1)`
_ROUND = 2048  # samples before the marks are forgotten
# Promotions are rationed: each sample earns a credit, a promotion costs
# _PROMOTION of them (at most one per _PROMOTION * SAMPLE_EVERY decodes, in
# bursts of up to 8), so keys that come in short bursts and never again cost
# a small share of the decoding time, however many of them there are.
_PROMOTION = 8
_CREDITS = 8 * _PROMOTION
# Per hot value beyond the decoded objects: the Hot itself and its hot-set slot.
_HOT_OVERHEAD = 160

# A copy plan: the keys (or indexes) of the children that are containers of
# leaves only, copied with `.copy()`, and for each child that holds
# containers itself, its key and its own plan. Leaves are shared, never copied.
_Plan = tuple[tuple[Any, ...], tuple[tuple[Any, "_Plan"], ...]]
_LEAVES: _Plan = ((), ())
_STEP = 64  # a plan step's memory: a 2-tuple or a slot, and its index if it is large
_LEAF = 48  # a leaf's memory beyond its characters (counted in the encoded form's length)
_PLAN_DEPTH = 32  # a value nested deeper stays encoded (a plan is followed by recursion)


class _TooDeep(Exception):
    pass


@final
class Hot:
    """A JSON container held decoded (never handed out: each hit gets a copy).

    The store's hit path (`Held.hit`) inlines `copy` (`value.copy()`, then
    `flat`, then `deep` through `copied`): a method call would cost a tenth
    of the hit.
    """

    __slots__ = ("data", "deep", "flat", "size", "value")

    def __init__(self, value: Any, plan: _Plan, size: int, data: bytes) -> None:
        self.value = value
        self.flat, self.deep = plan
        self.size = size
        self.data = data
        """What the store held before (the encoded form), held again when the value leaves."""

    def copy(self) -> Any:
        return copied(self.value, (self.flat, self.deep))


def copied(value: Any, plan: _Plan) -> Any:
    """A copy of a JSON container: new containers, the same (immutable) leaves."""
    copy = value.copy()
    flat, deep = plan
    for key in flat:
        copy[key] = copy[key].copy()
    for key, inner in deep:
        copy[key] = copied(copy[key], inner)
    return copy


def _prepared(value: Any, depth: int = _PLAN_DEPTH) -> tuple[Any, _Plan, int]:
    """`value` made ready to be held hot, its copy plan, and the bytes its containers take.

    The leaves' memory is estimated (their characters are counted by the
    caller, as the length of the encoded form, plus `_LEAF` each here):
    measuring each one would cost as much as the rest of a promotion. Dict
    keys are interned, so every hot value with a key of that name shares one
    string (less memory, and a copy touches fewer objects). `_TooDeep` if it
    nests containers more than `depth` deep.
    """
    if not depth:
        raise _TooDeep
    items: Any
    if type(value) is dict:
        value = {sys.intern(key): item for key, item in value.items()}
        items = value.items()
    else:
        items = enumerate(value)
    size = sys.getsizeof(value) + _LEAF * len(value)
    flat: list[Any] = []
    deep: list[tuple[Any, _Plan]] = []
    for key, item in items:
        kind = type(item)
        if kind is dict or kind is list:
            child, plan, inner = _prepared(item, depth - 1)
            value[key] = child  # an existing key: iterating goes on
            size += inner + _STEP
            if plan == _LEAVES:
                flat.append(key)
            else:
                deep.append((key, plan))
    return value, (tuple(flat), tuple(deep)), size


@final
class HotSet:
    """The decoded copies of one store's hot values, at most `limit` bytes of them.

    Not thread-safe by itself: the store calls `sampled` from any thread
    (racing threads may lose a mark or a credit, which only shifts which
    value turns hot) and everything that changes the set under its lock.
    """

    __slots__ = ("_credits", "_entries", "_marks", "_samples", "_stamp", "limit", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        """The bytes the decoded copies take (estimated, see `_prepared`)."""
        self._entries: OrderedDict[bytes | str, Hot] = OrderedDict()
        self._marks: bytearray | None = None  # allocated at the first sample
        self._stamp = 1
        self._samples = 0
        self._credits = _CREDITS

    def __iter__(self) -> Iterator[bytes | str]:
        """The keys (as the store holds them) of the values held decoded."""
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def sampled(self, memo: bytes | str, value: Any) -> bool:
        """Whether `value`, decoded for a sampled hit on `memo`, should turn hot now.

        A sample marks a byte chosen by the key's hash with the round's stamp,
        and a new round every `_ROUND` samples forgets the marks (a
        doorkeeper, as in TinyLFU): values asked for evenly over a large store
        are seldom sampled twice in a round, and so seldom displace hot ones.
        Two keys that share a byte only make one of them hot early.
        """
        kind = type(value)
        if (kind is not dict and kind is not list) or not self.limit:
            return False
        marks = self._marks
        if marks is None:
            marks = self._marks = bytearray(_SLOTS)
        slot = hash(memo) & (_SLOTS - 1)
        credits = self._credits + 1
        if marks[slot] != self._stamp:
            marks[slot] = self._stamp
            self._credits = min(credits, _CREDITS)
            self._samples += 1
            if self._samples >= _ROUND:
                self._samples = 0
                self._stamp = self._stamp % 255 + 1  # 1 to 255: 0 is "never marked"
            return False
        if credits < _PROMOTION:
            self._credits = credits
            return False  # it stays marked: a later sample may promote it
        self._credits = credits - _PROMOTION
        marks[slot] = 0
        return True

    def promote(
        self, values: MutableMapping[bytes | str, Any], memo: bytes | str, data: bytes, value: Any
    ) -> Hot | None:
        """Hold `value` (decoded from `data`, what `values` holds for `memo`) decoded.

        None if it cannot be: `values` no longer holds `data` (replaced or
        dropped since the hit read it), it nests too deep, or it is larger
        than the whole set. Values that leave to make room get their
        encoded form back in `values`. The store's lock is held.
        """
        if values.get(memo) is not data:
            return None
        try:
            value, plan, size = _prepared(value)
        except _TooDeep:
            return None  # it stays encoded
        size += len(data) + _HOT_OVERHEAD
        if size > self.limit:
            return None
        hot = Hot(value, plan, size, data)
        self._entries[memo] = hot
        self.size += size
        values[memo] = hot  # an existing key: its LRU place does not move
        while self.size > self.limit:
            oldest, out = self._entries.popitem(last=False)
            self.size -= out.size
            if values.get(oldest) is out:
                values[oldest] = out.data
        return hot

    def drop(self, memo: bytes | str) -> None:
        """Forget `memo`'s decoded copy (its value was replaced or dropped); lock held."""
        hot = self._entries.pop(memo, None)
        if hot is not None:
            self.size -= hot.size

    def clear(self) -> None:
        """Forget every decoded copy; lock held."""
        self._entries.clear()
        self.size = 0
