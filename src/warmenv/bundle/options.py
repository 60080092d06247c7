"""The options of an import, written once: every way of importing takes these.

`import_bundle`, `importing` and `warm_up`, and their blocking forms in
`warmenv.blocking`, each take `**options: Unpack[ImportOptions]` and pass
them on untouched to `importing`, the one reader of them (where their
defaults apply). So an option added here reaches every way of importing
with no other signature to edit: a face cannot miss it, as `warm_up` once
missed `trust=`. mypy checks each call's keywords against `ImportOptions`;
at run time `refuse_unknown` rejects a keyword it does not list at the call,
as a written-out signature would (a background warm-up included, whose
error would otherwise surface only in its log).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypedDict

from warmenv.bundle.download import DownloadOptions
from warmenv.bundle.signing import TrustLike

__all__ = ["ImportOptions", "Validate", "refuse_unknown"]

Validate = Callable[[str, bytes, bytes], bool]
"""`validate(namespace, key, value)`: whether to import that entry."""


class ImportOptions(TypedDict, total=False):
    """The keywords of every import (`import_bundle`, `importing`, `warm_up`, and
    `warmenv.blocking`'s); any may be left out, for the default named here."""

    namespaces: list[str] | None
    """Import only the namespaces under these prefixes (`None`, the default: all)."""
    version: str | None
    """The application's version: only the namespaces of that version segment are
    imported, the others named in the report (`other_versions`); a bundle holding none
    raises `StaleBundleError` before anything is written (`None`, the default: all)."""
    batch_size: int
    """Entries per transaction (default 1024): a cancelled import keeps whole batches."""
    share: float
    """The import's share of the time while it runs, 0 < share <= 1 (default 1: it
    never pauses); see `importing`."""
    validate: Validate | None
    """Called with each entry's namespace, key and value; an entry it returns false
    for is not imported (counted in the report's `rejected`; `None`, the default:
    every entry)."""
    verify: bool
    """Check the bundle's digest before the first batch is committed (default `True`;
    a bundle whose signature is checked always has its digest checked)."""
    download: DownloadOptions | None
    """The limits of fetching a bundle by URL (`None`, the default: `DownloadOptions()`)."""
    trust: TrustLike
    """Whose signature the bundle must carry (see `warmenv.bundle.signing`): keys (then
    a signature by one of them is required), a `Trust`, or `None` (the default): the
    configuration's `trusted_keys` and `require_signature`. A refused bundle raises
    `SignatureError` before anything is written."""


def refuse_unknown(options: Mapping[str, object], caller: str) -> None:
    """Raise `TypeError` naming `caller` for a keyword `ImportOptions` does not list."""
    unknown = sorted(options.keys() - ImportOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
