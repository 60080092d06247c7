"""Why a lookup misses: the namespaces nearby that hold what was asked for elsewhere.

Almost every surprising cold start has the same cause: the entries are there,
under a namespace that differs from the one asked for in one segment. A new
release bumped the version, a bundle was captured with another path, an
application was renamed. An explanation lists the namespaces this environment
holds that share the asked one's name and differ in its version or path (or
share both of those and differ in the name), which segments differ, how many
entries each holds and whether the key is there: "app/2/kernels misses, but
app/1/kernels holds 1,200 entries including this key" is the answer the user
needed, and the closest candidates come first.

Each storage answers `Storage.explain(key)` from what it holds (its
namespace counts, and one indexed lookup of the key per candidate, so an
explanation over a thousand namespaces costs milliseconds); a storage with a
shared tier asks its local one. This module holds what they share: which
namespaces are near, in which order, and how it reads.
`WARMENV_EXPLAIN_MISSES=1` logs the explanation (logger `warmenv.explain`,
INFO) the first time a namespace misses in this process; the store calls
`explain_first_miss` on each miss, which returns at once unless the variable
is set.

This module sits a floor below `warmenv.persistence.storage`, whose protocol
returns an `Explanation`: it imports nothing of the storage, and the miss hook
is handed the storage's two methods it calls, not the storage.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import attrs

from warmenv._text import plural
from warmenv.persistence.codec import JsonCodec
from warmenv.persistence.namespace import Namespace

__all__ = ["Explanation", "Nearby", "explain", "explain_first_miss", "stored_key"]

log = logging.getLogger("warmenv.explain")

SEGMENTS: Final = ("name", "version", "path")
# How many nearby namespaces `str()` spells out; the rest are counted.
_SHOWN = 10
_VARIABLE = "WARMENV_EXPLAIN_MISSES"
# Which difference is the likelier cause: a new version, then another path, then a rename.
_NEARNESS: Final = {"version": 0, "path": 1, "name": 2}


@attrs.frozen
class Nearby:
    """A namespace the environment holds that differs from the asked one in `differs`."""

    namespace: str
    differs: tuple[str, ...]
    """The segments that differ, out of `"name"`, `"version"` and `"path"`."""
    entries: int
    has_key: bool | None
    """Whether the asked key is stored under this namespace (`None`: no key was asked)."""


@attrs.frozen
class Explanation:
    """Why `namespace` (and `key`) may miss here; `str()` says it in a few lines."""

    namespace: str
    key: bytes | None
    entries: int
    """Entries stored under the asked namespace itself."""
    has_key: bool | None
    """Whether the key is stored under the asked namespace (`None`: no key was asked)."""
    nearby: tuple[Nearby, ...]
    """The namespaces that differ only in some segments, nearest first."""

    def __str__(self) -> str:
        asked = f"namespace {self.namespace!r}"
        if self.key is None:
            head = f"{asked} holds {_entries(self.entries)}"
        elif self.has_key:
            head = f"{asked} holds key {_key(self.key)}: a lookup of it hits"
        elif self.entries:
            head = f"{asked} holds {_entries(self.entries)}, but not key {_key(self.key)}"
        else:
            head = f"{asked} holds no entries, so key {_key(self.key)} misses"
        if not self.nearby:
            # "Nothing like it" only where the namespace itself is empty: of one that holds
            # entries (or the very key), something was computed or imported.
            nothing = (
                ""
                if self.entries
                else (" (nothing like it was computed or imported in this environment)")
            )
            return (
                f"{head}; no other namespace here differs from it only in its version or "
                f"path{nothing}"
            )
        lines = [f"{head}; nearest namespaces here:"]
        lines += [f"  {self._describe(n)}" for n in self.nearby[:_SHOWN]]
        if len(self.nearby) > _SHOWN:
            lines.append(f"  and {plural(len(self.nearby) - _SHOWN, 'more namespace')}")
        return "\n".join(lines)

    def differences(self, nearby: Nearby) -> str:
        """How `nearby` differs from the asked namespace: "version '1' instead of '2'"."""
        asked = Namespace.raw(self.namespace)
        there = Namespace.raw(nearby.namespace)
        if _swapped(asked, there):
            return f"version and path swapped: did you mean {nearby.namespace!r}?"
        said, unnamed = [], []
        for segment in nearby.differs:
            mine, theirs = getattr(asked, segment), getattr(there, segment)
            if mine:
                said.append(f"{segment} {theirs!r} instead of {mine!r}")
            else:  # `explain myapp`: a name alone has no version or path to compare
                said.append(f"{segment} {theirs!r}")
                unnamed.append(segment)
        missing = f" ({self.namespace!r} has no {' or '.join(unnamed)} segment)" if unnamed else ""
        return ", ".join(said) + missing

    def _describe(self, nearby: Nearby) -> str:
        key = ""
        if nearby.has_key is not None:
            key = "; holds the key" if nearby.has_key else "; not the key"
        return (
            f"- {nearby.namespace!r}: {self.differences(nearby)}; {_entries(nearby.entries)}{key}"
        )


def _entries(count: int) -> str:
    return "no entries" if count == 0 else plural(count, "entry", "entries")


def _key(key: bytes) -> str:
    try:
        return key.decode("utf-8")  # a JSON key reads as itself: "k1", [1, 2]
    except UnicodeDecodeError:
        return repr(key)


def differing(asked: Namespace, other: Namespace) -> tuple[str, ...] | None:
    """The segments in which `other` differs from `asked`, if it is near enough to list.

    Near means: the same name (another version or path), or the same version
    and path (another name). Two namespaces that share nothing but, say, the
    version "1" say nothing about each other.
    """
    differs = tuple(s for s in SEGMENTS if getattr(asked, s) != getattr(other, s))
    if not differs:
        return None
    if "name" in differs and len(differs) > 1:
        return None
    return differs


def _swapped(asked: Namespace, other: Namespace) -> bool:
    """Whether `other` is `asked` with its version and path the other way round."""
    return other.name == asked.name and other.version == asked.path and other.path == asked.version


def stored_key(key: bytes | str | None) -> bytes | None:
    """The key to ask about: a `str` is what an application passes to a store of
    the default codec, so it is asked about as that store keeps it."""
    return JsonCodec[str, object]().encode_key(key) if isinstance(key, str) else key


def explain(
    counts: Iterable[tuple[str, int]],
    namespace: Namespace | str,
    key: bytes | None,
    holding: Callable[[list[str], bytes], set[str]],
) -> Explanation:
    """The explanation for `namespace`/`key` given an environment's namespaces.

    `counts` holds each namespace with its number of entries;
    `holding(namespaces, key)` answers which of `namespaces` store `key`. Both
    come from the storage explaining itself (`Storage.explain`), which calls
    this where it reads (on the database's thread for SQLite: one hop).
    """
    asked = Namespace.coerce(namespace)
    asked_rest = asked.full.partition("/")[2]  # its version and path
    own = 0
    candidates: list[tuple[tuple[int, int, int], str, tuple[str, ...], int]] = []
    for name, entries in counts:
        if name == asked.full:
            own = entries
            continue
        # Near needs the same name, or the same version and path (`differing`):
        # tested on the string first, so most namespaces are never parsed.
        head, _, rest = name.partition("/")
        # An empty namespace (a row something else wrote) is no namespace to parse.
        if not name or not entries or (head != asked.name and rest != asked_rest):
            continue
        other = Namespace.raw(name)
        differs = differing(asked, other)
        if differs is not None:
            # Fewest differing segments first; a version bump before a path or a
            # name change (the commonest cause); then the fuller namespace.
            # First of all a version and path swapped: the namespace meant, written the
            # wrong way round.
            rank = (
                (0, 0, -entries)
                if _swapped(asked, other)
                else (len(differs), max(_NEARNESS[s] for s in differs), -entries)
            )
            candidates.append((rank, name, differs, entries))
    candidates.sort(key=lambda c: (c[0], c[1]))
    found: set[str] = set()
    if key is not None:
        wanted = [c[1] for c in candidates]
        if own:
            wanted.append(asked.full)
        found = holding(wanted, key) if wanted else set()
    return Explanation(
        namespace=asked.full,
        key=key,
        entries=own,
        has_key=None if key is None else asked.full in found,
        nearby=tuple(
            Nearby(
                namespace=name,
                differs=differs,
                entries=entries,
                has_key=None if key is None else name in found,
            )
            for _, name, differs, entries in candidates
        ),
    )


# --- the miss hook -------------------------------------------------------------

# Where a first miss was explained already: the storage's description, which
# names the environment (its file) and the namespace, as the log line does.
_explained: set[str] = set()
_explained_lock = threading.Lock()


async def explain_first_miss(
    describe: Callable[[], str],
    explaining: Callable[[bytes], Awaitable[Explanation | None]],
    key: bytes,
) -> None:
    """Log why `key` missed in a storage's namespace, the first time it misses.

    `describe` and `explaining` are the storage's `Storage.describe` and
    `Storage.explain`, called only when the log is on. Does nothing unless
    `WARMENV_EXPLAIN_MISSES=1`. Never raises: a failure to explain must not
    turn a miss into an error. A storage that cannot explain itself
    (`Storage.explain` gives `None`: one of the application's own) is not
    logged.
    """
    if os.environ.get(_VARIABLE) != "1" or not log.isEnabledFor(logging.INFO):
        return
    where = describe()
    with _explained_lock:
        if where in _explained:
            return
        _explained.add(where)
    try:
        explanation = await explaining(key)
    except Exception as exc:
        log.debug("cannot explain the miss in %s: %s", where, exc)
        return
    if explanation is not None:
        log.info("first miss in %s: %s", where, explanation)
