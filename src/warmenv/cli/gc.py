"""`warmenv gc`: evict entries by size, age and number of versions kept.

`--keep-versions N` keeps, per application name and path, the N versions
written most recently; `--older-than DAYS` drops entries neither written nor
hit for that long; `--max-bytes SIZE` (default: the configured `max_bytes`)
then drops the least recently hit entries, never-hit ones first, until keys
and values fit. One transaction: all of it happens or none. The file does
not shrink until `warmenv vacuum`.
"""

from __future__ import annotations

import argparse
from typing import Any

from warmenv._text import plural
from warmenv.cli._environments import environment, named
from warmenv.cli._errors import Failure, UsageError
from warmenv.cli._format import size
from warmenv.cli._output import Output
from warmenv.config import parse_size
from warmenv.persistence.storage import Failed


def _size(text: str) -> int:
    parsed = parse_size(text)
    if parsed is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give bytes (500000) or a size such as 512MiB or 2GB"
        )
    return parsed


def _days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not days >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days >= 0 (e.g. 30 or 0.5)")
    return days


def _versions(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of versions >= 1")
    return n


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "gc",
        parents=[parent],
        help="evict entries by size, age or number of versions",
        description="Evict entries of an environment (--env): namespaces of all but the N "
        "newest versions of each application and path, entries unused for DAYS, then the "
        "least recently hit ones until the rest fits SIZE. Run `warmenv vacuum` afterwards "
        "to give the space back to the file system.",
    )
    parser.add_argument(
        "--max-bytes",
        metavar="SIZE",
        type=_size,
        help="evict least recently hit entries until keys and values fit SIZE "
        "(bytes, or e.g. 512MiB, 2GB; default: the configured max_bytes)",
    )
    parser.add_argument(
        "--older-than",
        metavar="DAYS",
        type=_days,
        help="evict entries neither written nor hit for DAYS days",
    )
    parser.add_argument(
        "--keep-versions",
        metavar="N",
        type=_versions,
        help="per application name and path, keep only the N most recently written versions",
    )
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    out.when_interrupted = "nothing evicted (gc is one transaction)"
    async with environment(args, out, write=True) as env:
        configured = env.max_bytes
        max_bytes = args.max_bytes if args.max_bytes is not None else configured
        if max_bytes is None and args.older_than is None and args.keep_versions is None:
            raise UsageError(
                "needs at least one of --max-bytes SIZE, --older-than DAYS or "
                "--keep-versions N (or max_bytes in the configuration)"
            )
        before = await env.namespaces()
        result = await env.gc(
            max_bytes=max_bytes,
            older_than=None if args.older_than is None else args.older_than * 86_400,
            keep_versions=args.keep_versions,
        )
        if isinstance(result, Failed):
            raise Failure(f"gc of {named(env)} failed: {result.reason}; nothing evicted")
        evicted = plural(result.count, "entry", "entries")
        out.when_interrupted = f"but the gc had completed: {evicted} evicted"
        after = await env.namespaces()
    entries, held = sum(s.entries for s in after), sum(s.bytes for s in after)
    freed = sum(s.bytes for s in before) - held
    out.line(
        f"evicted {plural(result.count, 'entry', 'entries')} ({size(freed)}); "
        f"{plural(entries, 'entry', 'entries')} ({size(held)}) left in {env.name!r}"
        + ("; run `warmenv vacuum` to shrink the file" if result.count else "")
    )
    out.result(
        {
            "environment": env.name,
            "evicted": result.count,
            "freed_bytes": freed,
            "entries": entries,
            "bytes": held,
            "max_bytes": max_bytes,
        }
    )
    return 0
