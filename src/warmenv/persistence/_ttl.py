"""A store's time-to-live: how old an entry may be and still be a hit.

The rule, once: an entry is fresh while its age, the wall clock
(`storage.wall_clock`) minus its `written_at`, is at most `ttl` seconds; an
older one is a miss, recomputed by `get_or_compute` and replaced. The age is
the entry's, not this process's: an imported entry keeps the write time its
bundle carries (the machine that computed it), a value fetched from the
shared tier the time its host wrote it, so a bundle of day-old entries
imported into a store with `ttl=3600` warms nothing. An entry whose write
time cannot be believed (unknown: written before schema 2, carried by a
format-1 bundle, or NaN; or later than now, from any source) cannot be shown
to be fresh and is a miss (`Expiry.deadline`, the one place this is judged;
the storage records such a time from elsewhere as unknown, never as the
time it arrived).

A store without a ttl never comes here: its hit path looks values up in a
dict. A store with one has its hit path (`Held.hit`, still the one) look
them up through `Expiry.fresh_lookup`, which checks a deadline held beside each
value (`written_at + ttl`, read from the storage in the one read of the
value's row, `Storage.dated`, so a replace cannot pair one entry's value
with another's time) under the memo the hit path made; a value past it is
forgotten and the lookup goes to the storage, which judges its row the same
way. A deadline lives exactly as long as its value is held: `Held`
tells the expiry of every value that leaves memory (evicted, invalidated,
purged), so the deadlines are bounded by `max_entries` as the values are.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable
from typing import Any, final

from warmenv._errors import require_number
from warmenv.persistence import carried
from warmenv.persistence._held import Held, Lookup
from warmenv.persistence.storage import Storage, wall_clock

__all__ = ["Expiry", "check_dated", "check_ttl"]


def check_ttl(ttl: object) -> float | None:
    """`ttl` as seconds: a positive finite number or `timedelta`, or None for no ttl;
    `TypeError` for another type, `ValueError` for a number or duration out of range."""
    if ttl is None:
        return None
    rule = "ttl is seconds (a positive finite number or a timedelta) or None"
    if isinstance(ttl, datetime.timedelta):
        seconds = ttl.total_seconds()
    else:
        seconds = require_number(ttl, rule)  # TypeError: another type
    if not 0 < seconds < math.inf:  # NaN fails this too
        raise ValueError(f"{rule}, got {ttl!r}")
    return float(seconds)


def check_dated(storage: Storage) -> None:
    """Refuse a storage a ttl cannot rely on: one that does not implement `Storage.dated`.

    The protocol gives `dated` no default (two reads cannot be told from one
    entry's value and time), so a `Storage` subclass without its own would
    answer `None` at the first read: refused here, at the store's open, with
    what to add.
    """
    dated = getattr(storage, "dated", None)  # a wrapper may delegate it (`__getattr__`)
    if dated is None or getattr(dated, "__func__", None) is Storage.dated:
        raise TypeError(
            f"{type(storage).__qualname__} does not implement Storage.dated(keys), which a "
            "store with ttl= reads: add it, answering each key's value and write time from "
            "one read of its row (or delegate to a storage that does)"
        )


@final
class Expiry:
    """One store's ttl and the deadline of each value it holds (see the module docstring)."""

    __slots__ = ("_deadlines", "_held", "ttl")

    def __init__(self, ttl: float, held: Held[Any, Any]) -> None:
        self.ttl = ttl
        self._held = held
        # Keyed as the held values are (`Held.memo`); plain dict steps, atomic
        # under the GIL, as the blocking face's threads read it too.
        self._deadlines: dict[bytes | str, float] = {}
        held.dropped = self.forget  # a value leaving memory takes its deadline along
        held.look_up_through(self.fresh_lookup)

    def __len__(self) -> int:
        """How many deadlines are held: at most as many as the values (`max_entries`)."""
        return len(self._deadlines)

    def fresh_lookup(self, lookup: Lookup) -> Lookup:
        """`lookup`, for the hit path, answering only a value whose deadline has not passed.

        A value past its deadline is forgotten on the way (with its deadline),
        and so is not found; one without a deadline is not found either.
        """
        deadlines = self._deadlines
        forget = self._held.forget

        def fresh(memo: Any, default: Any) -> Any:
            deadline = deadlines.get(memo)
            if deadline is None:
                return default
            if deadline < wall_clock():
                deadlines.pop(memo, None)
                forget(memo)
                return default
            return lookup(memo, default)

        return fresh

    def live(self, memo: bytes | str) -> bool:
        """Whether the value held under `memo` is still fresh."""
        deadline = self._deadlines.get(memo)
        return deadline is not None and wall_clock() <= deadline

    def wrote(self, memo: bytes | str) -> None:
        """The value under `memo` was written now (computed or inserted here)."""
        self._deadlines[memo] = wall_clock() + self.ttl

    def forget(self, memo: bytes | str | None) -> None:
        """Drop `memo`'s deadline (None: every one), as its value is dropped."""
        if memo is None:
            self._deadlines.clear()
        else:
            self._deadlines.pop(memo, None)

    async def fresh(
        self, storage: Storage, keys: Iterable[bytes]
    ) -> dict[bytes, tuple[bytes, float]]:
        """The value and deadline of each of `keys` whose stored entry is fresh now.

        The others are left out. Value and write time come from one read of
        each entry (`Storage.dated`).
        """
        found: dict[bytes, tuple[bytes, float]] = {}
        for key, (data, at) in (await storage.dated(keys)).items():
            deadline = self.deadline(at)
            if deadline is not None:
                found[key] = (data, deadline)
        return found

    def deadline(self, written_at: float | None) -> float | None:
        """When an entry written at `written_at` expires, or None if it is not fresh now.

        The one place a write time is judged, whatever it came from (the
        local file, a bundle, the shared tier, a lease's landed value): only
        a time warmenv can believe makes an entry fresh. An unknown one, NaN,
        an infinity, or one more than `carried.CLOCK_SKEW` after now (a wrong
        clock, or a value made to look new) is a miss: a deadline counted from
        a future time would hold the value in memory for as long as its
        writer liked. A time less ahead than that is a fleet's clock
        difference, counted as now.
        """
        now = wall_clock()
        written_at = carried.as_of(written_at, now)  # a little ahead is now (`CLOCK_SKEW`)
        if written_at is None:
            return None
        if not written_at <= now or now - written_at > self.ttl:  # `not <=`: NaN too
            return None
        return written_at + self.ttl

    def hold(self, memo: bytes | str, deadline: float) -> None:
        """The value under `memo`, read from the storage, is fresh until `deadline`."""
        self._deadlines[memo] = deadline
