"""`warmenv purge`: delete an environment's entries (all, or under a prefix).

Nothing is created (purging an environment that does not exist is an error
naming those that do), and nothing is deleted until the answer is "y":
Ctrl-C or Ctrl-D at the prompt ends the command at once (exit 130).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from warmenv.cli._common import (
    Failure,
    Output,
    Stopped,
    UsageError,
    add_namespace_option,
    ask,
    environment,
    namespace_prefixes,
    no_match,
    plural,
)
from warmenv.persistence.namespace import matches_any
from warmenv.persistence.storage import Failed


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "purge",
        parents=[parent],
        help="delete entries from an environment",
        description="Delete the entries of an environment (--env), all of them or those under "
        "--namespace prefixes. Asks for confirmation on a terminal unless --yes is given.",
    )
    add_namespace_option(parser)
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    prefixes = namespace_prefixes(args)
    out.when_interrupted = "nothing deleted"
    async with environment(args, out, write=True) as env:
        doomed = [s for s in await env.namespaces() if matches_any(s.namespace, prefixes)]
        entries = sum(s.entries for s in doomed)
        if prefixes is not None and not doomed:
            raise Failure(f"{no_match(prefixes)} in {env.describe()}; nothing deleted")
        if doomed and not args.yes:
            if not sys.stdin.isatty() or args.json:
                raise UsageError(
                    f"purge would delete {plural(entries, 'entry', 'entries')} from "
                    f"{env.describe()}; "
                    "pass --yes to confirm"
                )
            question = (
                f"delete {plural(entries, 'entry', 'entries')} in "
                f"{plural(len(doomed), 'namespace')} of {env.name!r}? [y/N] "
            )
            answer = await ask(out, question)
            if answer is None:  # Ctrl-D
                out.line("")
                raise Stopped(signal.SIGINT, "no answer (end of input)")
            if answer.strip().lower() not in ("y", "yes"):
                raise Failure("nothing deleted")
        out.when_interrupted = (
            "the namespaces purged so far are empty, the others untouched; run it again"
        )
        removed = 0
        failures = []
        for summary in doomed:
            result = await env.storage(summary.namespace).purge()
            if isinstance(result, Failed):
                failures.append(result.reason)
                out.warning(f"{summary.namespace}: {result.reason}")
            else:
                removed += result.count
    out.line(
        f"deleted {plural(removed, 'entry', 'entries')} in "
        f"{plural(len(doomed) - len(failures), 'namespace')}"
    )
    document = {"environment": env.name, "deleted": removed, "failed": failures}
    if failures:
        raise Failure(f"{plural(len(failures), 'namespace')} could not be purged", document)
    out.result(document)
    return 0
