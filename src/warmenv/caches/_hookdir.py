"""Where `warmenv run` keeps the hooks it gives its command: a directory no other user can touch.

The command, and whatever it leaves running after `warmenv run` ends (a
process started with `&`, nohup or setsid), imports from the directories
`warmenv run` puts first on its `PYTHONPATH` for as long as it lives, as
the user `warmenv run` ran as. So such a directory is never deleted under
it and is never one another user could create, replace or write (a
predictable name in `/tmp` would be theirs to recreate once removed): it
lies under this user's warmenv directory (`warmenv.config.user_root()`),
whose ancestors are checked as a restore checks its target
(`_paths.check_ancestors`), in a directory per warmenv version (a
`HookHome`), named by a digest of its contents, so that every run of the
same hooks reuses it. It is written under a temporary name and renamed into
place whole; one found there with other contents, other files, or open to
other users is replaced.

A version's directory is in use while any process holds its lock file
(`.lock`, `flock` shared): every `warmenv run` of that version takes it
before it writes or uses a hook, and hands the descriptor to its command,
so the command and what it starts keeping its descriptors (a shell's `&`,
nohup) hold it too, however long they live. The directories of other
versions are removed by the next `warmenv run`, only when nobody holds
their lock (taken exclusive while they are renamed away, so no run can
start using one meanwhile) and no run has taken it for `STALE_AFTER`
seconds (a process that closed its descriptors may still import from it);
only a directory of this user's, that no one else can write, reached
without following a symlink, with a lock file (one a warmenv from before
the locks made is left alone: nothing tells whether it is in use).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final, final

import attrs

from warmenv._fs import make_directories, open_found, read_bounded
from warmenv._version import __version__
from warmenv.caches._paths import TEMPORARY_PREFIX, UnsafeTargetError, check_ancestors
from warmenv.caches._paths import check_directory as check_private
from warmenv.config import user_root

__all__ = ["MAX_HOOK_BYTES", "STALE_AFTER", "HookHome"]

_HOME: Final = ".run-hooks"
_LOCK: Final = ".lock"
_CACHED: Final = "__pycache__"  # the bytecode Python writes beside an imported module
_OPEN: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_ATTEMPTS: Final = 3
_ELSEWHERE: Final = "point XDG_CACHE_HOME at a directory of your own"
_VERSION: Final = re.compile(r"[0-9][0-9A-Za-z.+!_-]*")  # a name a version directory may have
MAX_HOOK_BYTES = 1 << 16
"""The most of a file in a hooks directory `_holds` reads: warmenv's are a few kilobytes,
and one larger is not one of them (the directory is made again)."""
STALE_AFTER: Final = 7 * 24 * 3600.0
"""Seconds since a run last took another version's lock before its directory may go."""


@final
@attrs.define
class HookHome:
    """This user's directory of `warmenv run`'s hooks for one warmenv `version`, held while open.

    Opened (its lock taken, other versions' stale directories removed) by
    the first `directory()`; `held` is the descriptors to hand to the
    command; `close()` lets go. `UnsafeTargetError` (the fix in the
    message) or an `OSError` when the hooks cannot be kept here.
    """

    version: str = __version__
    _lock: int | None = attrs.field(init=False, default=None)

    @property
    def path(self) -> Path:
        return user_root() / _HOME / self.version

    @property
    def held(self) -> tuple[int, ...]:
        """The descriptor holding the lock, for the command to inherit (none before `directory`)."""
        return () if self._lock is None else (self._lock,)

    def directory(self, files: Mapping[str, str]) -> Path:
        """A directory of this user's holding exactly `files` (relative path: text), made once."""
        digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:24]
        home = self.path
        final = home / digest
        check_ancestors(final, elsewhere=_ELSEWHERE)
        if self._lock is None:
            self._lock = _lease(home)
            with contextlib.suppress(OSError):  # tidying never stops a run
                _remove_stale(home.parent, keep=self.version)
        for _ in range(_ATTEMPTS):
            if _holds(final, files):
                return final
            _install(home, final, files)
        if _holds(final, files):
            return final
        raise UnsafeTargetError(f"'{final}' keeps changing under warmenv run; remove it and rerun")

    def close(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            os.close(lock)

    def __enter__(self) -> HookHome:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _lease(home: Path) -> int:
    """A descriptor of `home`'s lock file, locked shared, `home` made if need be; its time
    set to now (when a run last used this version).

    A cleaner may rename `home` away between our open and our lock: then
    the path no longer leads to the file we locked, and we start again.
    """
    for _ in range(_ATTEMPTS):
        make_directories(home)  # 0755: a umask of 002 would make it unusable
        directory = os.open(home, _OPEN | os.O_DIRECTORY)
        try:
            check_private(directory, home)
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            lock = os.open(_LOCK, flags, 0o600, dir_fd=directory)
            try:
                check_private(lock, home / _LOCK)
                if not stat.S_ISREG(os.fstat(lock).st_mode):
                    raise UnsafeTargetError(f"'{home / _LOCK}' is not a file; remove it and rerun")
                with contextlib.suppress(OSError):  # no flock here: no cleaner can take it either
                    fcntl.flock(lock, fcntl.LOCK_SH)  # waits only while a cleaner renames it
                if _same(os.stat(home, follow_symlinks=False), os.fstat(directory)) and _same(
                    os.stat(_LOCK, dir_fd=directory, follow_symlinks=False), os.fstat(lock)
                ):
                    os.utime(lock)
                    return lock
            except BaseException:
                os.close(lock)
                raise
            os.close(lock)
        finally:
            os.close(directory)
    raise UnsafeTargetError(f"'{home}' keeps changing under warmenv run; remove it and rerun")


def _remove_stale(hooks: Path, *, keep: str) -> None:
    """Remove the directories of versions other than `keep` that no run uses (module docstring)."""
    parent = os.open(hooks, _OPEN | os.O_DIRECTORY)
    try:
        for name in os.listdir(parent):
            with contextlib.suppress(OSError, UnsafeTargetError):  # not ours, or gone
                if name.startswith(TEMPORARY_PREFIX):  # one a cleaner renamed away
                    _remove_renamed(parent, name)
                elif name != keep and _VERSION.fullmatch(name):
                    _remove_if_stale(parent, name)
    finally:
        os.close(parent)


def _remove_if_stale(parent: int, name: str) -> None:
    directory = os.open(name, _OPEN | os.O_DIRECTORY, dir_fd=parent)  # a symlink: ELOOP
    try:
        _check_ours(directory, name)
        try:
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            lock = os.open(_LOCK, flags, dir_fd=directory)
        except FileNotFoundError:
            return  # made before the locks: nothing tells whether a process uses it
        try:
            _check_ours(lock, _LOCK)
            if not stat.S_ISREG(os.fstat(lock).st_mode):
                return  # no lock a run makes: not ours to judge
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return  # held by a run or what it started (or no flock here): in use
            used = os.fstat(lock).st_mtime  # read under the lock: no run can touch it now
            if time.time() - used < STALE_AFTER:
                return
            if not _same(os.stat(name, dir_fd=parent, follow_symlinks=False), os.fstat(directory)):
                return  # renamed by another cleaner meanwhile
            # Renamed while the lock is ours: a run that then opens the name makes a new one.
            renamed = f"{TEMPORARY_PREFIX}{secrets.token_hex(8)}.old.tmp"
            os.rename(name, renamed, src_dir_fd=parent, dst_dir_fd=parent)
            shutil.rmtree(renamed, dir_fd=parent, ignore_errors=True)
        finally:
            os.close(lock)
    finally:
        os.close(directory)


def _remove_renamed(parent: int, name: str) -> None:
    """Finish removing a directory a cleaner renamed away (it may have been stopped)."""
    directory = os.open(name, _OPEN | os.O_DIRECTORY, dir_fd=parent)
    try:
        _check_ours(directory, name)
    finally:
        os.close(directory)
    shutil.rmtree(name, dir_fd=parent, ignore_errors=True)


def _check_ours(fd: int, name: str) -> None:
    """Refuse what this user did not make or others can write: never ours to remove."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeTargetError(f"'{name}' is not this user's alone")


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _install(home: Path, final: Path, files: Mapping[str, str]) -> None:
    staging = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, suffix=".tmp", dir=home))
    try:
        for relative, text in files.items():
            path = staging / relative
            make_directories(path.parent)
            path.write_text(text, encoding="utf-8")
            path.chmod(0o644)
        staging.chmod(0o755)
        try:
            os.rename(staging, final)
        except OSError:  # one is there: keep it if it is right (another run's), else replace it
            if _holds(final, files):
                return
            old = home / f"{TEMPORARY_PREFIX}{secrets.token_hex(8)}.old.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.rename(final, old)
                shutil.rmtree(old, ignore_errors=True)
            with contextlib.suppress(OSError):  # lost to another run: checked again
                os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _holds(directory: Path, files: Mapping[str, str]) -> bool:
    """Whether `directory` is exactly `files`, every part of it this user's and closed to others."""
    found: dict[str, str] = {}
    try:
        for where, subdirectories, names in os.walk(directory, onerror=_raise):
            subdirectories[:] = [d for d in subdirectories if d != _CACHED]
            if any(os.path.islink(os.path.join(where, d)) for d in subdirectories):
                return False  # os.walk would not look into it
            _read(Path(where), None)
            for name in names:
                path = Path(where) / name
                found[path.relative_to(directory).as_posix()] = _read(path, "")
    except (OSError, UnicodeDecodeError, UnsafeTargetError):
        return False
    return found == dict(files)


def _read(path: Path, text: str | None) -> str:
    """The text of the file at `path` (a directory: `text` is None), if it is private."""
    if text is None:
        fd = os.open(path, _OPEN | os.O_DIRECTORY)
    elif isinstance(found := open_found(path), str):
        raise UnsafeTargetError(f"'{path}' is {found}")
    else:
        fd = found
    try:
        check_private(fd, path)
        if text is None:
            return ""
        read = read_bounded(fd, MAX_HOOK_BYTES, path)
        if read.over is not None:
            raise UnsafeTargetError(read.over)
        return read.data.decode("utf-8")
    finally:
        os.close(fd)


def _raise(error: OSError) -> None:
    raise error
