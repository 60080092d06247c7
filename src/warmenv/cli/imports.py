"""`warmenv import BUNDLE`: copy a bundle's entries into an environment."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from warmenv.bundle import ImportReport, importing
from warmenv.cli._common import Output, add_namespace_option, as_json, environment, follow, size


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "import", parents=[parent], help="import a bundle into an environment"
    )
    parser.add_argument("bundle", metavar="BUNDLE", type=Path)
    add_namespace_option(parser)
    parser.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip the digest check of a bundle you already trust",
    )
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    async with environment(args) as env:
        async with importing(
            args.bundle, env, namespaces=args.namespaces, verify=args.verify
        ) as progress:
            report = await follow(out, aiter(progress), f"importing {args.bundle.name}")
        assert isinstance(report, ImportReport)
        target = env.describe()
    out.line(
        f"imported {report.imported:,} entries ({size(report.bytes)}) into {target}; "
        f"{report.skipped:,} already present, {report.failed:,} failed, "
        f"{report.rejected:,} rejected, in {report.elapsed:.2f}s"
    )
    out.result(as_json(report))
    return 1 if report.failed else 0
