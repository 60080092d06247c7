"""What kind of file a path names, for refusing anything but regular files,
and whether another user could redirect or swap what lies at a path.

Opening a FIFO blocks until a writer appears and reading a device never
ends, so every file warmenv opens by path (environment databases, bundles,
export sources and targets) is checked to be a regular file first, and a
file found in a directory (a compiler's cache, a staging area) is opened
by `open_found`: never through a symlink, never waiting, checked once open.

A path another user can bend is not ours to write through: a symlink of
theirs on the way can point at anything (root would create a file inside its
own directory at their say), and a directory they may write without the
sticky bit lets them rename what is in it and put a symlink in its place.
`open_to_others` is that one rule for directories (the compiler caches'
targets and the environment roots); `why_redirectable` applies it, and the
symlink rule, to every step of a path as the system resolves it.

A file someone else writes (a child process's counts, a compiler's cache, a
settings file found walking up from the working directory) can be made as
large as its writer likes: every such file is read through `read_bounded`,
never more than a limit its reader sets, so no byte is allocated before it
is bounded.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
from pathlib import Path
from typing import Final, final

import attrs

from warmenv._errors import WarmenvError

__all__ = [
    "check_output_directory",
    "close_unless_regular",
    "NoSuchHomeError",
    "expand_home",
    "is_missing",
    "kind_of",
    "make_directories",
    "missing_link",
    "non_regular_kind",
    "open_found",
    "open_to_others",
    "read_bounded",
    "why_redirectable",
]

_MAX_SYMLINKS = 40  # as Linux's path resolution
_CHUNK = 1 << 20


class NoSuchHomeError(WarmenvError, ValueError):
    """A path starts with `~user` (or `~`) and that user has no home directory here."""


def expand_home(path: str | os.PathLike[str], where: str = "") -> Path:
    """`path` with a leading `~` or `~user` expanded, as `Path.expanduser` does: the one
    expansion of a path warmenv is given (settings, arguments, the compilers' variables).

    `Path.expanduser` raises a bare `RuntimeError` for a user this machine
    does not know (`~nosuchuser/x`); this names the path, `where` it was
    given (a setting, an argument, a variable) and the fix. A `path` that is
    no path (`root=123`) is a `TypeError` naming `where` too.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"{where or 'a path'} must be a str or a path, got {type(path).__name__} {path!r}"
        )
    try:
        return Path(path).expanduser()
    except RuntimeError:
        head = os.fspath(path).partition(os.sep)[0]
        raise NoSuchHomeError(
            f"{where}{': ' if where else ''}{os.fspath(path)!r}: {head!r} names no home "
            "directory on this machine (no such user, or no HOME); spell the directory out"
        ) from None


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def kind_of(mode: int) -> str | None:
    """What a non-regular file is ("a FIFO"), or `None` for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def non_regular_kind(path: Path) -> str | None:
    """What `path` is if it is there and not a regular file (symlinks followed), else `None`.

    A symlink whose target is missing counts: opening it to write would
    create a file wherever it points.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        if os.path.islink(path):
            return _to_missing(path)
        return None
    return kind_of(mode)


def missing_link(path: Path) -> str | None:
    """Where `path`, or a directory on the way to it, is a symlink to a missing path:
    that step said as a clause naming both (`/srv/root is a symlink to a missing path
    (/mnt/gone)`); None if no step is. The one wording for a dangling symlink, where
    "does not exist" would send the user to create what the symlink already names.

    Walked from the top: the first step that cannot be followed is the one to fix.
    File-system calls: async code calls it on a worker thread.
    """
    path = Path(os.path.abspath(path))
    for step in (*reversed(path.parents), path):
        try:
            os.stat(step)
        except FileNotFoundError:
            return f"{step} is {_to_missing(step)}" if os.path.islink(step) else None
        except OSError:  # not a directory, not searchable: another reason, said elsewhere
            return None
    return None


def check_output_directory(path: Path) -> None:
    """Refuse, in the one wording every command uses, to write `path` where its directory
    is missing: `FileNotFoundError` ("/srv/out does not exist; create it first", or the
    dangling symlink on the way named with its target), `NotADirectoryError` where a
    step on the way is a file. Nothing is created: a typo in the directory would
    otherwise become a tree of directories nobody asked for.

    File-system calls: async code calls it on a worker thread.
    """
    parent = Path(os.path.abspath(path)).parent
    if parent.is_dir():
        return
    if (dangling := missing_link(parent)) is not None:
        raise FileNotFoundError(f"{dangling}; fix the symlink, or create the directory")
    for step in (*reversed(parent.parents), parent):
        if os.path.lexists(step) and not step.is_dir():
            raise NotADirectoryError(f"{step} is not a directory; {path} cannot be written there")
    raise FileNotFoundError(f"{parent} does not exist; create it first")


def _to_missing(link: Path) -> str:
    try:
        target = os.readlink(link)
    except OSError:  # replaced since it was looked at
        return "a symlink to a missing path"
    return f"a symlink to a missing path ({os.path.normpath(os.path.join(link.parent, target))})"


FOUND_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""How a file found in a directory is opened to be read (`open_found`)."""


def open_found(name: str | os.PathLike[str], *, dir_fd: int | None = None) -> int | str:
    """A read-only descriptor of the regular file `name` (in `dir_fd`), or why not, one line.

    For a file found in a directory that the user, or another process, can
    change between the listing and the open: the last step is never a
    symlink followed, the open never waits (a FIFO), and what was opened is
    a regular file (`fstat`) before a byte of it is read. `OSError` for the
    rest (gone since the listing, not allowed).
    """
    try:
        fd = os.open(name, FOUND_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink, not a regular file"
        if exc.errno == errno.ENXIO:  # a socket cannot be opened at all
            return "a socket, not a regular file"
        raise
    kind = close_unless_regular(fd)
    return fd if kind is None else f"{kind}, not a regular file"


def close_unless_regular(fd: int) -> str | None:
    """None if the open `fd` is a regular file; else `fd` is closed and what it is said."""
    try:
        kind = kind_of(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if kind is not None:
        os.close(fd)
    return kind


@final
@attrs.frozen
class Bounded:
    """What `read_bounded` read: at most its limit of bytes, and why it stopped short."""

    data: bytes
    over: str | None
    """One line naming the file and the limit if it held more than was read, else None."""


def read_bounded(fd: int, limit: int, what: str | os.PathLike[str]) -> Bounded:
    """At most `limit` bytes of the open file `fd`, from where it stands.

    `what` names the file in the one-line `over` message when it holds more
    (its size from one `fstat`, or what it grew to while being read). The
    bytes are read in chunks of at most a mebibyte, so a file that lies about
    its size, or grows, never makes more than `limit` bytes be allocated.
    """
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    left = limit + 1  # one byte more says whether there was more
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    if len(data) <= limit:
        return Bounded(data, None)
    held = f"{size:,} bytes" if size > limit else "more than that"
    return Bounded(
        data[:limit],
        f"{os.fspath(what)} holds {held}, over the {limit:,} bytes warmenv reads of it",
    )


def is_missing(path: Path) -> bool:
    """Whether nothing is at `path` (not even a dangling symlink), as the system says it.

    Not when it cannot tell: below a directory this process may not search,
    `os.path.lexists` and `Path.exists` say "missing" or raise, and a file
    that cannot be looked at is one that cannot be used, never one that is
    not there ("no environment" would send the user the wrong way).
    """
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def make_directories(path: Path, mode: int = 0o755) -> None:
    """`mkdir -p path`, each directory it makes given `mode` (less the umask).

    `Path.mkdir(parents=True)` gives the parents it makes 0777 less the umask
    whatever `mode` says, so under a umask of 002 (user private groups) a new
    root, cache parent or hooks' directory was group-writable, and the next
    command refused it (`open_to_others`). `FileExistsError` where something
    other than a directory (a file, a dangling symlink) is in the way.
    """
    missing = []
    at = path
    while not at.is_dir() and at.parent != at:
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        directory.mkdir(mode=mode, exist_ok=True)


def open_to_others(st: os.stat_result) -> bool:
    """Whether a directory of status `st` lets other users rename what is in it: written
    by its group or by anyone, without the sticky bit (`/tmp` has it, so it is safe)."""
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) and not st.st_mode & stat.S_ISVTX


def why_redirectable(path: Path, *, directories: bool = True) -> str | None:
    """Why another user could redirect a file created or opened at `path`, or None.

    Walks `path` as the system resolves it, following each symlink to where
    it points: a symlink owned by someone other than this user or root, or a
    directory open to others (`open_to_others`), on the way is the reason,
    named. A missing step ends the walk (what is created there is ours)
    unless a `..` after it climbs back out, which the walk follows by name.
    Checked by path, before the open: it closes a planted symlink, not a
    race with another user renaming things while the file is opened.
    `directories=False`: symlinks alone (for a caller with its own rule for
    directories, the caches' `check_ancestors`).
    File-system calls: async code calls it on a worker thread.
    """
    pending = list(Path(os.getcwd(), path).parts)
    at = Path(pending.pop(0))
    hops = 0
    while True:
        try:
            st: os.stat_result | None = os.lstat(at)
        except FileNotFoundError:
            if ".." not in pending:
                return None  # what is created below a missing step is ours
            st = None  # but a `..` climbs back out of it: go on, by name
        except OSError:  # not for us to look at: the open says why
            return None
        if st is None:
            pass
        elif stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (os.geteuid(), 0):
                return (
                    f"{at} is a symlink of another user's (uid {st.st_uid}), "
                    "who could point it anywhere"
                )
            hops += 1
            if hops > _MAX_SYMLINKS:
                return None  # a loop: the open fails and says so
            target = Path(os.readlink(at))
            pending[:0] = target.parts[1:] if target.is_absolute() else target.parts
            at = Path(target.anchor) if target.is_absolute() else at.parent
        elif directories and stat.S_ISDIR(st.st_mode) and open_to_others(st):
            return (
                f"{at} can be written by other users without the sticky bit (mode "
                f"{stat.filemode(st.st_mode)}), who could swap what is in it; run "
                f"`chmod +t {shlex.quote(str(at))}` (the sticky bit /tmp has) or choose "
                "a root elsewhere"
            )
        if not pending:
            return None
        part = pending.pop(0)
        at = at.parent if part == ".." else at / part
