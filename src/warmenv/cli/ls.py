"""`warmenv ls`: the environments under the root, and one environment's namespaces.

`ls` only reads: an environment that does not exist is an error (exit 1)
naming the environments that do, never a new empty file.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio.to_thread

from warmenv.cli._common import Output, as_json, environment, size


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "ls", parents=[parent], help="list environments and the namespaces of one"
    )
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    async with environment(args, out) as env:
        root = env.path.parent
        files = await anyio.to_thread.run_sync(lambda: sorted(root.glob("*.db")))
        stats = await anyio.to_thread.run_sync(lambda: [f.stat().st_size for f in files])
        namespaces = await env.namespaces()
    out.table(
        f"environments in {root}",
        ["environment", "file size"],
        [
            [f.stem + (" (selected)" if f.stem == env.name else ""), size(s)]
            for f, s in zip(files, stats, strict=True)
        ],
    )
    out.table(
        f"namespaces in {env.name!r}",
        ["namespace", "entries", "size"],
        [[s.namespace, f"{s.entries:,}", size(s.bytes)] for s in namespaces],
    )
    if not namespaces:
        out.line(f"environment {env.name!r} holds no entries yet")
    out.result(
        {
            "root": str(root),
            "environments": [
                {"name": f.stem, "path": str(f), "file_bytes": s}
                for f, s in zip(files, stats, strict=True)
            ],
            "environment": env.name,
            "namespaces": as_json(namespaces),
        }
    )
    return 0
