"""`warmenv check BUNDLE`: will this bundle's entries hit on this machine?

A bundle whose content does not match its digest cannot hit (import would
refuse it), so `check` runs the digest check before the preflight.
"""

from __future__ import annotations

import argparse
from typing import Any

from warmenv._text import plural
from warmenv.bundle import preflight
from warmenv.cli._errors import Failure, UsageError
from warmenv.cli._format import as_json
from warmenv.cli._options import (
    add_trust_option,
    bundle_source,
    text_argument,
    trust_keys,
    version_argument,
)
from warmenv.cli._output import Output
from warmenv.cli._sources import opened
from warmenv.cli.verify import verified

# Accepted after every sub-command (a wrapper may pass them to all), but this one reads
# no environment: its --help does not offer them.
UNUSED_OPTIONS = ("--env", "--root", "--remote")


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "check",
        parents=[parent],
        help="say whether a bundle can hit on this machine",
        description="Say whether BUNDLE's entries can hit on this machine: its content must "
        "match its digest, it must have been captured on the same OS and architecture, and "
        "(with --app-version) hold namespaces of your application's version, and (with "
        "--namespace) hold at least one of the namespaces named; for each named one it lacks, "
        "it shows its nearest. Exit 0 if it can hit, 1 if not.",
    )
    parser.add_argument(
        "bundle", metavar="BUNDLE", type=bundle_source, help="a bundle file, or an http(s) URL"
    )
    parser.add_argument(
        "--app-version",
        "--version",
        dest="app_version",
        metavar="VERSION",
        help="your application's version, to find namespaces of another version "
        "(--version is an alias, kept for 0.1 scripts)",
    )
    parser.add_argument(
        "--namespace",
        dest="namespaces",
        action="append",
        metavar="NAMESPACE",
        help="a namespace your application looks up, whole (not a prefix), e.g. app/2/kernels "
        "(repeatable): say whether the bundle holds it, and if not, its nearest there",
    )
    add_trust_option(parser)
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    namespaces = None
    if args.namespaces is not None:
        namespaces = [text_argument(n, "--namespace") for n in args.namespaces]
        if not all(n.strip("/") for n in namespaces):
            raise UsageError("--namespace must not be empty: give one, e.g. app/2/kernels")
    version = None if args.app_version is None else version_argument(args.app_version)
    trust = trust_keys(args)
    async with opened(args.bundle, out) as bundle:
        _, entries, _ = await verified(bundle, args.bundle, out, trust)
        report = await preflight(bundle, version=version, namespaces=namespaces, trust=trust)
    verdict = "can hit" if report.ok else "will not hit"
    machine = report.machine
    # Line by line rather than str(report): each reason is escaped as a whole,
    # so a namespace holding a newline cannot add a line of its own.
    out.line(f"bundle {report.bundle!r} {verdict} on this machine ({machine.os} {machine.arch}).")
    for reason in report.reasons:
        out.line(f"- {reason}")
    digest_reason = f"its content matches its digest ({plural(entries, 'entry', 'entries')})"
    out.line(f"- {digest_reason}")
    document = as_json(report)
    document["reasons"] = [*document.get("reasons", []), digest_reason]
    document["digest_matches"] = True
    if not report.ok:
        raise Failure(f"bundle {report.bundle!r} will not hit on this machine", document)
    out.result(document)
    return 0
