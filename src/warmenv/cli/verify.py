"""`warmenv verify BUNDLE`: check a bundle's structure, signature and digest."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import anyio.to_thread

from warmenv._keys import PublicKey
from warmenv._text import plural
from warmenv.bundle import CorruptBundleError
from warmenv.bundle.base import Bundle
from warmenv.bundle.manifest import BundleManifest
from warmenv.bundle.signing import TrustLike, check_signature, resolve_trust
from warmenv.cli._options import add_trust_option, bundle_source, source_label, trust_keys
from warmenv.cli._output import Output
from warmenv.cli._sources import opened

# Accepted after every sub-command (a wrapper may pass them to all), but this one reads
# no environment: its --help does not offer them.
UNUSED_OPTIONS = ("--env", "--root", "--remote")


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "verify",
        parents=[parent],
        help="check a bundle's structure, signature and content digest",
        description="Check that BUNDLE is a well-formed bundle whose content matches the "
        "digest in its manifest and whose signature passes the trusted keys (--trust, or the "
        "configuration's trusted_keys and require_signature) (exit 0), or say what is wrong "
        "(exit 1). Only reads.",
    )
    parser.add_argument(
        "bundle", metavar="BUNDLE", type=bundle_source, help="a bundle file, or an http(s) URL"
    )
    add_trust_option(parser)
    parser.set_defaults(run=run)


def signature_phrase(manifest: BundleManifest, signer: PublicKey | None) -> str:
    """What the output says of a bundle's signature, once checked (or not asked for)."""
    if signer is not None:
        return f"signed by {signer}"
    if manifest.signature is None:
        return "unsigned"
    return f"signed by {manifest.signature.key} (not checked: no key is trusted)"


async def signed_by(bundle: Bundle, source: str | Path, trust: TrustLike) -> PublicKey | None:
    """The trusted key that signed `bundle` (None: unsigned, or nothing asked for);
    `SignatureError` if `trust` (None: the configuration's) refuses it."""
    checked = await anyio.to_thread.run_sync(resolve_trust, trust)
    return check_signature(bundle.manifest, checked, source_label(source))


async def verified(
    bundle: Bundle, source: str | Path, out: Output, trust: TrustLike = None
) -> tuple[str, int, PublicKey | None]:
    """The digest, entry count and trusted signer of `bundle`; `SignatureError` if its
    signature does not pass `trust`, `CorruptBundleError` if its content is not what its
    manifest says (`verify` and `check` both refuse such a bundle).

    The signature is checked first (it reads nothing but the manifest). The
    digest is computed over every entry, which takes a while for a large
    bundle: it is drawn as a bar of its own, bytes hashed of all of them.
    """
    signer = await signed_by(bundle, source, trust)
    label = source_label(source)
    short = source.name if isinstance(source, Path) else label
    namespaces = await bundle.namespaces()
    entries = sum(s.entries for s in namespaces)
    with out.checking(f"verifying {short}", sum(s.bytes for s in namespaces)) as bar:
        actual = await bundle.compute_digest(lambda step: bar.update(bytes=step.bytes_done))
    expected = bundle.manifest.digest
    if actual != expected:
        raise CorruptBundleError(
            f"{label}: content does not match its digest (manifest {expected}, "
            f"content {actual}); do not import it"
        )
    return expected, entries, signer


async def run(args: argparse.Namespace, out: Output) -> int:
    trust = trust_keys(args)
    async with opened(args.bundle, out) as bundle:
        digest, entries, signer = await verified(bundle, args.bundle, out, trust)
        signature = signature_phrase(bundle.manifest, signer)
    shown = source_label(args.bundle)
    out.line(f"{shown}: ok ({plural(entries, 'entry', 'entries')}, digest {digest}, {signature})")
    out.result(
        {
            "path": shown,
            "ok": True,
            "entries": entries,
            "digest": digest,
            "signer": None if signer is None else str(signer),
            "signature": signature,
        }
    )
    return 0
