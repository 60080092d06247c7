"""`warmenv export OUT --name NAME --app-version VERSION`: write environments into a bundle.

The arguments are checked before any file is touched (an empty or non-UTF-8
name or version is bad usage, exit 2), and the default source, `--env`, is
only read: exporting an environment that does not exist creates nothing.
The version recorded in the manifest is the application's, so it is asked
for: warmenv cannot know it, and guessing from the namespaces would record
one application's version for a bundle that holds several.

OUT comes first, and a new user swaps it with SOURCE, or names the
environment as OUT (`warmenv export quickstart`): an OUT without a suffix
that is an environment's name is refused before anything is written, and a
SOURCE that is not found, or is a bundle, is said with the command line that
was meant (`_meant`). A bundle is never a source: it is imported into an
environment, and that is exported.
"""

from __future__ import annotations

import argparse
import os
import shlex
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread

from warmenv._facts import is_captured_tree
from warmenv._text import clean, has_control_characters, plural
from warmenv.bundle import BundleFormat, ExportReport, Started, exporting
from warmenv.bundle.base import FORMAT_VERSIONS
from warmenv.bundle.preflight import of_version
from warmenv.cli._environments import environment, environment_file
from warmenv.cli._errors import Failure, UsageError
from warmenv.cli._format import as_json, size
from warmenv.cli._options import (
    add_namespace_option,
    namespace_prefixes,
    no_match,
    text_argument,
    version_argument,
)
from warmenv.cli._output import Output, follow
from warmenv.persistence.namespace import Namespace


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "export",
        parents=[parent],
        help="export environments into a bundle file",
        description="Export SOURCEs (environments' .db files or roots; default: --env) "
        "into the bundle OUT. OUT is replaced only once the new bundle is complete; "
        "sources are only read.",
    )
    # OUT as typed (`./quickstart` is not `quickstart`: see `_refuse_environment_as_out`).
    parser.add_argument("out", metavar="OUT", help="the bundle file to write, e.g. h100.bundle")
    parser.add_argument(
        "sources",
        metavar="SOURCE",
        type=Path,
        nargs="*",
        default=[],  # optional: argparse counts a `*` positional without a default as required
        help="an environment's .db file or a root of them (default: the --env environment)",
    )
    parser.add_argument("--name", required=True, help='the bundle\'s name, e.g. "H100 Linux"')
    parser.add_argument(
        "--app-version",
        required=True,
        metavar="VERSION",
        help="your application's version, recorded in the manifest, e.g. 1.2",
    )
    parser.add_argument(
        "--format",
        choices=[str(f) for f in BundleFormat],
        default=str(BundleFormat.SQLITE),
        help="the bundle format (default: sqlite; flat reads faster, see docs/bundle-format.md)",
    )
    parser.add_argument(
        "--format-version",
        type=int,
        choices=FORMAT_VERSIONS,
        default=2,
        help="the bundle format version (default: 2, where each entry carries its "
        "written_at and cost); 1 for readers that know only format 1, such as warmenv 0.1: "
        "it carries neither, so hits on its entries count no seconds saved",
    )
    parser.add_argument(
        "--sign",
        metavar="KEY",
        type=Path,
        help="sign the bundle with the private key file KEY (made by `warmenv keygen`), so "
        "that importers who trust its public key can tell it is yours",
    )
    add_namespace_option(parser)
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    typed, args.out = args.out, Path(args.out)
    out.misnamed = partial(_meant, args, typed)
    await anyio.to_thread.run_sync(_refuse_environment_as_out, args, typed)
    name = text_argument(args.name, "--name")
    if not name.strip():
        raise UsageError(
            '--name must not be empty or blank: name the bundle, e.g. --name "H100 Linux"'
        )
    if has_control_characters(name):
        raise UsageError(
            f"--name '{clean(name)}' contains control characters; name the bundle in "
            'printable text, e.g. --name "H100 Linux"'
        )
    version = version_argument(args.app_version)
    prefixes = namespace_prefixes(args)
    out.when_interrupted = f"no bundle was written, and {args.out} is as it was"
    if args.sources:
        report = await _export(args, out, list(args.sources), name, version, prefixes)
    else:
        async with environment(args, out) as env:
            report = await _export(args, out, [env], name, version, prefixes)
    out.when_completed = f"but the export had completed: {args.out} is published"
    out.line(
        f"exported {plural(report.entries, 'entry', 'entries')} ({size(report.bytes)}) in "
        f"{plural(len(report.namespaces), 'namespace')} to {report.path} "
        f"in {report.elapsed:.2f}s"
    )
    if report.left_out:
        out.warning(
            f"left out {plural(report.left_out, 'row')} whose namespace is not UTF-8 text "
            "(another program wrote them; `warmenv ls` lists them)"
        )
    if report.entries == 0:
        # Written all the same (a pipeline exporting whatever a job warmed gets a
        # bundle that imports as nothing), but almost always a mistake worth a line.
        out.warning(
            f"{'the sources' if len(args.sources or ()) > 1 else 'the source'} held no "
            f"entries: {report.path} is a valid bundle of nothing (an import of it adds "
            "nothing); check the --env or SOURCE given"
        )
    _warn_if_of_no_namespace(out, report, version)
    if report.manifest.signature is not None:
        out.line(f"signed by {report.manifest.signature.key}")
    out.result(as_json(report))
    return 0


async def _export(
    args: argparse.Namespace,
    out: Output,
    sources: list[Any],
    name: str,
    version: str,
    prefixes: list[str] | None,
) -> ExportReport:
    try:
        async with exporting(
            sources,
            args.out,
            name=name,
            version=version,
            format=args.format,
            namespaces=prefixes,
            format_version=args.format_version,
            sign=args.sign,
        ) as progress:
            report = await follow(
                out,
                aiter(progress),
                f"exporting to {args.out.name}",
                on_start=partial(_refuse_no_match, prefixes),
            )
    except ValueError as exc:
        if isinstance(exc, UnicodeError):
            raise
        # The library refuses arguments no reader would accept (a name too long, say).
        raise UsageError(clean(exc)) from None
    assert isinstance(report, ExportReport)
    return report


def _warn_if_of_no_namespace(out: Output, report: ExportReport, version: str) -> None:
    """Warn when no exported namespace is of `--app-version`: an import for that version
    would take nothing. A warning, not a refusal: the bundle is whole, and an import
    without a version (or with one of the versions it holds) takes it all."""
    names = [s.namespace for s in report.namespaces]
    same, other = of_version(names, version)
    # Compiler caches are never of another version (`of_version`): only the application's
    # namespaces are ever in `other`, and those of `version` the only ones that can hit.
    if other and all(is_captured_tree(n) for n in same):
        held = sorted({Namespace.raw(n).version for n in other})
        said = (
            f"an import for version {clean(version)!r} takes its compiler caches only"
            if same
            else f"`warmenv check --app-version {clean(version)}` will say it will not hit"
        )
        out.warning(
            f"no exported namespace {'of the application ' if same else ''}is for version "
            f"{clean(version)!r} (they are of {', '.join(repr(clean(v)) for v in held)}): "
            f"{said}; export with --app-version {clean(held[0])} to match"
        )


def _refuse_environment_as_out(args: argparse.Namespace, typed: str) -> None:
    """A usage error where OUT, as typed, has no suffix and no directory and is the name
    of an environment under the root: `warmenv export quickstart` means to export it,
    not to write a bundle file called `quickstart` (`./quickstart` does that)."""
    if Path(typed).suffix or os.sep in typed or (os.altsep and os.altsep in typed):
        return
    place = environment_file(args, typed)
    if place is None:
        return
    # What was meant: the SOURCE that looks like a bundle as OUT, else the name's own.
    named = next((str(s) for s in args.sources if s.suffix == ".bundle"), f"{typed}.bundle")
    meant = f"warmenv export {shlex.quote(named)} --env {shlex.quote(typed)}"
    raise UsageError(
        f"OUT {typed!r} is environment {typed!r} in {place.parent}, not a bundle file: "
        f"did you mean `{meant}`? (to write a file named {typed!r}, give ./{typed})"
    )


def _meant(args: argparse.Namespace, typed: str) -> str | None:
    """What was meant, once a SOURCE was not found or was refused: a SOURCE that is an
    environment's name is meant as `--env`, and a SOURCE that looks like a bundle (by its
    `.bundle` suffix) where OUT does not was meant as OUT, which comes first. None: no
    better guess."""
    sources: list[Path] = args.sources
    missing = next((s for s in sources if not os.path.lexists(s)), None)
    if missing is not None and args.env is None:
        place = environment_file(args, str(missing))
        if place is not None:
            meant = f"warmenv export {shlex.quote(typed)} --env {shlex.quote(str(missing))}"
            return f"{str(missing)!r} is an environment in {place.parent}: did you mean `{meant}`?"
    output = next((s for s in sources if s.suffix == ".bundle"), None)
    if output is not None and Path(typed).suffix != ".bundle":
        return (
            f"OUT, the bundle to write, comes first: did you mean `warmenv export "
            f"{shlex.quote(str(output))} ...`?"
        )
    return None


def _refuse_no_match(prefixes: list[str] | None, started: Started) -> None:
    """Stop before anything is published when `--namespace` selects nothing."""
    if prefixes is not None and started.total_entries == 0:
        raise Failure(f"{no_match(prefixes)}; nothing was exported")
