"""`warmenv import BUNDLE`: copy a bundle's entries into an environment.

The bundle is opened and checked before the environment is touched, and an
environment the import created is removed again if the import fails before
storing anything: a failed import leaves no trace. An environment that cannot
persist (it fell back to memory, or opened read-only) is refused up front,
never reported as a success that vanishes with the process.

`BUNDLE` may be an http(s) URL: it is downloaded (with a progress bar) into
a private directory beside the environment, verified, then imported; a
download that fails removes what it fetched and what the import created.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs

from warmenv._errors import WarmenvError
from warmenv._fs import expand_home, is_missing
from warmenv._text import clean, plural
from warmenv.bundle import (
    Downloading,
    ImportProgress,
    ImportReport,
    NotFinishedError,
    importing,
)
from warmenv.bundle.base import Bundle
from warmenv.bundle.events import Event
from warmenv.bundle.importing import refuse_stale
from warmenv.bundle.open import open_snapshot, read_names
from warmenv.bundle.options import check_share
from warmenv.cli._environments import environment, named
from warmenv.cli._errors import Failure, UsageError
from warmenv.cli._format import as_json, size
from warmenv.cli._options import (
    add_namespace_option,
    add_trust_option,
    bundle_source,
    namespace_prefixes,
    no_match,
    source_label,
    trust_keys,
    version_argument,
)
from warmenv.cli._output import Output, follow
from warmenv.cli.verify import signed_by
from warmenv.environment import Environment, active
from warmenv.persistence.namespace import matches_any


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "import",
        parents=[parent],
        help="import a bundle into an environment",
        description="Import BUNDLE's entries into an environment (--env, created if need be), "
        "after checking its digest. Entries computed locally are never replaced.",
    )
    parser.add_argument(
        "bundle", metavar="BUNDLE", type=bundle_source, help="a bundle file, or an http(s) URL"
    )
    add_namespace_option(parser)
    parser.add_argument(
        "--app-version",
        metavar="VERSION",
        help="your application's version: import only the namespaces of that version (the "
        "ones it can hit), and refuse a bundle holding none before downloading or copying it",
    )
    parser.add_argument(
        "--share",
        metavar="FRACTION",
        type=_share,
        default=1.0,
        help="the most of the time the import may hold the environment, in (0, 1] (default 1): "
        "after each batch it pauses so that a service using the same environment file keeps "
        "the rest (0.25: a batch of 0.1 s, then 0.3 s for everyone else)",
    )
    parser.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip the digest check of a bundle you already trust (a bundle whose signature "
        "is checked has its digest checked all the same)",
    )
    add_trust_option(parser)
    parser.set_defaults(run=run)


def _share(text: str) -> float:
    """`--share`'s value: a fraction in (0, 1], or argparse's one-line usage error."""
    try:
        share = float(text)
        check_share(share)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a fraction of the time in (0, 1], such as 0.25"
        ) from None
    return share


async def run(args: argparse.Namespace, out: Output) -> int:
    prefixes = namespace_prefixes(args)
    version = None
    if args.app_version is not None:
        version = version_argument(args.app_version)
    args.import_version = version
    args.trust = trust_keys(args)
    out.when_interrupted = "nothing was imported"
    out.when_output_closed = lambda: (
        f"output closed: the import stopped after "
        f"{plural(out.entries_done, 'entry', 'entries')} (whole batches kept; "
        "run it again to finish)"
    )
    path = args.bundle
    if isinstance(path, str):  # a URL, fetched once the environment is open, beside it
        return await _run(args, out, path, prefixes, source_label(path))
    if version is not None:  # refused before the bundle is copied or anything is created
        found = await read_names(path)
        if found is not None and found.namespaces is not None:
            refuse_stale(str(path), list(found.namespaces), prefixes, version)
    where = _where(args)
    near = None if where is None else await anyio.to_thread.run_sync(_existing, where[1])
    # The import's own private copy (beside the environment's directory where it
    # exists), opened before the environment: a bad bundle fails before anything exists.
    async with open_snapshot(path, near=near, verified=args.verify) as bundle:
        await signed_by(bundle, path, args.trust)  # refused before the environment exists
        held = [s.namespace for s in await bundle.namespaces()]
        if prefixes is not None and not any(matches_any(n, prefixes) for n in held):
            raise Failure(f"{no_match(prefixes, held)} in {path}; nothing was imported")
        return await _run(args, out, bundle, prefixes, path.name)


async def _run(
    args: argparse.Namespace,
    out: Output,
    bundle: Bundle | str,
    prefixes: list[str] | None,
    label: str,
) -> int:
    made = await _not_there_yet(args)
    try:
        async with environment(args, out, create=True, write=True) as env:
            try:
                report = await _import(args, out, bundle, env, prefixes, label)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    if await _holds_entries(env):
                        made = _Made()  # whole batches went in: keep them for the next run
                raise
            target = named(env)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_remove, made)
        raise
    out.when_completed = f"but the import had completed into {target}"
    out.when_output_closed = None
    if made.database is not None:  # filling a fresh machine; or a name mistyped: said
        out.line(f"created {target}")
    out.line(
        f"imported {plural(report.imported, 'entry', 'entries')} ({size(report.bytes)}) "
        f"into {target}; "
        f"{report.skipped:,} already present, {report.failed:,} failed, "
        f"{report.rejected:,} rejected, in {report.elapsed:.2f}s"
        + ("" if report.signer is None else f"; signed by {report.signer}")
    )
    if report.other_versions:
        left = report.other_versions
        out.line(
            f"left out {plural(len(left), 'namespace')} of another version than "
            f"{args.import_version!r} (no lookup of it could hit them): "
            + ", ".join(clean(n) for n in left[:5])
            + (" ..." if len(left) > 5 else "")
        )
    if report.failed:
        raise Failure(
            f"{plural(report.failed, 'entry', 'entries')} could not be stored in {target}; "
            "run the import "
            "again once the cause (above, or a full disk) is fixed",
            as_json(report),
        )
    out.result(as_json(report))
    return 0


async def _import(
    args: argparse.Namespace,
    out: Output,
    bundle: Bundle | str,
    env: Environment,
    prefixes: list[str] | None,
    label: str,
) -> ImportReport:
    out.when_interrupted = (
        "what was imported so far is in whole batches; run the import again to finish it"
    )
    progress: ImportProgress | None = None
    try:
        async with importing(
            bundle,
            env,
            namespaces=prefixes,
            version=args.import_version,
            share=args.share,
            verify=args.verify,
            trust=args.trust,
        ) as progress:
            events: AsyncIterator[Event] = aiter(progress)
            if isinstance(bundle, str):
                events = _downloading(out, events, label)
            report = await follow(
                out, events, f"importing {label}", verifying=label if args.verify else None
            )
    except ValueError as exc:
        if isinstance(exc, UnicodeError):
            raise
        raise UsageError(clean(exc)) from None
    except BaseException:
        # Stopped before its first batch (while downloading or verifying, say):
        # then there is nothing to finish, and the message must not say there is.
        if progress is None or _committed(progress) == 0:
            out.when_interrupted = "nothing was imported"
        raise
    assert isinstance(report, ImportReport)
    return report


def _committed(progress: ImportProgress) -> int:
    """Entries the import's whole batches took in or found present (0: none ran)."""
    try:
        report = progress.report
    except NotFinishedError:
        return 0
    return report.imported + report.skipped + report.failed


async def _downloading(
    out: Output, events: AsyncIterator[Event], label: str
) -> AsyncIterator[Event]:
    """Show the download's progress, then pass the import's events on."""
    first = await anext(events)
    if isinstance(first, Downloading):
        with out.download(f"downloading {label}", first.total_bytes) as bar:
            while isinstance(first, Downloading):
                bar.update(bytes=first.bytes_done)
                first = await anext(events)
    yield first
    async for event in events:
        yield event


async def _holds_entries(env: Environment) -> bool:
    try:
        return bool(await env.namespaces())
    except Exception:
        return True  # cannot tell: keep it


@attrs.frozen
class _Made:
    """What opening the environment may create, as found missing before it: directories,
    outermost first, its file and the file's companions (`-wal`...). Only these are ever
    removed: what was there before (a symlink to a missing path, a stale `-journal`) is
    not the import's, whatever the open then says of it."""

    directories: tuple[Path, ...] = ()
    database: Path | None = None
    companions: tuple[Path, ...] = ()


def _where(args: argparse.Namespace) -> tuple[str, Path] | None:
    """The environment's name and root, as the open will take them (None: it will fail)."""
    name, root = args.env, args.root
    if name is None or root is None:
        try:
            default_name, default_root = active()
        except WarmenvError:
            return None  # the open says what is wrong
        name, root = name or default_name, root or default_root
    return name, expand_home(root)


def _existing(directory: Path) -> Path | None:
    return directory if directory.is_dir() else None


async def _not_there_yet(args: argparse.Namespace) -> _Made:
    where = _where(args)
    if where is None:
        return _Made()
    name, root = where
    return await anyio.to_thread.run_sync(_missing, root, f"{name}.db")


def _missing(root: Path, file_name: str) -> _Made:
    # `is_missing`, not `exists()`: a symlink to a missing path is there, and not ours.
    directories: list[Path] = []
    directory = root = expand_home(root)
    while is_missing(directory) and directory != directory.parent:
        directories.insert(0, directory)
        directory = directory.parent
    database = root / file_name
    if not is_missing(database):
        return _Made(tuple(directories))
    companions = (database.with_name(database.name + s) for s in ("-wal", "-shm", "-journal"))
    return _Made(tuple(directories), database, tuple(c for c in companions if is_missing(c)))


def _remove(made: _Made) -> None:
    """Remove what the import created, if it is still there and empty."""
    for path in (made.database, *made.companions):
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
    for directory in reversed(made.directories):
        with contextlib.suppress(OSError):  # not empty: someone else uses it now
            directory.rmdir()
