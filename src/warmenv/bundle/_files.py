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
an import copies into a private directory. Whoever makes either claims it
by a lock (`flock`: on the staging file itself, on a file inside the
directory), held while it lives, and whoever cleans up removes only what
nobody holds (`_in_use`, the one rule for both): processes in other PID
namespaces (containers sharing a volume) see other process ids, so the id
in a name proves nothing there, while a lock is the kernel's and is
released however its holder ends. The id is read only where no lock can
be: a file system without `flock`, a directory a warmenv from before the
locks made.
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

from warmenv._fs import close_unless_regular, non_regular_kind, open_found
from warmenv.bundle.errors import BundleNotFoundError, NotABundleError

__all__ = [
    "HEAD_SIZE",
    "copy_to_private",
    "create_private",
    "fsync_dir",
    "new_staging",
    "open_regular",
    "private_directory",
    "pwrite_all",
    "read_head",
    "release",
    "remove_private",
    "remove_stale",
    "remove_stale_directories",
    "staging_path",
]

# Enough bytes to tell the formats apart, to read a SQLite file's header (100 bytes, its
# size) and to name the files most often mistaken for a bundle (`_kinds`: a tar's at 257).
HEAD_SIZE = 512
STAGING_SUFFIX = ".warmenv-staging"
SNAPSHOT_PREFIX = ".warmenv-import."
LOCK_NAME = ".lock"  # inside a private directory: held by its owner while it lives

_held: dict[Path, int] = {}  # our private directories -> the descriptor holding each lock
_held_guard = threading.Lock()


def open_regular(path: Path) -> int:
    """A read-only descriptor of `path` if it is a regular file (symlinks followed).

    Opened non-blocking, so a FIFO cannot hang the open; anything but a
    regular file raises `NotABundleError` at once; no file, `BundleNotFoundError`.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    # Checked before opening too: a socket cannot be opened at all (ENXIO).
    kind = non_regular_kind(path)
    if kind is not None:
        raise NotABundleError(f"{path} is {kind}, not a bundle file")
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise BundleNotFoundError(f"{path}: no such file; check the bundle's path") from None
    kind = close_unless_regular(fd)
    if kind is not None:
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
        named = found.name[len(SNAPSHOT_PREFIX) :]
        try:
            fd = open_found(found / LOCK_NAME)
        except FileNotFoundError:
            if not _named_process_alive(named):  # made before the locks: its id is all
                shutil.rmtree(found, ignore_errors=True)
            continue
        except OSError:
            continue  # unreadable: not ours to judge
        if isinstance(fd, str):
            continue  # no lock warmenv makes (a FIFO, a symlink): not ours to judge
        try:
            if not _in_use(fd, named):
                shutil.rmtree(found, ignore_errors=True)
        finally:
            os.close(fd)


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


def new_staging(out: Path) -> tuple[Path, int]:
    """A new, empty staging file beside `out`, and the descriptor holding its lock:
    close it (`release`) once the file is renamed into place or removed.

    A cleaner that found the file in the moment before its lock was taken
    may have removed it; then the name no longer names our file, and a new
    one is made.
    """
    while True:
        path = staging_path(out)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            # Said of `out`, the file the caller named: the staging name is ours.
            raise _for_target(exc, out) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # a cleaner holds it, to remove it: another name
            except OSError:
                return path, fd  # no flock here: others go by the process id
            else:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return path, fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        os.close(fd)  # removed by a cleaner before we held it: another name


def _for_target(exc: OSError, out: Path) -> OSError:
    """`exc` (creating a staging file beside `out`) as the same error about `out`."""
    why = exc.strerror or str(exc)
    if isinstance(exc, PermissionError | FileNotFoundError | NotADirectoryError):
        why = f"{why}: cannot create a file in {out.parent}"
    return type(exc)(exc.errno, why, str(out))


def release(fd: int) -> None:
    """Let go of a staging file's lock (`new_staging`)."""
    with contextlib.suppress(OSError):
        os.close(fd)


def remove_stale(directory: Path, *, prefix: str, suffix: str) -> None:
    """Remove the staging files `prefix<pid>.*suffix` nobody holds (`_in_use`)."""
    for found in directory.glob(f"{prefix}*{suffix}"):
        if found.is_symlink() or not found.is_file():
            continue  # not a staging file warmenv makes: not ours to judge
        try:
            fd = open_found(found)
        except OSError:
            continue  # gone, or unreadable: not ours to judge
        if isinstance(fd, str):
            continue  # no staging file warmenv makes, since the listing: not ours to judge
        try:
            if not _in_use(fd, found.name[len(prefix) :]):
                with contextlib.suppress(FileNotFoundError):
                    found.unlink()  # while we hold its lock: nobody claims it meanwhile
        finally:
            os.close(fd)


def _in_use(fd: int, named: str) -> bool:
    """Whether the staging whose lock `fd` opens is in use: the one rule for every
    staging warmenv leaves (export files, import directories).

    Its lock held by another: in use, whatever its name says. Free: stale,
    and the lock is ours until `fd` is closed, so remove it before that. No
    `flock` on this file system: the process id `named` starts with, the
    only evidence left.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return _named_process_alive(named)
    return False


def _named_process_alive(named: str) -> bool:
    """Whether the process whose id `named` starts with (`<pid>.<token>...`) is alive here."""
    pid_text = named.split(".", 1)[0]
    return pid_text.isdigit() and _alive(int(pid_text))


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


def create_private(path: Path) -> int:
    """A new file at `path` (never one already there), for its owner only."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """All of `data` written at `offset` (`os.pwrite` may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
