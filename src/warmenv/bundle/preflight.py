"""Preflight: will a bundle's entries hit here, and if not, why not?

Every system that ships warm caches today shares one complaint: the cache
"silently doesn't hit". The usual reasons are a different machine (another
OS or architecture than the one the entries were captured on) or a different
version of the application (namespaces carry a version segment, so entries
written by 1.2 are never read by 1.3). Preflight checks both before import
and says so in words. Given the namespaces an application will look up, it
also says which of them the bundle holds, and for each other one the
bundle's nearest namespaces, found as `env.explain` finds them in an
environment (the same code, over the bundle's namespace counts).

It also says whether an import would refuse the bundle for its signature
(`trust`: keys, a `Trust`, or the configuration's `trusted_keys` and
`require_signature`), by the same check an import makes
(`warmenv.bundle.signing.check_signature`): a bundle an import refuses
cannot hit. That check reads the manifest alone; the digest an import also
checks is `verify`'s (`warmenv check` runs both).

A bundle named by an http(s) URL is checked without downloading it where
the server allows: a flat bundle's manifest and namespace names are at its
start, and so is the manifest of a SQLite bundle, which lists its
namespaces since format 2 lists them, so `Range` requests for the first
bytes are enough. A SQLite bundle whose manifest lists none (exported
before the list, or in format 1) is downloaded whole (to a private
temporary file, removed after), as is any bundle on a server that ignores
`Range`, and one whose entries are counted (`namespaces=`); but a bundle
whose signature an import would refuse is refused by its head alone, never
downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import aclosing
from pathlib import Path

import anyio.to_thread
import attrs

from warmenv._facts import TreeCheck, can_hit_for, captured_trees, is_captured_tree
from warmenv._facts import verdict as caches_verdict
from warmenv._keys import PublicKey
from warmenv._url import is_url, redact
from warmenv.bundle.base import Bundle
from warmenv.bundle.download import Download, DownloadOptions, read_head
from warmenv.bundle.errors import SignatureError, StaleBundleError
from warmenv.bundle.manifest import BundleManifest, EnvironmentInfo, this_machine
from warmenv.bundle.open import open_any
from warmenv.bundle.signing import Trust, TrustLike, check_signature, resolve_trust
from warmenv.persistence.explain import Explanation, explain
from warmenv.persistence.namespace import Namespace, check_version

__all__ = ["Preflight", "of_version", "preflight", "stale"]


@attrs.frozen
class Preflight:
    """The verdict (`ok`) and the reasons behind it; `str()` explains it."""

    ok: bool
    bundle: str
    machine: EnvironmentInfo
    matching: tuple[EnvironmentInfo, ...]
    captured_on: tuple[EnvironmentInfo, ...]
    version: str | None
    other_versions: tuple[str, ...]
    matching_namespaces: tuple[str, ...]
    reasons: tuple[str, ...]
    would_hit: tuple[str, ...] = ()
    """The namespaces named (`namespaces=`) that the bundle holds entries of."""
    would_miss: tuple[Explanation, ...] = ()
    """For each namespace named that the bundle does not hold, the bundle's nearest."""
    caches: tuple[TreeCheck, ...] = ()
    """The compiler caches it holds (`warmenv.caches`), each checked against this machine."""
    signer: PublicKey | None = None
    """The trusted key whose signature was checked (None: unsigned, or nothing checked)."""
    signature_refused: str | None = None
    """Why an import would refuse the bundle for its signature (its `SignatureError`), or None."""

    def __str__(self) -> str:
        verdict = "can hit" if self.ok else "will not hit"
        lines = [f"bundle {self.bundle!r} {verdict} on this machine ({_where(self.machine)})."]
        lines += [f"- {reason}" for reason in self.reasons]
        return "\n".join(lines)


def _where(info: EnvironmentInfo) -> str:
    return f"{info.os} {info.arch}"


async def preflight(
    source: str | Path | Bundle,
    *,
    version: str | None = None,
    namespaces: Iterable[Namespace | str] | None = None,
    download: DownloadOptions | None = None,
    trust: TrustLike = None,
) -> Preflight:
    """Check a bundle (a path, an http(s) URL or an open bundle) against this machine and `version`.

    `namespaces`: those the application will look up; the report says which
    the bundle holds (`would_hit`) and why each other one would miss
    (`would_miss`), and cannot hit if it holds none of them. A URL's
    manifest is read with a `Range` request where possible (see the
    module's docstring; with `namespaces`, the bundle is downloaded whole,
    to count its entries); `download` sets the limits of fetching it.
    `trust` is an import's (`import_bundle`'s): the report says whether it
    would refuse the bundle for its signature, and then it cannot hit.
    """
    # Checked at the call, as an import's options are (`importing.check_options`).
    if version is not None:
        check_version(version)
    if isinstance(namespaces, str | Namespace):
        raise TypeError(f"namespaces must be a list of namespaces, got {namespaces!r}; pass [it]")
    if download is not None and not isinstance(download, DownloadOptions):
        raise TypeError(
            f"download must be a DownloadOptions, got {type(download).__name__} {download!r}"
        )
    asked = None if namespaces is None else [Namespace.coerce(n).full for n in namespaces]
    checked = await anyio.to_thread.run_sync(resolve_trust, trust)  # None: a file is read
    if is_url(source):
        assert isinstance(source, str)
        return await _check_url(source, version, asked, download, checked)
    if isinstance(source, str | Path):
        bundle = await open_any(Path(source))
        try:
            return await _check(bundle, version, asked, checked)
        finally:
            await bundle.aclose()
    return await _check(source, version, asked, checked)


async def _check_url(
    url: str,
    version: str | None,
    asked: list[str] | None,
    options: DownloadOptions | None,
    trust: Trust,
) -> Preflight:
    # The head alone decides when it tells the namespaces and nothing is to be counted
    # (a flat bundle's header names its namespaces but does not count their entries), or
    # when the signature is refused: a bundle an import would refuse is never downloaded.
    header, opened = (
        (None, None) if asked is not None and not trust.checks else await read_head(url, options)
    )
    if header is not None:
        manifest, told, label = header.manifest, header.namespaces, redact(url)
        refused = _refused(manifest, trust, label)  # the signature before anything of it
        if refused or (told is not None and asked is None):
            if opened is not None:  # a server that ignored the range: its body is not read on
                await opened.aclose()
            report = _verdict(manifest, list(told or ()), version, judged=not refused, told=told)
            return _signed(report, manifest, trust, label)
    fetched = Download(url, None, options, opened)
    async with aclosing(fetched.fetch()) as steps:
        async for _ in steps:
            pass
    bundle = await fetched.open()
    try:
        return await _check(bundle, version, asked, trust)
    finally:
        await bundle.aclose()


def _refused(manifest: BundleManifest, trust: Trust, label: str) -> bool:
    """Whether an import under `trust` would refuse the bundle for its signature: checked
    first, so that nothing else of a bundle refused (its facts) is worked out."""
    try:
        check_signature(manifest, trust, label)
    except SignatureError:
        return True
    return False


def _signed(report: Preflight, manifest: BundleManifest, trust: Trust, label: str) -> Preflight:
    """`report` with what an import under `trust` would make of the bundle's signature."""
    try:
        signer = check_signature(manifest, trust, label)
    except SignatureError as exc:
        reason = f"an import would refuse it for its signature: {exc}"
        return attrs.evolve(
            report, ok=False, signature_refused=str(exc), reasons=(*report.reasons, reason)
        )
    if signer is not None:
        said = f"signed by {signer}, a trusted key (its digest is checked on import)"
    elif manifest.signature is not None:
        said = f"signed by {manifest.signature.key} (not checked: no key is trusted)"
    elif trust.keys:
        said = "unsigned, which the trust allows (no signature is required)"
    else:
        return report  # unsigned, and nothing asks for a signature: nothing to say
    return attrs.evolve(report, signer=signer, reasons=(*report.reasons, said))


async def _check(
    bundle: Bundle, version: str | None, asked: list[str] | None, trust: Trust
) -> Preflight:
    manifest, label = bundle.manifest, bundle.describe()
    judged = not _refused(manifest, trust, label)  # the signature before anything of it
    summaries = await bundle.namespaces()
    namespaces = [s.namespace for s in summaries]
    entries = [s.entries for s in summaries]
    report = _verdict(manifest, namespaces, version, entries, judged=judged)
    report = _signed(report, manifest, trust, label)
    if asked is None or not namespaces:  # an empty bundle is said already
        return report
    counts = [(s.namespace, s.entries) for s in summaries]
    explained = [explain(counts, name, None, _no_keys) for name in dict.fromkeys(asked)]
    would_hit = tuple(e.namespace for e in explained if e.entries)
    would_miss = tuple(e for e in explained if not e.entries)
    return attrs.evolve(
        report,
        ok=report.ok and bool(would_hit or not explained),
        would_hit=would_hit,
        would_miss=would_miss,
        reasons=(*report.reasons, _named(len(explained), would_miss)),
    )


def of_version(namespaces: Iterable[str], version: str) -> tuple[list[str], list[str]]:
    """`namespaces` split into those lookups by `version` can hit and the others.

    By `can_hit_for`, the one rule: the application's namespaces of that
    version segment, and every captured compiler cache (judged by its facts,
    never by the application's version).
    """
    same: list[str] = []
    other: list[str] = []
    for namespace in namespaces:
        (same if can_hit_for(namespace, version) else other).append(namespace)
    return same, other


def _no_namespace_of(version: str, other: list[str]) -> str:
    if not other:
        return f"no namespace is for version {version!r} (the bundle holds no entries)"
    found = sorted({Namespace.raw(n).version for n in other})
    return f"no namespace is for version {version!r} (the bundle holds {_versions(found)})"


def stale(label: str, other: list[str], version: str) -> StaleBundleError:
    """The refusal of a bundle none of whose namespaces (`other`) is of `version`."""
    return StaleBundleError(
        f"{label}: {_no_namespace_of(version, other)}, so none of it could hit; nothing was "
        f"imported: export a bundle from version {version!r}, or import without the version"
    )


def _versions(found: list[str]) -> str:
    """ "version '1'", "versions '1' and '1.5'", "versions '1', '1.5' and '3'"."""
    if len(found) == 1:
        return f"version {found[0]!r}"
    quoted = [repr(v) for v in found]
    return f"versions {', '.join(quoted[:-1])} and {quoted[-1]}"


def _no_keys(namespaces: list[str], key: bytes) -> set[str]:
    raise AssertionError("preflight asks about namespaces, never a key")


def _named(count: int, missing: tuple[Explanation, ...]) -> str:
    """The reason that says which namespaces named would miss, and what is near each."""
    if not missing:
        if count == 1:
            return "the namespace named is in the bundle"
        if count == 2:
            return "both namespaces named are in the bundle"
        return f"all {count:,} namespaces named are in the bundle"
    shown = ", ".join(_nearest(e) for e in missing[:5]) + (" ..." if len(missing) > 5 else "")
    if count == 1:
        head = "the namespace named is not"
    elif len(missing) == count:
        head = f"none of the {count:,} namespaces named is"
    else:
        verb = "is" if len(missing) == 1 else "are"
        head = f"{len(missing):,} of {count:,} namespaces named {verb} not"
    return f"{head} in the bundle and will miss: {shown}"


def _nearest(explanation: Explanation) -> str:
    if not explanation.nearby:
        return f"{explanation.namespace!r} (nothing like it there)"
    near = explanation.nearby[0]
    return (
        f"{explanation.namespace!r} "
        f"(nearest there: {near.namespace!r}, {explanation.differences(near)})"
    )


def _verdict(
    manifest: BundleManifest,
    namespaces: list[str],
    version: str | None,
    entries: list[int] | None = None,
    *,
    judged: bool = True,
    told: tuple[str, ...] | None = (),
) -> Preflight:
    """The verdict on a bundle's manifest and namespaces; `judged=False` (its signature is
    refused) leaves its compiler caches' facts unread: nothing of it is worked out.
    `told=None`: its namespaces are not known (a bundle refused by its head, which does
    not list them), so nothing is said of them."""
    machine = this_machine()
    captured = manifest.environments
    matching = tuple(e for e in captured if (e.os, e.arch) == (machine.os, machine.arch))
    reasons: list[str] = []
    ok = True
    if not captured:
        reasons.append("the manifest names no machine, so the platform cannot be checked")
    elif matching:
        reasons.append(f"captured on {matching[0].label!r}, the same OS and architecture")
    else:
        ok = False
        seen = ", ".join(f"{e.label!r} ({_where(e)})" for e in captured)
        reasons.append(f"captured on {seen}; this machine is {_where(machine)}")
    other: list[str] = []
    same: list[str] = []
    if version is not None:
        same, other = of_version(namespaces, version)
        if namespaces and not same:
            ok = False
            reasons.append(f"{_no_namespace_of(version, other)}; re-export it from this version")
        elif other:
            reasons.append(
                f"{len(other)} of {len(namespaces)} namespaces "
                f"{'carries' if len(other) == 1 else 'carry'} another version than "
                f"{version!r} and will not be read: {', '.join(other[:5])}"
                + (" ..." if len(other) > 5 else "")
            )
        elif apps := [n for n in same if not is_captured_tree(n)]:
            reasons.append(
                f"its namespace is for version {version!r}"
                if len(namespaces) == 1
                else f"the application's one namespace is for version {version!r}"
                if len(apps) == 1 < len(namespaces)
                else f"all {len(apps)} namespaces of the application are for version {version!r}"
                if len(apps) < len(namespaces)
                else f"all {len(namespaces)} namespaces are for version {version!r}"
            )
        elif namespaces:  # an empty bundle is said below
            reasons.append(
                f"it holds compiler caches only: they are judged by their facts (below), "
                f"not by version {version!r}"
            )
    if told is None:
        ok = False  # only ever a bundle whose signature is refused
    elif not namespaces:
        ok = False
        reasons.append("the bundle holds no entries")
    # Compiler caches: their facts (tool version, CPU, Python, ...) against this machine.
    caches: tuple[TreeCheck, ...] = ()
    if judged:
        caches = captured_trees(zip(namespaces, entries or [0] * len(namespaces), strict=True))
        caches_ok, said = caches_verdict(caches)
        ok = ok and caches_ok
        reasons += said
    elif any(is_captured_tree(n) for n in namespaces):
        ok = False
        reasons.append("its compiler caches' facts are not checked: its signature is refused")
    return Preflight(
        ok=ok,
        bundle=manifest.name,
        machine=machine,
        matching=matching,
        captured_on=captured,
        version=version,
        other_versions=tuple(other),
        matching_namespaces=tuple(same),
        reasons=tuple(reasons),
        caches=caches,
    )
