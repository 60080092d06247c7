"""`warmenv export OUT --name NAME`: write environments into a bundle."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from warmenv.bundle import BundleFormat, ExportReport, exporting
from warmenv.cli._common import Output, add_namespace_option, as_json, environment, follow, size


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "export",
        parents=[parent],
        help="export environments into a bundle file",
        description="Export SOURCEs (environments' .db files or roots; default: --env) "
        "into the bundle OUT.",
    )
    parser.add_argument("out", metavar="OUT", type=Path, help="the bundle file to write")
    parser.add_argument("sources", metavar="SOURCE", type=Path, nargs="*")
    parser.add_argument("--name", required=True, help='the bundle\'s name, e.g. "H100 Linux"')
    parser.add_argument(
        "--format", choices=[BundleFormat.SQLITE, BundleFormat.FLAT], default=BundleFormat.SQLITE
    )
    add_namespace_option(parser)
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    if args.sources:
        report = await _export(args, out, list(args.sources))
    else:
        async with environment(args) as env:
            report = await _export(args, out, [env])
    out.line(
        f"exported {report.entries:,} entries ({size(report.bytes)}) in "
        f"{len(report.namespaces)} namespaces to {report.path} in {report.elapsed:.2f}s"
    )
    out.result(as_json(report))
    return 0


async def _export(args: argparse.Namespace, out: Output, sources: list[Any]) -> ExportReport:
    async with exporting(
        sources, args.out, name=args.name, format=args.format, namespaces=args.namespaces
    ) as progress:
        report = await follow(out, aiter(progress), f"exporting to {args.out.name}")
    assert isinstance(report, ExportReport)
    return report
