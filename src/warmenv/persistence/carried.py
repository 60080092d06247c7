"""What an entry carries to another machine in a bundle: when it was written, what it cost.

A bundle of format 2 holds, per entry, `written_at` (unix seconds) and `cost`
(seconds its computation took), so that a hit on the imported entry counts
what it saved. Both come from another machine, possibly from an attacker,
and end up in statistics, so one rule decides what is believed: a number in
[0, limit) is, and anything else (unknown, NaN, an infinity, a negative, an
absurd size, text) is recorded as unknown. The rule is stated here once, in
Python for the flat reader and in SQL for the copies SQLite makes, together
with the 16 bytes a flat bundle and the content digest hold per entry.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

__all__ = [
    "COST_LIMIT",
    "CarryingEntry",
    "UNKNOWN",
    "WRITTEN_AT_LIMIT",
    "CLOCK_SKEW",
    "as_of",
    "as_of_sql",
    "believed",
    "believed_columns_sql",
    "believed_sql",
    "pack",
    "received_sql",
    "typed_sql",
    "unpack",
]

CarryingEntry: TypeAlias = tuple[bytes, bytes, float | None, float | None]
"""An entry of one namespace with what it carries: (key, value, written_at, cost)."""

COST_LIMIT = 604800.0
"""Seconds (a week): a carried cost at or above this is not believed.

Every hit on an imported entry counts its `cost` as seconds saved, so the
limit is the most one hit may claim, and a bundle may come from anyone. The
computations warmenv caches (compilation, autotuning, a model's warm-up) take
seconds to hours, and `get_or_compute` holds its caller for all of it; a
computation of a week or more is not one anybody waited for, while a hostile
or broken bundle claiming it (2**32 seconds, the old limit, is 136 years a
hit) would make "seconds saved" meaningless. Such a cost is recorded as
unknown, as a NaN is: the entry imports and its hits count, saving nothing.
A local computation that really took longer is still recorded where it ran,
but is exported as unknown (export writes only what a reader believes)."""
WRITTEN_AT_LIMIT = 253402300800.0
"""Unix seconds of 10000-01-01 UTC: a written_at at or after it is not believed."""
UNKNOWN = bytes.fromhex("000000000000f87f")
"""The 8 bytes of an unknown value: the quiet NaN 0x7FF8000000000000."""

_PAIR = struct.Struct("<dd")
_PAIR_PACK = _PAIR.pack
_NAN = _PAIR.unpack(UNKNOWN * 2)[0]  # packs back to exactly the bytes of UNKNOWN


def believed(value: object, limit: float) -> float | None:
    """`value` as the environment records it: a number in [0, `limit`), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if 0 <= value < limit:  # False for NaN
        return float(value) + 0.0  # + 0.0: -0.0 is recorded as 0.0
    return None


def believed_sql(column: str, limit: float) -> str:
    """`believed` as an SQL expression over `column` (NULL where not believed).

    No type test is needed: SQLite orders every number below every text and
    blob, so those fail `< limit`, and NULL compares to nothing.
    """
    return f"(CASE WHEN {column} >= 0 AND {column} < {limit!r} THEN {column} + 0.0 END)"


def believed_columns_sql(alias: str = "") -> str:
    """The SQL reading what a row carries, `written_at, cost`, each NULL where not believed."""
    return (
        f"{believed_sql(f'{alias}written_at', WRITTEN_AT_LIMIT)}, "
        f"{believed_sql(f'{alias}cost', COST_LIMIT)}"
    )


CLOCK_SKEW = 5.0
"""Seconds a write time may lie ahead of this host's clock and still be believed (as now).

Hosts of a fleet synchronised by NTP differ by milliseconds: without this,
every value a host a little ahead publishes would be of unknown age, so a
miss for every store with a ttl on the others. Further ahead is not a clock
difference but a wrong clock, or a value made to look new."""


def as_of(written_at: float | None, now: float) -> float | None:
    """When an entry that came from elsewhere counts as written: what it carries if
    that is not later than `now`, `now` if it is at most `CLOCK_SKEW` later, else
    unknown (None).

    A `written_at` further in the future (a wrong clock, or a bundle or shared
    value made to look newest, so that a store's ttl serves it for as long as
    it likes, `gc --keep-versions` keeps its version and evicts the live one,
    and `--older-than` never ages it out) cannot be believed, so it is recorded
    as unknown, as a missing or NaN one is. Unknown is never re-dated to
    `now`: a ttl counts such an entry as a miss (`warmenv.persistence._ttl`),
    and gc ages it as it ages every entry of unknown age.
    """
    if written_at is None or not written_at <= now + CLOCK_SKEW:  # `not <=`: NaN too
        return None
    return written_at if written_at <= now else now


def as_of_sql(believed: str, now: float) -> str:
    """`as_of` as an SQL expression over the believed `written_at` (NULL where unknown)."""
    return (
        f"(CASE WHEN {believed} <= {now!r} THEN {believed}"
        f" WHEN {believed} <= {now + CLOCK_SKEW!r} THEN {now!r} END)"
    )


def received_sql(column: str, now: float) -> str:
    """`as_of(believed(column, WRITTEN_AT_LIMIT), now)` as one SQL expression over the
    carried `written_at` in `column`: what a copy records for a row it takes in.

    The same as `as_of_sql(believed_sql(...))`, which repeats the believed
    expression in each branch (SQLite shares no subexpression: the column read
    and compared up to six times a row), as one CASE of at most three
    comparisons: a negative number is not believed; up to `now` it is; up to
    `CLOCK_SKEW` later it counts as `now`; anything else (later still, text, a
    blob; NULL compares to nothing) is unknown. Only while `now` lies that far
    before `WRITTEN_AT_LIMIT` (the year 10000), else it is the composed form.
    """
    if not now + CLOCK_SKEW < WRITTEN_AT_LIMIT:
        return as_of_sql(believed_sql(column, WRITTEN_AT_LIMIT), now)
    return (
        f"(CASE WHEN {column} < 0 THEN NULL WHEN {column} <= {now!r} THEN {column} + 0.0"
        f" WHEN {column} <= {now + CLOCK_SKEW!r} THEN {now!r} END)"
    )


def typed_sql(alias: str = "") -> str:
    """The condition a format-2 SQLite bundle's row meets: both columns REAL or NULL.

    `IS NULL OR typeof() = 'real'` rather than `typeof() IN ('real', 'null')`:
    the same test, and a scan of 100k rows checks it in about half the time.
    """
    return (
        f"({alias}written_at IS NULL OR typeof({alias}written_at) = 'real') "
        f"AND ({alias}cost IS NULL OR typeof({alias}cost) = 'real')"
    )


def pack(written_at: float | None, cost: float | None) -> bytes:
    """The 16 bytes an entry carries: f64 written_at, f64 cost, unknown as `UNKNOWN`."""
    return _PAIR_PACK(_NAN if written_at is None else written_at, _NAN if cost is None else cost)


def unpack(raw: bytes | memoryview) -> tuple[float | None, float | None]:
    """(written_at, cost) from 16 carried bytes, each believed or None."""
    written_at, cost = _PAIR.unpack(raw)
    # `believed` for two floats, inline: this runs once per entry of a flat import.
    return (
        written_at + 0.0 if 0 <= written_at < WRITTEN_AT_LIMIT else None,
        cost + 0.0 if 0 <= cost < COST_LIMIT else None,
    )
