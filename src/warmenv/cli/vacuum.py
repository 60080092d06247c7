"""`warmenv vacuum`: give the space of purged and evicted entries back to the file system.

SQLite keeps freed pages inside the file; vacuum rewrites it compactly. It
needs free disk about the file's size and waits for other processes'
transactions; on failure the file is left as it was.
"""

from __future__ import annotations

import argparse
from typing import Any

from warmenv.cli._environments import environment
from warmenv.cli._errors import UsageError
from warmenv.cli._format import size
from warmenv.cli._output import Output


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "vacuum",
        parents=[parent],
        help="shrink an environment's file after purge or gc",
        description="Rewrite the database of an environment (--env) compactly, giving the "
        "space of purged and evicted entries back to the file system. Needs free disk "
        "about the file's size.",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for other processes' transactions (default 30)",
    )
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    out.when_interrupted = "the file is as it was (vacuum is all or nothing)"
    if not args.wait >= 0:
        raise UsageError(f"--wait must be 0 or more seconds, not {args.wait}")
    async with environment(args, out, write=True) as env:
        before, after = await env.vacuum(wait=args.wait)
    out.line(f"{env.path}: {size(before)} -> {size(after)} (freed {size(max(before - after, 0))})")
    out.result({"environment": env.name, "path": str(env.path), "before": before, "after": after})
    return 0
