"""The `warmenv` command: inspect, move and manage warm environments.

Each sub-command lives in its own module and registers itself on the parser;
this module only dispatches and turns failures into one clear line and an
exit status (0 done, 1 failed, 2 bad usage, 130 interrupted). rich is
imported here and nowhere in the library, and only when it is installed
(`pip install warmenv[cli]`); without it the command prints plain lines.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import anyio

from warmenv._errors import WarmenvError
from warmenv.cli import _common, check, demo, export, imports, inspect, ls, purge, verify

__all__ = ["main"]

_COMMANDS = (demo, ls, export, imports, inspect, verify, check, purge)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warmenv",
        description="Keep expensive start-up results warm, and ship them between machines.",
    )
    from warmenv import __version__

    parser.add_argument("--version", action="version", version=f"warmenv {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in _COMMANDS:
        command.register(commands, _common.shared_options())
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    # argparse takes OUT and SOURCE... in one go, so sources written after the
    # options (`export OUT --name N SOURCE`) come back unrecognised: they are
    # sources all the same.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "sources", None) is None or any(a.startswith("-") for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.sources = [*args.sources, *(Path(a) for a in extra)]
    out = _common.Output(json=args.json)
    try:
        status = anyio.run(args.run, args, out, backend="asyncio")
    except KeyboardInterrupt:
        out.error("interrupted; what was committed is whole, and the bundle file is untouched")
        return 130
    except _common.UsageError as exc:
        out.error(str(exc))
        return 2
    except (WarmenvError, OSError) as exc:
        if args.debug:
            traceback.print_exc()
        out.error(_common.describe_error(exc))
        return 1
    return int(status)


def entry_point() -> None:  # pragma: no cover - the console script
    sys.exit(main())
