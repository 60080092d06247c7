"""`warmenv verify BUNDLE`: check a bundle's structure and digest."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from warmenv.bundle import CorruptBundleError
from warmenv.bundle.base import Bundle
from warmenv.bundle.open import open_snapshot
from warmenv.cli._format import plural
from warmenv.cli._options import bundle_file
from warmenv.cli._output import Output


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "verify",
        parents=[parent],
        help="check a bundle's structure and content digest",
        description="Check that BUNDLE is a well-formed bundle whose content matches the "
        "digest in its manifest (exit 0), or say what is wrong (exit 1). Only reads.",
    )
    parser.add_argument(
        "bundle", metavar="BUNDLE", type=bundle_file, help="the bundle file to verify"
    )
    parser.set_defaults(run=run)


async def verified(bundle: Bundle, path: Path, out: Output) -> tuple[str, int]:
    """The digest and entry count of `bundle`; `CorruptBundleError` if its content is not
    what its manifest says (`verify` and `check` both refuse such a bundle).

    The digest is computed over every entry, which takes a while for a large
    bundle: it is drawn as a bar of its own, bytes hashed of all of them.
    """
    namespaces = await bundle.namespaces()
    entries = sum(s.entries for s in namespaces)
    with out.checking(f"verifying {path.name}", sum(s.bytes for s in namespaces)) as bar:
        actual = await bundle.compute_digest(lambda step: bar.update(bytes=step.bytes_done))
    expected = bundle.manifest.digest
    if actual != expected:
        raise CorruptBundleError(
            f"{path}: content does not match its digest (manifest {expected}, "
            f"content {actual}); do not import it"
        )
    return expected, entries


async def run(args: argparse.Namespace, out: Output) -> int:
    async with open_snapshot(args.bundle) as bundle:
        digest, entries = await verified(bundle, args.bundle, out)
    out.line(f"{args.bundle}: ok ({plural(entries, 'entry', 'entries')}, digest {digest})")
    out.result({"path": str(args.bundle), "ok": True, "entries": entries, "digest": digest})
    return 0
