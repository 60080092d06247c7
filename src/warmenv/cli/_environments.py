"""Opening the environment a command works on, and saying why one cannot be used.

A command names its environment with `--env`/`--root` (else the
configured one). The library opens whatever it can, falling back to memory
when the file cannot be used; a command must not work on a stand-in for
the file the user asked about, so `environment()` refuses it, and says
why from the value the library gives (`Environment.degraded`: the fallback,
and the reason in terms of the file on disk), never from a look of its own.
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from warmenv._errors import WarmenvError
from warmenv._fs import expand_home, missing_link
from warmenv.cli._errors import Failure, UsageError
from warmenv.config import check_name
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


def check_env_option(args: argparse.Namespace) -> None:
    """A `UsageError` if `--env` is given and is no environment's name."""
    if args.env is not None:
        try:
            check_name(args.env)
        except ValueError as exc:
            raise UsageError(str(exc)) from None


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
        degraded = env.degraded
        if degraded is not None and (degraded.fallback is Fallback.MEMORY or write):
            raise Failure(_cannot_use(env.name, degraded, write))
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
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if not name.endswith(".db"):
            continue
        try:
            mode = os.stat(root / name).st_mode
        except FileNotFoundError:
            continue  # a dangling symlink, or removed since the listing
        if stat.S_ISREG(mode):
            found.append(root / name)
    return found


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
    return Failure(f"cannot read {exc.filename or where}: {exc.strerror or exc}")


_DIRECTORY_ACCESS = (("readable", os.R_OK), ("searchable", os.X_OK))


_MISNAMED = {
    "stats": "not a namespace: did you mean `warmenv stats --env {name}`?",
    "explain": "not a namespace: did you mean `warmenv explain NAMESPACE --env {name}`?",
    "import": "not a bundle file: to import a bundle into it, run "
    "`warmenv import BUNDLE --env {name}`",
    "export": "not a file or root here: did you mean `warmenv export OUT --env {name}`?",
}
_NOT_A_BUNDLE = (
    "not a bundle file: make a bundle of it first with `warmenv export OUT --env {name} "
    "--name NAME --app-version VERSION`"
)


def misnamed(args: argparse.Namespace) -> str | None:
    """Where the command's argument (`stats NAMESPACE`, `import BUNDLE`...) names an
    environment under the root rather than what the command takes, say so and what was
    meant (`warmenv stats big` for `warmenv stats --env big`; export's first SOURCE that
    does not exist). Called only once that argument was not found, so a lookup here
    costs nothing on success."""
    given = (
        getattr(args, "namespace", None)
        or getattr(args, "bundle", None)
        or next((s for s in getattr(args, "sources", None) or () if not os.path.lexists(s)), None)
    )
    if args.env is not None or not isinstance(given, str | Path):
        return None
    value = str(given)
    try:
        check_name(value)
        _, root = active()
        place = expand_home(args.root or root) / f"{value}.db"
        if not place.is_file():
            return None
    except (ValueError, WarmenvError, OSError):
        return None
    said = _MISNAMED.get(args.subcommand, _NOT_A_BUNDLE).format(name=value)
    return f"{value!r} is an environment in {place.parent}, {said}"


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
        return f"no environment {path.stem!r}: {path.parent} does not exist yet; {_MADE_BY}"
    names = await anyio.to_thread.run_sync(existing)
    if isinstance(names, str):
        there = f"its listing cannot be read: {names}"
    else:
        there = f"environments there: {', '.join(names)}" if names else "it holds no environments"
    if names:
        return f"no environment {path.stem!r} in {path.parent} ({there})"
    return f"no environment {path.stem!r} in {path.parent} ({there}); {_MADE_BY}"


_MADE_BY = (
    "an environment is made by open_environment() in an application or `warmenv import BUNDLE`"
)


def _not_ours(exc: NotAnEnvironmentError) -> str:
    name = "" if exc.path is None else f" {exc.path.stem!r}"
    return (
        f"cannot use environment{name}: {exc.path} is not a warmenv environment: {exc.why}; "
        "nothing was done (move it away, or choose another --env)"
    )


def _cannot_use(name: str, degraded: Degraded, write: bool) -> str:
    """Why environment `name` cannot do the job, from how it fell back (values only).

    The reason (`Degraded.reason`) already says what stands in the way on disk;
    nothing is looked up again here.
    """
    if degraded.fallback is Fallback.READ_ONLY:
        return f"environment {name!r} is read-only: {degraded.reason}; nothing was done"
    if write:
        return (
            f"cannot write environment {name!r}: {degraded.reason}; nothing would persist, "
            "so nothing was done (choose another --env, or point --root or WARMENV_ROOT at a "
            "directory you can write)"
        )
    return f"cannot read environment {name!r}: {degraded.reason}"
