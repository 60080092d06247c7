"""`warmenv inspect BUNDLE`: the manifest and the namespaces of a bundle."""

from __future__ import annotations

import argparse
from typing import Any

from warmenv.cli._format import as_json, namespace_label, size
from warmenv.cli._options import bundle_source, source_label
from warmenv.cli._output import Output
from warmenv.cli._sources import opened

# Accepted after every sub-command (a wrapper may pass them to all), but this one reads
# no environment: its --help does not offer them.
UNUSED_OPTIONS = ("--env", "--root", "--remote")


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "inspect",
        parents=[parent],
        help="show a bundle's manifest and namespaces",
        description="Show BUNDLE's format, manifest (name, version, digest, the machines it "
        "was captured on) and namespaces with their entries and sizes. Only reads.",
    )
    parser.add_argument(
        "bundle", metavar="BUNDLE", type=bundle_source, help="a bundle file, or an http(s) URL"
    )
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    # A private copy: inspect reads every key of a flat bundle, and reading a
    # mapping of a file someone truncates meanwhile would kill the command.
    async with opened(args.bundle, out, verified=False) as bundle:
        manifest = bundle.manifest
        namespaces = await bundle.namespaces()
        kind = bundle.describe()
    out.line(kind)
    out.line(f"  name     {manifest.name}")
    out.line(f"  version  {manifest.version}")
    out.line(f"  created  {manifest.created}")
    out.line(f"  digest   {manifest.digest}")
    signature = manifest.signature
    out.line(
        "  signed   no"
        if signature is None
        else f"  signed   by {signature.key} (not checked here: `warmenv verify` checks it)"
    )
    for info in manifest.environments:
        devices = f", devices: {', '.join(info.devices)}" if info.devices else ""
        out.line(f"  captured on {info.label!r} ({info.os} {info.arch}{devices})")
    out.table(
        "namespaces",
        ["namespace", "entries", "size"],
        [
            [namespace_label(s.namespace, text=s.text), f"{s.entries:,}", size(s.bytes)]
            for s in namespaces
        ],
    )
    out.result(
        {
            "path": source_label(args.bundle),
            "format": str(bundle.format),
            "manifest": as_json(manifest),
            "namespaces": as_json(namespaces),
            "entries": sum(s.entries for s in namespaces),
            "bytes": sum(s.bytes for s in namespaces),
        }
    )
    return 0
