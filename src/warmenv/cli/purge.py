"""`warmenv purge`: delete an environment's entries (all, under a prefix, or from a bundle).

`--bundle DIGEST|NAME` is quarantine for a bad bundle: it deletes the
entries that came from it and are still imported, never a local value.

Nothing is created (purging an environment that does not exist is an error
naming those that do), and nothing is deleted until the answer is "y":
Ctrl-C or Ctrl-D at the prompt ends the command at once (exit 130).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from warmenv._text import plural
from warmenv.cli._environments import environment, named
from warmenv.cli._errors import Failure, Stopped, UsageError
from warmenv.cli._format import as_json, namespace_label
from warmenv.cli._options import add_namespace_option, namespace_prefixes, no_match, text_argument
from warmenv.cli._output import Output, ask
from warmenv.persistence.namespace import matches_any
from warmenv.persistence.storage import (
    AmbiguousBundleError,
    Failed,
    NamespaceSummary,
    bundles_to_purge,
    names_bundle,
)


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "purge",
        parents=[parent],
        help="delete entries from an environment",
        description="Delete the entries of an environment (--env), all of them, those under "
        "--namespace prefixes, or those imported from one bundle (--bundle; local values "
        "stay). Asks for confirmation on a terminal unless --yes is given.",
    )
    add_namespace_option(parser)
    parser.add_argument(
        "--bundle",
        metavar="DIGEST|NAME",
        help="only the entries still imported from this bundle (its digest, with or without "
        "the algorithm prefix, or its manifest name)",
    )
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    if args.bundle is not None:
        return await run_bundle(args, out)
    prefixes = namespace_prefixes(args)
    out.when_interrupted = "nothing deleted"
    async with environment(args, out, write=True) as env:
        held = await env.namespaces()
        matching = [s for s in held if matches_any(s.namespace, prefixes)]
        # A namespace that is not UTF-8 text (something else wrote it) is no store's to
        # purge: it is named and left, before anything is deleted.
        doomed = [s for s in matching if s.addressable]
        left = [s for s in matching if not s.addressable]
        kept = (
            f"left {plural(len(left), 'namespace')} that "
            f"{'is' if len(left) == 1 else 'are'} not UTF-8 text"
            f"{' or empty' if any(not s.namespace for s in left) else ''} (written by something "
            f"else): {', '.join(_quoted(s) for s in left)}"
        )
        if prefixes is not None and not doomed:
            also = f"; {kept}" if left else ""
            known = [s.namespace for s in held]
            raise Failure(f"{no_match(prefixes, known)} in {named(env)}; nothing deleted{also}")
        if left:
            out.warning(f"{named(env)}: {kept}")
        entries = sum(s.entries for s in doomed)
        if doomed and not args.yes:
            if not sys.stdin.isatty() or args.json:
                raise UsageError(
                    f"would delete {plural(entries, 'entry', 'entries')} from "
                    f"{named(env)}; "
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
    document = {
        "environment": env.name,
        "deleted": removed,
        "failed": failures,
        "left": as_json(left),
    }
    if failures:
        raise Failure(f"{plural(len(failures), 'namespace')} could not be purged", document)
    out.result(document)
    return 0


def _quoted(summary: NamespaceSummary) -> str:
    quoted = f"'{summary.namespace}'"
    return namespace_label(quoted, text=summary.text)


async def _confirm(args: argparse.Namespace, out: Output, what: str, question: str) -> None:
    """Return once the user said yes (or --yes); raise otherwise."""
    if args.yes:
        return
    if not sys.stdin.isatty() or args.json:
        raise UsageError(f"would delete {what}; pass --yes to confirm")
    answer = await ask(out, question)
    if answer is None:  # Ctrl-D
        out.line("")
        raise Stopped(signal.SIGINT, "no answer (end of input)")
    if answer.strip().lower() not in ("y", "yes"):
        raise Failure("nothing deleted")


async def run_bundle(args: argparse.Namespace, out: Output) -> int:
    """`purge --bundle`: the entries still imported from one bundle."""
    if args.namespaces is not None:
        raise UsageError("--bundle and --namespace cannot be combined; give one of them")
    wanted = text_argument(args.bundle, "--bundle")
    if not wanted:
        raise UsageError("--bundle must not be empty: give a bundle's digest or name")
    out.when_interrupted = "nothing deleted"
    async with environment(args, out, write=True) as env:
        known = (await env.statistics()).bundles
        matching = [b for b in known if names_bundle(wanted, b)]
        if not matching:
            there = ", ".join(repr(b.name) for b in known) or "none"
            raise Failure(
                f"no bundle {wanted!r} was imported into {named(env)} (bundles there: "
                f"{there}); nothing deleted"
            )
        # The library's rule, asked before the prompt: what its purge would refuse.
        try:
            bundles_to_purge(wanted, [b for b in known if b.entries], where=f"into {named(env)}")
        except AmbiguousBundleError as exc:
            raise Failure(str(exc)) from None
        entries = sum(b.entries for b in matching)
        what = f"{plural(entries, 'entry', 'entries')} imported from {matching[0].name!r}"
        await _confirm(args, out, f"{what} in {named(env)}", f"delete {what}? [y/N] ")
        result = await env.purge_bundle(wanted)
    document: dict[str, Any] = {
        "environment": env.name,
        "bundles": [{"name": b.name, "digest": b.digest} for b in matching],
    }
    if isinstance(result, Failed):
        raise Failure(f"purge of bundle {wanted!r} failed: {result.reason}", document)
    out.line(
        f"deleted {plural(result.count, 'entry', 'entries')} imported from "
        f"{matching[0].name!r}; local values were kept"
    )
    out.result({**document, "deleted": result.count})
    return 0
