"""`warmenv verify BUNDLE`: check a bundle's structure and digest."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from warmenv.bundle import CorruptBundleError, open_bundle
from warmenv.bundle.base import Bundle
from warmenv.cli._common import Output, plural, size


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "verify",
        parents=[parent],
        help="check a bundle's structure and content digest",
        description="Check that BUNDLE is a well-formed bundle whose content matches the "
        "digest in its manifest (exit 0), or say what is wrong (exit 1). Only reads.",
    )
    parser.add_argument("bundle", metavar="BUNDLE", type=Path, help="the bundle file to verify")
    parser.set_defaults(run=run)


async def verified(bundle: Bundle, path: Path, out: Output) -> tuple[str, int]:
    """The digest and entry count of `bundle`; `CorruptBundleError` if its content is not
    what its manifest says (`verify` and `check` both refuse such a bundle).

    The digest is computed over every entry, which takes a while for a large
    bundle: it is drawn as a step of its own, with what it covers.
    """
    namespaces = await bundle.namespaces()
    entries = sum(s.entries for s in namespaces)
    covers = f"{plural(entries, 'entry', 'entries')}, {size(sum(s.bytes for s in namespaces))}"
    with out.working(f"verifying {path.name}", covers):
        actual = await bundle.compute_digest()
    expected = bundle.manifest.digest
    if actual != expected:
        raise CorruptBundleError(
            f"{path}: content does not match its digest (manifest {expected}, "
            f"content {actual}); do not import it"
        )
    return expected, entries


async def run(args: argparse.Namespace, out: Output) -> int:
    async with open_bundle(args.bundle) as bundle:
        digest, entries = await verified(bundle, args.bundle, out)
    out.line(f"{args.bundle}: ok ({plural(entries, 'entry', 'entries')}, digest {digest})")
    out.result({"path": str(args.bundle), "ok": True, "entries": entries, "digest": digest})
    return 0
