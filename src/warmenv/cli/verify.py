"""`warmenv verify BUNDLE`: check a bundle's structure and digest."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from warmenv.bundle import CorruptBundleError, open_bundle
from warmenv.cli._common import Output


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "verify", parents=[parent], help="check a bundle's structure and content digest"
    )
    parser.add_argument("bundle", metavar="BUNDLE", type=Path)
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    async with open_bundle(args.bundle) as bundle:
        actual = await bundle.compute_digest()
        expected = bundle.manifest.digest
        entries = sum(s.entries for s in await bundle.namespaces())
    if actual != expected:
        raise CorruptBundleError(
            f"{args.bundle}: content does not match its digest (manifest {expected}, "
            f"content {actual}); do not import it"
        )
    out.line(f"{args.bundle}: ok ({entries:,} entries, digest {expected})")
    out.result({"path": str(args.bundle), "ok": True, "entries": entries, "digest": expected})
    return 0
