"""The files around bundles: opening only regular files, private snapshots, staging.

A path names whatever is there when it is opened, so a bundle file is opened
once, checked through its descriptor (a FIFO, a device, a socket or a
directory is refused before anything reads or blocks on it), and everything
after that reads the descriptor, never the path again. An import copies the
descriptor's content into a private snapshot in a directory only this
process's user may enter, and verifies and imports that copy: what was
verified is what is imported, whatever happens to the path or to the file
in place meanwhile (a rename over it, a rewrite, a truncation), and no
mapping of a file someone else can truncate is ever read.

Export writes a staging file beside its target and renames it into place;
the names of staging files carry the writer's process id, so the next run
can remove those whose process is gone. A private directory is claimed by a
lock instead (`flock` on a file inside it, held while the directory lives):
processes in other PID namespaces (containers sharing a volume) see other
process ids, so a name's id proves nothing there, while a lock is the
kernel's and is released however its holder ends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import tempfile
import threading
from pathlib import Path

from warmenv._fs import kind_of, non_regular_kind
from warmenv.bundle.errors import NotABundleError

__all__ = [
    "HEAD_SIZE",
    "copy_to_private",
    "fsync_dir",
    "open_regular",
    "private_directory",
    "read_head",
    "remove_private",
    "remove_stale",
    "remove_stale_directories",
    "staging_path",
]

HEAD_SIZE = 16  # enough bytes to tell the formats apart
STAGING_SUFFIX = ".warmenv-staging"
SNAPSHOT_PREFIX = ".warmenv-import."
LOCK_NAME = ".lock"  # inside a private directory: held by its owner while it lives

_held: dict[Path, int] = {}  # our private directories -> the descriptor holding each lock
_held_guard = threading.Lock()


def open_regular(path: Path) -> int:
    """A read-only descriptor of `path` if it is a regular file (symlinks followed).

    Opened non-blocking, so a FIFO cannot hang the open; anything but a
    regular file raises `NotABundleError` at once.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    # Checked before opening too: a socket cannot be opened at all (ENXIO).
    kind = non_regular_kind(path)
    if kind is not None:
        raise NotABundleError(f"{path} is {kind}, not a bundle file")
    fd = os.open(path, flags)
    try:
        kind = kind_of(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if kind is not None:
        os.close(fd)
        raise NotABundleError(f"{path} is {kind}, not a bundle file")
    return fd


def read_head(fd: int) -> bytes:
    """The first bytes of the file, enough to tell the formats apart."""
    return os.pread(fd, HEAD_SIZE, 0)


def copy_to_private(fd: int, near: Path | None, name: str) -> Path:
    """Copy the open file into a fresh private directory; the copy's path.

    The directory (mode 0700, named for this process) goes beside `near` when
    that is a writable directory, so the copy stays on the same file system
    as the environment it feeds; else, or when that file system has no room
    for the copy, in the system's temporary directory. The caller removes it
    with `remove_private`.
    """
    places = [near, None] if near is not None else [None]
    for place in places:
        target = private_directory(place) / name
        try:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                _copy(fd, out)
            finally:
                os.close(out)
        except OSError as exc:
            remove_private(target)
            if place is None or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            continue  # no room beside the environment: try the temporary directory
        except BaseException:
            remove_private(target)
            raise
        return target
    raise AssertionError("unreachable: the last place raises or returns")


def private_directory(near: Path | None) -> Path:
    """A fresh private directory (0700) beside `near` (else in the temporary directory).

    It is claimed by a lock held until `remove_private`; the stale ones left
    there by processes that are gone are removed first.
    """
    prefix = f"{SNAPSHOT_PREFIX}{os.getpid()}."
    if near is not None:
        with contextlib.suppress(OSError):
            remove_stale_directories(near)
            return _claimed(Path(tempfile.mkdtemp(prefix=prefix, dir=near)))
    with contextlib.suppress(OSError):
        remove_stale_directories(Path(tempfile.gettempdir()))
    return _claimed(Path(tempfile.mkdtemp(prefix=prefix)))


def _claimed(directory: Path) -> Path:
    """`directory` with its lock taken.

    The lock file is made and locked under another name, then renamed into
    place, so whoever finds `LOCK_NAME` finds it held: never a moment in
    which another process could take it and remove the directory. One that
    removes the directory before the rename (it has no lock file yet) makes
    the rename fail, and the caller goes elsewhere.
    """
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        fd = os.open(directory / f"{LOCK_NAME}.new", flags, 0o600)
        try:
            with contextlib.suppress(OSError):  # no flock here: others go by process id
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(directory / f"{LOCK_NAME}.new", directory / LOCK_NAME)
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    with _held_guard:
        _held[directory] = fd
    return directory


def remove_stale_directories(directory: Path) -> None:
    """Remove the private directories in `directory` that nobody holds.

    A directory whose lock another process (or another import of ours)
    holds is in use, whatever its name says. One without a lock file (made
    by a warmenv from before the locks, or a moment old) is judged by the
    process id in its name, as before.
    """
    for found in directory.glob(f"{SNAPSHOT_PREFIX}*"):
        if found.is_symlink() or not found.is_dir():
            continue
        try:
            fd = os.open(found / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if not _unlocked_is_stale(found):
                continue
            shutil.rmtree(found, ignore_errors=True)
            continue
        except OSError:
            continue  # unreadable: not ours to judge
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # held: in use right now
            except OSError:
                if not _unlocked_is_stale(found):
                    continue  # no flock here: the process id is all there is
            shutil.rmtree(found, ignore_errors=True)
        finally:
            os.close(fd)


def _unlocked_is_stale(found: Path) -> bool:
    """A directory without a held lock: stale unless the process its name gives is alive."""
    pid_text = found.name[len(SNAPSHOT_PREFIX) :].split(".", 1)[0]
    return not (pid_text.isdigit() and _alive(int(pid_text)))


def _copy(source: int, out: int) -> None:
    offset = 0
    copy_range = getattr(os, "copy_file_range", None)
    while copy_range is not None:
        try:
            copied = copy_range(source, out, 1 << 30, offset, offset)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                break  # not between these files: copy through user space instead
            raise
        if copied == 0:
            return
        offset += copied
    while chunk := os.pread(source, 1 << 20, offset):
        view = memoryview(chunk)
        while view:
            written = os.pwrite(out, view, offset)
            view = view[written:]
            offset += written


def remove_private(path: Path) -> None:
    """Remove a private copy and its directory (whatever remains of them), and its lock."""
    directory = path.parent
    shutil.rmtree(directory, ignore_errors=True)
    with _held_guard:
        fd = _held.pop(directory, None)
    if fd is not None:
        os.close(fd)


def staging_path(out: Path) -> Path:
    """A fresh staging name beside `out`, naming this process."""
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    return out.with_name(f".{out.name}.{token}{STAGING_SUFFIX}")


def remove_stale(directory: Path, *, prefix: str, suffix: str) -> None:
    """Remove the staging files `prefix<pid>.*suffix` whose process is gone."""
    for found in directory.glob(f"{prefix}*{suffix}"):
        pid_text = found.name[len(prefix) :].split(".", 1)[0]
        if pid_text.isdigit() and _alive(int(pid_text)):
            continue  # its writer is running right now
        if found.is_dir() and not found.is_symlink():
            shutil.rmtree(found, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                found.unlink()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (best effort: not every system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
