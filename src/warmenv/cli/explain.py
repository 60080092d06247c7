"""`warmenv explain NAMESPACE [KEY]`: why a lookup misses in an environment.

It only reads: the namespaces the environment holds that differ from
NAMESPACE in its version or path (or only in its name), how many entries
each holds and whether KEY is stored there. KEY is the key the application
passes to its store (default codec: JSON, so `k1` means the string "k1");
`--raw-key` takes it as the exact bytes stored (UTF-8), which is how an
integer or tuple key of a JSON store is given: its compact JSON (`42`,
`["matmul",4096]`).
"""

from __future__ import annotations

import argparse
from typing import Any

from warmenv.cli._environments import environment
from warmenv.cli._errors import UsageError
from warmenv.cli._format import as_json
from warmenv.cli._options import text_argument
from warmenv.cli._output import Output


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "explain",
        parents=[parent],
        help="say why a lookup misses: the namespaces nearby",
        description="Explain why a lookup of NAMESPACE (and KEY) misses: list the namespaces "
        "of the environment that differ from it only in its version or path (or only in "
        "its name), nearest first, with their entries and whether KEY is stored there.",
    )
    parser.add_argument(
        "namespace", metavar="NAMESPACE", help="the namespace that misses, e.g. app/2/kernels"
    )
    parser.add_argument(
        "key",
        metavar="KEY",
        nargs="?",
        help="the key that misses, as a string key passed to a JSON store; for another "
        "key give its JSON with --raw-key (the integer 42: --raw-key 42)",
    )
    parser.add_argument(
        "--raw-key",
        action="store_true",
        help="take KEY as the exact bytes stored (UTF-8), not as a JSON store's string key",
    )
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    namespace = text_argument(args.namespace, "NAMESPACE")
    if not namespace.strip("/"):
        raise UsageError("NAMESPACE must not be empty: give one, e.g. app/2/kernels")
    key: bytes | str | None = None
    if args.key is not None:
        key = text_argument(args.key, "KEY")
        if args.raw_key:
            key = key.encode("utf-8")
    elif args.raw_key:
        raise UsageError("--raw-key needs a KEY")
    async with environment(args, out) as env:
        explanation = await env.explain(namespace, key)
    for line in str(explanation).splitlines():
        out.line(line)
    out.result(
        {
            "environment": env.name,
            "namespace": explanation.namespace,
            "key": None if explanation.key is None else explanation.key.decode("utf-8"),
            "entries": explanation.entries,
            "has_key": explanation.has_key,
            "nearby": as_json(explanation.nearby),
            "explanation": str(explanation),
        }
    )
    return 0
