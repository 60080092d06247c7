"""`warmenv purge`: delete an environment's entries (all, or under a prefix)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio.to_thread

from warmenv.cli._common import Output, UsageError, add_namespace_option, environment
from warmenv.persistence.namespace import matches_any
from warmenv.persistence.storage import Failed


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "purge", parents=[parent], help="delete entries from an environment"
    )
    add_namespace_option(parser)
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    async with environment(args) as env:
        doomed = [s for s in await env.namespaces() if matches_any(s.namespace, args.namespaces)]
        entries = sum(s.entries for s in doomed)
        if doomed and not args.yes:
            if not sys.stdin.isatty() or args.json:
                raise UsageError(
                    f"purge would delete {entries:,} entries from {env.describe()}; "
                    "pass --yes to confirm"
                )
            question = (
                f"delete {entries:,} entries in {len(doomed)} namespaces of {env.name!r}? [y/N] "
            )
            answer = await anyio.to_thread.run_sync(input, question)
            if answer.strip().lower() not in ("y", "yes"):
                out.line("nothing deleted")
                return 1
        removed = 0
        failures = []
        for summary in doomed:
            result = await env.storage(summary.namespace).purge()
            if isinstance(result, Failed):
                failures.append(result.reason)
            else:
                removed += result.count
    for reason in failures:
        out.error(reason)
    out.line(f"deleted {removed:,} entries in {len(doomed) - len(failures)} namespaces")
    out.result({"environment": env.name, "deleted": removed, "failed": failures})
    return 1 if failures else 0
