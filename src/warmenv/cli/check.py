"""`warmenv check BUNDLE`: will this bundle's entries hit on this machine?"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from warmenv.bundle import preflight
from warmenv.cli._common import Output, as_json


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "check", parents=[parent], help="say whether a bundle can hit on this machine"
    )
    parser.add_argument("bundle", metavar="BUNDLE", type=Path)
    parser.add_argument(
        "--version",
        dest="app_version",
        metavar="VERSION",
        help="your application's version, to find namespaces of another version",
    )
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    report = await preflight(args.bundle, version=args.app_version)
    out.line(str(report))
    out.result(as_json(report))
    return 0 if report.ok else 1
