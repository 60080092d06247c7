"""`warmenv ls`: the environments under the root, and one environment's namespaces.

`warmenv ls NAME` is `warmenv ls --env NAME` (a user's first try).
`ls` only reads: an environment named with `--env` that does not exist is an
error (exit 1) naming the environments that do, never a new empty file.
Without `--env`, a default environment that does not exist is not an error:
the environments of the root are listed, and `ls` says there is no default one.
Nor is a root that does not exist (a fresh machine's, before its first
environment): `ls` lists nothing, says the root does not exist yet as every
command does (`root_not_yet`), and succeeds, where a command that reads an
environment in it fails (the environment it reads is not there).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import anyio.to_thread

from warmenv._errors import WarmenvError
from warmenv._fs import expand_home, is_missing, missing_link
from warmenv._text import clean, plural
from warmenv.cli._environments import (
    check_env_option,
    dangling_environments,
    environment,
    environment_files,
    root_not_yet,
    unreadable,
)
from warmenv.cli._errors import UsageError
from warmenv.cli._format import as_json, namespace_label, size
from warmenv.cli._options import complete_environment
from warmenv.cli._output import Output
from warmenv.environment import active
from warmenv.persistence.storage import NamespaceSummary


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "ls",
        parents=[parent],
        help="list environments and the namespaces of one",
        description="List the environments under the root (--root, or the configured one) "
        "and the namespaces of one environment (NAME or --env, or the default) with their "
        "entries and sizes. Only reads: nothing is created.",
    )
    name = parser.add_argument(
        "name",
        metavar="NAME",
        nargs="?",
        help="the environment whose namespaces to list (the same as --env NAME)",
    )
    name.completer = complete_environment  # read by argcomplete
    parser.set_defaults(run=run)


def _absent(path: Path) -> bool:
    """Whether the environment file `path` is not there, in a root that is or that no
    environment has made yet (a fresh machine's first `ls` lists nothing, no error).
    A root under a symlink to a missing path is no fresh machine's: opening says so."""
    if not os.path.lexists(path.parent):
        return missing_link(path.parent) is None
    return os.path.isdir(path.parent) and is_missing(path)


def _listing(root: Path) -> list[tuple[Path, int | str]]:
    """The environment files of `root` with their sizes, and its `<name>.db` symlinks to
    a missing path with why they cannot be opened, by name; a `Failure` if `root`
    cannot be read."""
    try:
        files: list[tuple[Path, int | str]] = [
            (f, f.stat().st_size) for f in environment_files(root)
        ]
        return sorted([*files, *dangling_environments(root)])
    except OSError as exc:
        raise unreadable(exc, root) from None


def _default_root(root_option: Path | None) -> tuple[str, Path] | None:
    """The default environment's name and root (None where the settings are wrong:
    opening it says what is wrong)."""
    try:
        default_name, default_root = active()
    except WarmenvError:
        return None
    return default_name, expand_home(root_option or default_root)


async def run(args: argparse.Namespace, out: Output) -> int:
    if args.name is not None:
        if args.env is not None and args.env != args.name:
            raise UsageError(
                f"NAME {clean(args.name)!r} and --env {clean(args.env)!r} name two "
                "environments; give one"
            )
        args.env = args.name
    name: str | None = None
    namespaces: list[NamespaceSummary] | None = None
    root: Path | None = None
    listing: list[tuple[Path, int | str]] | None = None
    check_env_option(args)
    default = await anyio.to_thread.run_sync(_default_root, args.root)
    if default is not None:
        # The listing is shown first, whichever environment is named: a root that
        # cannot be read is said as itself (its path, and the access this process
        # lacks), as `ls` says it, not as an environment in it that could not be opened.
        default_name, root = default
        listing = await anyio.to_thread.run_sync(_listing, root)
        if args.env is None and await anyio.to_thread.run_sync(
            _absent, root / f"{default_name}.db"
        ):
            name = default_name
    if name is None:
        async with environment(args, out) as env:
            root = env.path.parent
            if listing is None:
                listing = await anyio.to_thread.run_sync(_listing, root)
            namespaces = await env.namespaces()
            name = env.name
    assert root is not None and listing is not None
    exists = bool(listing) or await anyio.to_thread.run_sync(os.path.lexists, root)
    out.table(
        f"environments in {root}",
        ["environment", "file size"],
        [
            [f.stem + (" (selected)" if f.stem == name and namespaces is not None else ""), size(s)]
            if isinstance(s, int)
            else [f"{f.stem} (dangling symlink)", "-"]
            for f, s in listing
        ],
        empty=f"no environments in {clean(root)}"
        if exists
        else f"no environments: the root {root_not_yet(root)}",
    )
    for _, why in listing:
        if isinstance(why, str):  # a dangling link: why it cannot be opened
            out.warning(f"{why}: no environment can be opened through it; fix or remove it")
    if namespaces is None:
        if listing:  # of an empty root, "no environments" has said it
            out.line(
                f"no environment named {name!r} (the default) in {root}; "
                "give a NAME (`warmenv ls NAME`) to list the namespaces of one"
            )
    else:
        out.table(
            f"namespaces in {name!r}",
            ["namespace", "entries", "size"],
            [
                [namespace_label(s.namespace, text=s.text), f"{s.entries:,}", size(s.bytes)]
                for s in namespaces
            ],
            empty=f"environment {name!r} holds no entries yet",
        )
        if namespaces:
            entries = sum(s.entries for s in namespaces)
            out.line(
                f"{plural(len(namespaces), 'namespace')}, "
                f"{plural(entries, 'entry', 'entries')} in {name!r}"
            )
    out.result(
        {
            "root": str(root),
            "environments": [
                {"name": f.stem, "path": str(f), "file_bytes": s}
                if isinstance(s, int)
                else {"name": f.stem, "path": str(f), "file_bytes": None, "dangling": s}
                for f, s in listing
            ],
            "root_exists": exists,
            "environment": name if namespaces is not None else None,
            "namespaces": None if namespaces is None else as_json(namespaces),
        }
    )
    return 0
