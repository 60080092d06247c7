"""What kind of file a path names, for refusing anything but regular files.

Opening a FIFO blocks until a writer appears and reading a device never
ends, so every file warmenv opens by path (environment databases, bundles,
export sources and targets) is checked to be a regular file first.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from warmenv._errors import WarmenvError

__all__ = ["NoSuchHomeError", "expand_home", "is_missing", "kind_of", "non_regular_kind"]


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
            return "a symlink to a missing file"
        return None
    return kind_of(mode)


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
