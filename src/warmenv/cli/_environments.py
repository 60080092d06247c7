"""Opening the environment a command works on, and saying why one cannot be used.

A command names its environment with `--env`/`--root` (else the
configured one). The library opens whatever it can, falling back to memory
when the file cannot be used; a command must not work on a stand-in for
the file the user asked about, so `environment()` refuses it, and says
why from the value the library gives (`Environment.degraded`: the fallback,
and the reason in terms of the file on disk), never from a look of its own
(one look only picks the fix to suggest: `_cannot_use`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import stat
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from warmenv._errors import WarmenvError
from warmenv._fs import expand_home, missing_link
from warmenv.cli._errors import Failure, UsageError
from warmenv.cli._suggest import did_you_mean
from warmenv.config import BUNDLE_SUFFIX, check_name, file_suffix, is_valid_name
from warmenv.environment import (
    Degraded,
    Environment,
    Fallback,
    NotAnEnvironmentError,
    active,
    open_environment,
)

if TYPE_CHECKING:
    from warmenv.cli._output import Output
    from warmenv.remote import RemoteTier


ROOT_FROM = (
    "--root DIR, the WARMENV_ROOT variable, or root in warmenv.toml ([tool.warmenv] in "
    "pyproject.toml)"
)
"""The ways a command that opens environments takes its root (`demo`: --root alone)."""


def check_env_option(args: argparse.Namespace) -> None:
    """A `UsageError` if `--env` is given and is no environment's name: the library's
    reason, and for a bundle's name the command that fits what was meant."""
    if args.env is not None:
        try:
            check_name(args.env)
        except ValueError as exc:
            meant = _BUNDLE_MEANT if file_suffix(args.env) == BUNDLE_SUFFIX else None
            if meant is None:
                raise UsageError(str(exc)) from None
            # Only a name of the rule's characters gets here: the command is safe to paste.
            bundle = f"./{args.env}" if args.env.startswith("-") else args.env
            said = meant.get(args.subcommand, meant[None]).format(bundle=bundle)
            raise UsageError(f"{exc}; {said}") from None


# What a bundle's name given as --env was meant for: importing it, or (any other
# command) looking into it.
_BUNDLE_MEANT: dict[str | None, str] = {
    "import": "to import it, give it as the BUNDLE: `warmenv import {bundle} --env NAME`",
    None: "to see what it holds: `warmenv inspect {bundle}`",
}


@asynccontextmanager
async def environment(
    args: argparse.Namespace, out: Output, *, create: bool = False, write: bool = False
) -> AsyncIterator[Environment]:
    """The environment `--env`/`--root` name, refused unless it can do the job.

    `create=False` (commands that only read, and purge) never creates a file
    or directory: a missing environment is a `Failure` naming what exists.
    A command that neither creates nor writes opens it `read_only`: nothing
    is upgraded, converted or written. A file that is not warmenv's is a
    `Failure` naming it, and is left as it is.
    An environment that fell back to memory is refused always (it is not the
    file the user asked about), a read-only one when `write` is asked for.
    """
    check_env_option(args)
    async with AsyncExitStack() as stack:
        with out.holding() as notes:
            try:
                env = await stack.enter_async_context(
                    open_environment(
                        args.env,
                        root=args.root,
                        create=create,
                        read_only=not (create or write),
                        remote=getattr(args, "remote", None),
                    )
                )
            except NotAnEnvironmentError as exc:
                raise Failure(_not_ours(exc)) from None
            except FileNotFoundError as exc:
                if create or not exc.filename:
                    raise
                raise Failure(await _no_environment(Path(exc.filename)), not_found=True) from None
        await refuse_unusable(env, write=write)
        if not write:
            # A command that only reads must not evict on close (a configured
            # max_bytes is enforced by the application and `warmenv gc`).
            env.max_bytes = None
        for note in notes:
            out.warning(note)
        if env.remote is not None:
            await _reach(env.remote)
        if out.subject is None:
            out.subject = env.path
        yield env


def named(env: Environment) -> str:
    """The environment as a command's line names it: its name and file (and its remote).

    Not `Environment.describe()`, whose "(read-only)" says how the library was
    asked to open it: every command that only reads opens it so, and the
    suffix read as if the file could not be written (it can; an environment
    that cannot is refused with its reason by `environment()`).
    """
    shared = f", shared through {env.remote.describe()}" if env.remote is not None else ""
    return f"environment {env.name!r} at {env.path}{shared}"


@asynccontextmanager
async def usable(
    out: Output,
    opening: AbstractAsyncContextManager[Environment],
    *,
    write: bool,
    root_from: str = ROOT_FROM,
) -> AsyncIterator[Environment]:
    """The environment `opening` opens, refused (`refuse_unusable`) before any work; the
    library's warning about a fallback is held, so that a refusal is said in one line."""
    async with AsyncExitStack() as stack:
        with out.holding() as notes:
            env = await stack.enter_async_context(opening)
        await refuse_unusable(env, write=write, root_from=root_from)
        for note in notes:
            out.warning(note)
        yield env


async def refuse_unusable(env: Environment, *, write: bool, root_from: str = ROOT_FROM) -> None:
    """A `Failure` saying why, if `env` fell back to memory (it is not the file the user
    asked about), or to reading only when `write` is asked for; else nothing.
    `root_from`: the ways the command takes its root (`ROOT_FROM`, or `demo`'s --root
    alone), named where the root is what to change.

    Every command that opens an environment asks this (`environment()`, and
    `demo`, which opens its own two), before any work: a demo that autotuned
    for seconds into memory only to find it has no file to export, or an
    import that "succeeded" into memory, would have done work for nothing.
    """
    degraded = env.degraded
    if degraded is not None and (degraded.fallback is Fallback.MEMORY or write):
        there = await anyio.to_thread.run_sync(os.path.lexists, env.path)
        root_there = await anyio.to_thread.run_sync(os.path.isdir, env.path.parent)
        raise Failure(
            _cannot_use(
                env, degraded, write, file_there=there, root_there=root_there, root_from=root_from
            )
        )


async def _reach(tier: RemoteTier) -> None:
    """Ask the remote once, so that one that cannot be reached is said at once.

    No command needs the remote to do its job (each works on the local
    database; the remote is only a second tier for lookups), so none fails
    for an outage. A server that answers refusing the URL's settings (a wrong
    password or user, a database it lacks, an ACL) is a configuration error
    instead, one line naming the URL (password hidden), exit 1. Unprobed, the
    tier would connect on its first lookup, and a
    command that looks nothing up would never say that `--remote` (or
    `WARMENV_REMOTE`, or the configuration's `remote`) is unreachable. The
    tier itself warns, once per outage, with the reason (password hidden),
    and serves from the local tier from then on without trying again for a
    while, so the command pays the probe's timeout at most once.
    """
    ping = await tier.ping()  # an outage is warned about by the tier, once
    if ping.misconfigured:
        # Not an outage: the server answered that the URL is wrong. Going on would
        # hide it (the command works, the fleet never shares), so it is an error.
        raise Failure(
            f"{ping}: fix the password, user or database number in the remote URL "
            "(--remote, WARMENV_REMOTE or the configuration's remote); nothing was done"
        )


def environment_files(root: Path) -> list[Path]:
    """The environments under `root`: its `<name>.db` files, sorted; none if it is missing.

    `OSError` where `root` or a file in it cannot be looked at: a directory
    that cannot be read holds environments this process cannot see, which is
    not "no environments" (`Path.glob` passes over it in silence).
    """
    found = []
    for name in _database_names(root):
        try:
            mode = os.stat(root / name).st_mode
        except FileNotFoundError:
            continue  # a dangling symlink, or removed since the listing
        if stat.S_ISREG(mode):
            found.append(root / name)
    return found


def dangling_environments(root: Path) -> list[tuple[Path, str]]:
    """The `<name>.db` entries of `root` that are symlinks to a missing path, each with
    `_fs.missing_link`'s clause (`environment_files` passes over them: they hold no
    environment to open, but a user who made the link expects to see it listed).
    `OSError` as for `environment_files`."""
    found = []
    for name in _database_names(root):
        path = root / name
        if (why := missing_link(path)) is not None:
            found.append((path, why))
    return found


def _database_names(root: Path) -> list[str]:
    """The names in `root` that end in `.db`, sorted; none if `root` is missing (`OSError`
    where it cannot be read)."""
    try:
        return sorted(name for name in os.listdir(root) if name.endswith(".db"))
    except FileNotFoundError:
        return []


def unreadable(exc: OSError, where: Path) -> Failure:
    """The one line of a directory `where` (or a file in it) that cannot be read.

    A directory this process may not list or enter (so not read a file in it)
    is said so ("not readable or searchable"), the mode bits to fix, where
    "Permission denied" leaves the user to guess which.
    """
    if isinstance(exc, NotADirectoryError):  # `where`, or a file on the way to it
        top_down = reversed([where, *where.parents])
        blocker = next((p for p in top_down if p.exists() and not p.is_dir()), where)
        return Failure(f"cannot read {where}: {blocker} is not a directory")
    if isinstance(exc, PermissionError) and os.path.isdir(where):
        denied = [word for word, bit in _DIRECTORY_ACCESS if not os.access(where, bit)]
        if denied:
            return Failure(f"cannot read {where}: not {' or '.join(denied)} by this process")
    if isinstance(exc, PermissionError):  # `where` cannot even be looked at: a parent says no
        top_down = reversed(where.parents)
        closed = next((p for p in top_down if not os.access(p, os.X_OK)), None)
        if closed is not None:
            return Failure(f"cannot read {where}: {closed} is not searchable by this process")
    return Failure(f"cannot read {exc.filename or where}: {exc.strerror or exc}")


_DIRECTORY_ACCESS = (("readable", os.R_OK), ("searchable", os.X_OK))


_MISNAMED = {
    "stats": "not a namespace: did you mean `warmenv stats --env {name}`?",
    "explain": "not a namespace: did you mean `warmenv explain NAMESPACE --env {name}`?",
    "import": "not a bundle file: to import a bundle into it, run "
    "`warmenv import BUNDLE --env {name}`",
}
_NOT_A_BUNDLE = (
    "not a bundle file: make a bundle of it first with `warmenv export OUT --env {name} "
    "--name NAME --app-version VERSION`"
)


def misnamed(args: argparse.Namespace) -> str | None:
    """Where the command's argument (`stats NAMESPACE`, `import BUNDLE`...) names an
    environment under the root rather than what the command takes, say so and what was
    meant (`warmenv stats big` for `warmenv stats --env big`; export's arguments have
    their own, `export.misplaced`). Called only once that argument was not found, so a
    lookup here costs nothing on success."""
    given = getattr(args, "namespace", None) or getattr(args, "bundle", None)
    if args.env is not None or not isinstance(given, str | Path):
        return None
    value = str(given)
    place = environment_file(args, value)
    if place is None:
        return None
    said = _MISNAMED.get(args.subcommand, _NOT_A_BUNDLE).format(name=value)
    return f"{value!r} is an environment in {place.parent}, {said}"


def misplaced(args: argparse.Namespace, extra: list[str]) -> str | None:
    """What was meant by the arguments argparse could not place (`extra`), where that can
    be told: an environment's name given as a positional (`warmenv stats svc app/1/k`,
    `warmenv purge svc`, `warmenv import b.bundle svc`) is meant as `--env`.

    A name that is an environment under the root is said so, with the command line
    meant; a name that could be one, for a command that takes `--env` and was given
    none, gets the option to write. Anything else: `None` (argparse's line stands alone).
    `ls NAME` already takes the environment's name: nothing there is meant as `--env`.
    """
    if not getattr(args, "takes_env", False) or args.env is not None:
        return None
    if getattr(args, "name", None) is not None:
        return None
    strays = [a for a in extra if not a.startswith("-")]
    # The commands' own positionals, in the order they take them.
    given = [
        str(g)
        for k in ("bundle", "namespace", "key")
        if isinstance(g := getattr(args, k, None), str | Path)
    ]
    positionals = [*given, *strays]
    for value in positionals:
        place = environment_file(args, value)
        if place is not None:
            rest = [shlex.quote(a) for a in positionals if a != value]
            meant = " ".join(["warmenv", args.subcommand, *rest, "--env", shlex.quote(value)])
            return f"{value!r} is an environment in {place.parent}: did you mean `{meant}`?"
    if len(strays) == 1 and is_valid_name(strays[0]):
        return f"to name an environment, give --env {shlex.quote(strays[0])}"
    return None


def environment_file(args: argparse.Namespace, value: str) -> Path | None:
    """`<root>/<value>.db` where `value` names an environment there, else None."""
    try:
        check_name(value)
        _, root = active()
        place = expand_home(args.root or root) / f"{value}.db"
        return place if place.is_file() else None
    except (ValueError, WarmenvError, OSError):
        return None


async def _no_environment(path: Path) -> str:
    def existing() -> list[str] | str:
        try:
            return [p.stem for p in environment_files(path.parent)]
        except OSError as exc:
            return str(exc.strerror or exc)

    if (dangling := await anyio.to_thread.run_sync(missing_link, path.parent)) is not None:
        return (
            f"no environment {path.stem!r}: {dangling}; fix the symlink, or create the "
            "directory it names"
        )
    if await anyio.to_thread.run_sync(path.parent.exists):
        if not await anyio.to_thread.run_sync(path.parent.is_dir):
            return f"no environment {path.stem!r}: {path.parent} is not a directory"
    else:
        return f"no environment {path.stem!r}: {root_not_yet(path.parent)}"
    names = await anyio.to_thread.run_sync(existing)
    if isinstance(names, str):
        there = f"its listing cannot be read: {names}"
    else:
        there = f"environments there: {', '.join(names)}" if names else "it holds no environments"
    if names:
        close = did_you_mean(path.stem, names)
        return f"no environment {path.stem!r} in {path.parent} ({there})" + (
            f"; {close}" if close else ""
        )
    return f"no environment {path.stem!r} in {path.parent} ({there}); {_MADE_BY}"


_MADE_BY = (
    "an environment is made by open_environment() in an application or `warmenv import BUNDLE`"
)


def root_not_yet(root: Path) -> str:
    """A root that does not exist, as every command says it: `ls` (which lists nothing and
    succeeds: a fresh machine's) and the commands that read an environment in it (which
    fail: the environment asked about is not there)."""
    return f"{root} does not exist yet; {_MADE_BY}"


def _not_ours(exc: NotAnEnvironmentError) -> str:
    name = "" if exc.path is None else f" {exc.path.stem!r}"
    return (
        f"cannot use environment{name}: {exc.path} is not a warmenv environment: {exc.why}; "
        "nothing was done (move it away, or choose another --env)"
    )


def _cannot_use(
    env: Environment,
    degraded: Degraded,
    write: bool,
    *,
    file_there: bool,
    root_there: bool,
    root_from: str,
) -> str:
    """Why environment `env` cannot do the job, from how it fell back, and the fix to try.

    The reason (`Degraded.reason`) already says what stands in the way on disk;
    it is not looked up again here. Only the fix depends on a look: with no
    file at the environment's path, what failed is making one in the root (or
    the root itself, where it does not exist: named first, as what could not
    be made), so another name would fail alike and the root is what to
    change (with the ways the command takes one, `root_from`); with a file
    there that is no database (a FIFO, a directory), another name avoids it.
    The one home of a root that cannot be written, for every command.
    """
    name, root = env.name, env.path.parent
    if degraded.fallback is Fallback.READ_ONLY:
        # Its reason says the fix (a bundle at the path, a directory not writable).
        return f"environment {name!r} is read-only: {degraded.reason}; nothing was done"
    if not write:
        return f"cannot read environment {name!r}: {degraded.reason}"
    if file_there:
        fix = f"move {env.path} away, or choose another --env"
        why = degraded.reason
    elif root_there:
        fix = f"environments live in the root {root}: choose a root you can write with {root_from}"
        why = degraded.reason
    else:
        fix = f"choose a root you can write with {root_from}"
        why = f"cannot create its root {root} ({degraded.reason})"
    return (
        f"cannot write environment {name!r}: {why}; nothing would persist, so nothing was "
        f"done ({fix})"
    )
