"""How numbers and values are written for people and for JSON: counts, sizes, rates.

One spelling for each, shared by every command, the progress display and
the `stats --html` page: sizes in binary units ("2.1 KiB"), rates as "3,100
entries/s"; counts ("1 entry" but "2 entries") are `warmenv._text.plural`,
which the compiler caches' reports use too.
"""

from __future__ import annotations

import json as jsonlib
from pathlib import Path
from typing import Any

import attrs

from warmenv._keys import PublicKey


def saved(seconds: str, value: float, *, known: bool) -> str:
    """What hits saved, never a number that is not known: `seconds` (the value
    written as seconds) when every entry hit recorded its cost, "at least" it
    when only some did, "unknown" when none did (or none saved any time)."""
    if known:
        return seconds
    return f"at least {seconds}" if value > 0 else "unknown"


def saved_clause(hits: int, seconds: str, value: float, *, known: bool) -> str:
    """ "the hits saved 3.0 s of computation", as `saved` says it, for a summary line."""
    these = "the hit" if hits == 1 else "the hits"
    said = saved(seconds, value, known=known)
    if said == "unknown":
        return f"what {these} saved is unknown (no cost recorded)"
    return f"{these} saved {said} of computation"


def namespace_label(namespace: str, *, text: bool) -> str:
    """A namespace as people see it: one stored as another SQLite type than text
    (something else wrote it: `NamespaceSummary.text` is False) is marked `(not text)`.

    Added here, at display time only: the namespace itself is its name, and
    `--json` carries the flag as `"text"`.
    """
    return namespace if text else f"{namespace} (not text)".lstrip()


def per_second(rate: float) -> str:
    """An entries/s rate as shown: "1 entry/s", "3,100 entries/s"."""
    shown = f"{rate:,.0f}"
    return f"{shown} {'entry' if shown == '1' else 'entries'}/s"


def size(n: int) -> str:
    """A size in bytes as shown: "512 B", "2.1 KiB", "3.0 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def jsonable(value: object) -> object:
    """`value` as something `json.dumps` writes: a path as text, attrs values as dicts."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, PublicKey):
        return str(value)
    if attrs.has(type(value)):
        return attrs.asdict(
            value,  # type: ignore[arg-type]
            recurse=True,
            filter=_shown,
            value_serializer=_key_as_text,
        )
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


def _shown(field: attrs.Attribute[object], value: object) -> bool:
    """Whether a field is output (one marked `metadata={"shown": False}` is not)."""
    return bool(field.metadata.get("shown", True))


def _key_as_text(instance: object, field: object, value: object) -> object:
    return str(value) if isinstance(value, PublicKey) else value


def as_json(value: object) -> Any:
    """An attrs value (report, manifest, summary) as plain JSON data."""
    return jsonlib.loads(jsonlib.dumps(value, default=jsonable))
