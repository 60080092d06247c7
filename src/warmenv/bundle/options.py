"""The options of an import and of an export, each written once: every face takes them.

`import_bundle`, `importing` and `warm_up`, and their blocking forms in
`warmenv.blocking`, each take `**options: Unpack[ImportOptions]` and pass
them on untouched to `importing`, the one reader of them (where their
defaults apply). So an option added here reaches every way of importing
with no other signature to edit: a face cannot miss it, as `warm_up` once
missed `trust=`. mypy checks each call's keywords against `ImportOptions`;
at run time `refuse_unknown` rejects a keyword it does not list at the call,
as a written-out signature would (a background warm-up included, whose
error would otherwise surface only in its log), and `check_options` checks
their values there too, with the source and the environment: one
`TypeError`/`ValueError` line at the call for `version=1.0` or
`namespaces="app"`, never a failed background warm-up or a silent no-op.

The export's options are `ExportOptions`, by the same rule: `export_bundle`,
`exporting` and the blocking `export_bundle` take `**options:
Unpack[ExportOptions]` and `exporting` alone reads them (its defaults);
`refuse_unknown` refuses an unknown keyword, or a missing `name` or
`version`, at the call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from warmenv._errors import require_number
from warmenv._keys import PublicKey
from warmenv.bundle.base import Bundle
from warmenv.bundle.download import DownloadOptions
from warmenv.bundle.manifest import EnvironmentInfo
from warmenv.bundle.signing import SigningKey, Trust, TrustLike
from warmenv.environment import Environment
from warmenv.persistence.namespace import check_version
from warmenv.persistence.storage import check_batch_size

__all__ = [
    "ExportOptions",
    "ImportOptions",
    "Validate",
    "check_options",
    "check_share",
    "refuse_unknown",
]

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


class _ExportRequired(TypedDict):
    """The keywords every export needs (a base class because `Required[...]` is not
    seen in a string annotation before Python 3.12)."""

    name: str
    """The bundle's name, recorded in its manifest (non-empty)."""
    version: str
    """The application's version, recorded in the manifest; required because
    warmenv's own version says nothing about the entries."""


class ExportOptions(_ExportRequired, total=False):
    """The keywords of every export (`export_bundle`, `exporting`, and
    `warmenv.blocking`'s): `name` and `version` are required, any other may be
    left out, for the default named here."""

    format: str
    """`BundleFormat.SQLITE` (`"sqlite"`, the default) or `BundleFormat.FLAT` (`"flat"`)."""
    namespaces: list[str] | None
    """Export only the namespaces under these prefixes (`None`, the default: all)."""
    environments: Sequence[EnvironmentInfo] | None
    """The machines the entries are for, recorded in the manifest (`None`, the
    default: this machine)."""
    format_version: int
    """2 (the default), or 1 for readers of format 1 (warmenv 0.1): without each
    entry's written_at and cost."""
    sign: SigningKey | str | Path | None
    """Sign the bundle with this `SigningKey`, or the private key file `warmenv
    keygen` wrote (`None`, the default: unsigned)."""


def refuse_unknown(
    options: Mapping[str, object],
    caller: str,
    accepted: Any = ImportOptions,  # ImportOptions or ExportOptions: mypy types no TypedDict class
) -> None:
    """Raise `TypeError` naming `caller` for a keyword `accepted` does not list, or
    one it requires that is missing: what a written-out signature said at the call."""
    unknown = sorted(options.keys() - accepted.__optional_keys__ - accepted.__required_keys__)
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    missing = sorted(accepted.__required_keys__ - options.keys())
    if missing:
        raise TypeError(f"{caller}() missing required keyword argument {missing[0]!r}")


def check_options(
    source: object, env: object, options: Mapping[str, object], caller: str
) -> Trust | None:
    """Every import's arguments checked at the call, before any work: one line if not.

    The one check for every way of importing (`importing`, `import_bundle`,
    `warm_up` and their blocking forms): unknown keywords (`refuse_unknown`),
    then the source, the environment and each option's value. Nothing here
    reads a file or the network. Returns the `Trust` that `trust=` spells
    (keys parsed), or `None` for the configuration's (read later, on a
    worker thread).
    """
    refuse_unknown(options, caller)
    if not isinstance(source, str | os.PathLike | Bundle):
        raise TypeError(
            "source must be a bundle's path, an http(s) URL or an open bundle, got "
            f"{type(source).__name__} {source!r}"
        )
    if not isinstance(env, Environment):
        twin = " (a BlockingEnvironment goes to warmenv.blocking's form)"
        raise TypeError(
            f"env must be an Environment (from open_environment), got {type(env).__name__}"
            + (twin if type(env).__name__ == "BlockingEnvironment" else "")
        )
    namespaces = options.get("namespaces")
    if namespaces is not None:
        if not isinstance(namespaces, list | tuple):
            hint = f"; pass [{namespaces!r}]" if isinstance(namespaces, str) else ""
            raise TypeError(
                f"namespaces must be a list of prefixes, got {type(namespaces).__name__} "
                f"{namespaces!r}{hint}"
            )
        for prefix in namespaces:
            if not isinstance(prefix, str):
                raise TypeError(
                    f"namespaces must hold str prefixes, got {type(prefix).__name__} {prefix!r}"
                )
    version = options.get("version")
    if version is not None:
        check_version(version)
    check_batch_size(options.get("batch_size", 1024))  # type: ignore[arg-type]  # checked there
    check_share(options.get("share", 1.0))
    validate = options.get("validate")
    if validate is not None and not callable(validate):
        raise TypeError(
            f"validate must be a function (namespace, key, value) -> bool, got "
            f"{type(validate).__name__} {validate!r}"
        )
    verify = options.get("verify", True)
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be True or False, got {type(verify).__name__} {verify!r}")
    download = options.get("download")
    if download is not None and not isinstance(download, DownloadOptions):
        raise TypeError(
            f"download must be a DownloadOptions, got {type(download).__name__} {download!r}"
        )
    return _trust_of(options.get("trust"))


def _trust_of(trust: object) -> Trust | None:
    """What `trust=` spells, checked and parsed (`None`: the configuration's, read later)."""
    if trust is None or isinstance(trust, Trust):
        return trust
    keys = [trust] if isinstance(trust, PublicKey | str) else trust
    if isinstance(keys, bytes) or not isinstance(keys, Iterable):
        raise TypeError(
            "trust must be a Trust, a public key ('ed25519:...') or a list of them, got "
            f"{type(trust).__name__} {trust!r}"
        )
    listed = list(keys)
    for key in listed:
        if not isinstance(key, PublicKey | str):
            raise TypeError(
                f"trust must hold public keys ('ed25519:...' or PublicKey), got "
                f"{type(key).__name__} {key!r}"
            )
    return Trust.of(listed)


def check_share(share: object) -> None:
    """`TypeError` for a `share=` that is not a number (a bool neither), `ValueError` for
    one that is not a fraction of the time in (0, 1]."""
    rule = "share must be a number in (0, 1] (of the time)"
    fraction = require_number(share, rule)
    if not 0 < fraction <= 1:  # NaN fails this too
        raise ValueError(f"{rule}, got {share!r}")
