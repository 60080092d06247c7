"""Did-you-mean: the names closest to one that was not found, to say with its error.

One home for every "not found" a typo causes (a sub-command or another
option's choice, an environment, a namespace), so that each says it alike.
difflib's ratio with its usual cutoff (0.6): `stast` finds `stats`, `svx`
finds `svc`, while a name unlike any finds nothing, and then nothing is
suggested (a wrong guess would send the user the wrong way).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean", "namespace_suggestion"]

_MOST = 3


def did_you_mean(given: str, known: Iterable[str]) -> str | None:
    """`did you mean 'x'?` (or 'x' or 'y') for the names of `known` closest to `given`;
    `None` if none is close, or `given` is itself one of them."""
    names = sorted(set(known))
    if given in names:
        return None
    close = difflib.get_close_matches(given, names, n=_MOST, cutoff=0.6)
    if not close:
        return None
    return f"did you mean {' or '.join(repr(name) for name in close)}?"


def namespace_suggestion(given: str, namespaces: Iterable[str]) -> str | None:
    """`did_you_mean` for a namespace or a prefix of one (whole `/` segments): compared
    with the namespaces cut to as many segments as `given` has, so that a typo in a
    prefix (`ap` for `app`, `app/2` for `app/1`) finds the prefix meant."""
    depth = len(given.strip("/").split("/"))
    prefixes = {"/".join(n.split("/")[:depth]) for n in namespaces}
    return did_you_mean(given.strip("/"), prefixes)
