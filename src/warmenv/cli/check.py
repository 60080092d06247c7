"""`warmenv check BUNDLE`: will this bundle's entries hit on this machine?

A bundle whose content does not match its digest cannot hit (import would
refuse it), so `check` runs the digest check before the preflight.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from warmenv.bundle import open_bundle, preflight
from warmenv.cli._common import Failure, Output, as_json
from warmenv.cli.verify import verified


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
    async with open_bundle(args.bundle) as bundle:
        _, entries = await verified(bundle, args.bundle)
        report = await preflight(bundle, version=args.app_version)
    verdict = "can hit" if report.ok else "will not hit"
    machine = report.machine
    # Line by line rather than str(report): each reason is escaped as a whole,
    # so a namespace holding a newline cannot add a line of its own.
    out.line(f"bundle {report.bundle!r} {verdict} on this machine ({machine.os} {machine.arch}).")
    for reason in report.reasons:
        out.line(f"- {reason}")
    out.line(f"- its content matches its digest ({entries:,} entries)")
    if not report.ok:
        raise Failure(f"bundle {report.bundle!r} will not hit on this machine", as_json(report))
    out.result(as_json(report))
    return 0
