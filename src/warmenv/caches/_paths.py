"""Writing a bundle's files into a cache directory without trusting the bundle.

A restored file is code: a compiler will load, execute or unpickle it. So a
key from a bundle is a relative path only after it passed `relative_parts`
(no `..`, no absolute path, no backslash, drive letter, device name,
control character or reserved temporary name), and `Writer` places files
under the target only through directory descriptors opened with
`O_NOFOLLOW`, so a symlink already in the target is never followed: it is
left alone and the entry refused, with the reason.

Each file is written under a temporary name in its final directory and
renamed into place once complete: a process killed mid-restore leaves at
most a `.warmenv-*.tmp` file, which no compiler reads, never a half file
under a name a compiler looks up (the next restore removes such leftovers
once they are old). The rename after the write is what a killed process
needs; nothing is `fsync`ed, so a power loss is not covered (docs/caches.md
says so). Whether a name is taken is read from its directory's listing, made
once per directory (none for a directory this restore made), not asked per
file. Files get mode 0644 and directories 0755 at most
(the umask may remove more); a target directory, or a directory in it,
that another user owns or can write is refused, because whoever can write
there can swap what the compiler loads.

A capture reads by the same rule (`swappable`, `open_tree`, `read_files`): a
file it stores is restored as this machine's own, trusted even under
`require_signature`, so it never follows a symlink inside the cache and never
reads a file or directory another user owns or can write.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import time
import unicodedata
from pathlib import Path
from typing import Final

from warmenv._errors import WarmenvError
from warmenv._fs import (
    make_directories,
    missing_link,
    open_found,
    open_to_others,
    read_bounded,
    why_redirectable,
)

__all__ = [
    "DIRECTORY_FLAGS",
    "MAX_FILE_BYTES",
    "TEMPORARY_PREFIX",
    "UnsafeTargetError",
    "Writer",
    "open_owned",
    "open_tree",
    "read_files",
    "relative_parts",
    "swappable",
]

TEMPORARY_PREFIX: Final = ".warmenv-"
MAX_FILE_BYTES: Final = 512 * 1024 * 1024
"""The largest file a capture stores: larger at the listing is left out, and one that grew
past it since is read no further than this."""
_TEMPORARY_SUFFIX: Final = ".tmp"
_STALE_SECONDS: Final = 600.0
_MAX_PARTS: Final = 32
_MAX_PATH: Final = 1024
_MAX_PART: Final = 255
_DEVICES: Final = re.compile(r"(CON|PRN|AUX|NUL|COM[0-9¹²³]|LPT[0-9¹²³]|CONIN\$|CONOUT\$)\Z", re.I)
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_MODE: Final = 0o644
_DIRECTORY_MODE: Final = 0o755


class UnsafeTargetError(WarmenvError):
    """A restore target another user could write into (they could swap what a compiler loads)."""


# A key whose every name is plain (letters, digits, `_`, `+`, `-` and inner dots, not
# starting or ending with a dot, 1-255 bytes, no device name up to its first dot: the
# only ones a plain name can spell are `_DEVICES` without a `$` or a superscript) passes
# every rule of `relative_parts`: one match instead of a dozen checks per name. The
# name's characters are taken possessively (`{0,254}+`: none is `/`, so giving one
# back never helps) and its last checked by looking behind, so a name costs no
# backtracking (one match of a Triton key: 0.8 us, against 2.2 us for this as a match
# with backtracking and a search for the device names).
_PLAIN_NAME: Final = (
    r"(?!(?i:CON|PRN|AUX|NUL|COM[0-9]|LPT[0-9])(?:[./]|\Z))"
    r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,254}+(?<!\.)"
)
_PLAIN: Final = re.compile(rf"(?:{_PLAIN_NAME}/){{0,{_MAX_PARTS - 1}}}{_PLAIN_NAME}\Z")
_DRIVE: Final = re.compile(r"[A-Za-z]:")


def relative_parts(key: bytes) -> tuple[str, ...] | str:
    """The path components a bundle key names, or the reason it is refused."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return "its path is not UTF-8"
    if len(key) <= _MAX_PATH and _PLAIN.match(text):
        return tuple(text.split("/"))
    return checked_parts(key, text)


def checked_parts(key: bytes, text: str) -> tuple[str, ...] | str:
    """`relative_parts` the long way, rule by rule (`text` is `key` decoded)."""
    if not text:
        return "its path is empty"
    if len(key) > _MAX_PATH:
        return f"its path is longer than {_MAX_PATH} bytes"
    if text.startswith("/") or _DRIVE.match(text):
        return "its path is absolute"
    if "\\" in text:
        return "its path holds a backslash"
    if _CONTROL.search(text):
        return "its path holds a control character"
    parts = tuple(text.split("/"))
    if len(parts) > _MAX_PARTS:
        return f"its path is more than {_MAX_PARTS} directories deep"
    for part in parts:
        if part in ("", ".", ".."):
            return (
                f"its path holds {part or 'an empty'!r} component"
                if part
                else ("its path holds an empty component")
            )
        if len(part.encode()) > _MAX_PART:
            return f"a name in its path is longer than {_MAX_PART} bytes"
        if ":" in part:
            return "a name in its path holds ':' (a drive or stream name elsewhere)"
        if part.endswith((".", " ")):
            return "a name in its path ends with '.' or ' ' (renamed silently elsewhere)"
        if _DEVICES.match(part.split(".", 1)[0].rstrip(" ")):
            return f"{part!r} in its path is a device name"
        if part.startswith(TEMPORARY_PREFIX):
            return f"{part!r} in its path is a name warmenv reserves for files being written"
    return parts


def folded(parts: tuple[str, ...]) -> tuple[str, ...]:
    """The path as a case-insensitive, normalising file system sees it."""
    return tuple(_fold(part) for part in parts)


def _fold(part: str) -> str:
    # ASCII is its own NFC form, and its case folding is `lower`: the same, cheaper.
    return part.lower() if part.isascii() else unicodedata.normalize("NFC", part).casefold()


def swappable(st: os.stat_result) -> str | None:
    """Why another user could swap what lies at a path of status `st` (it is theirs, or
    they can write it), as a clause, or None: the one rule for the directories a restore
    writes into and for what a capture reads (a file captured is restored as this
    machine's own, trusted even under `require_signature`)."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by other users (mode {stat.filemode(st.st_mode)})"
    return None


def open_owned(name: str, *, dir_fd: int) -> int | str:
    """A read-only descriptor of the regular file `name` in `dir_fd`, or why not, one line:
    `open_found`'s rules (no symlink, no waiting, a regular file), then `swappable`'s on
    what was opened. Every reader of a file in a cache opens it here; `OSError` for the
    rest (gone since the listing)."""
    fd = open_found(name, dir_fd=dir_fd)
    if isinstance(fd, str):
        return fd
    try:
        why = swappable(os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    if why is not None:
        os.close(fd)
        return f"a file that {why}"
    return fd


def check_directory(fd: int, where: Path, part: str = "") -> None:
    """Refuse a directory that someone other than this user (or root) owns or can write.

    `where` (and `part` under it, joined only for the message: a `Path` joined for
    each directory a restore makes was 13,000 instructions each) names it.
    """
    st = os.fstat(fd)
    why = swappable(st)
    if why is None:
        return
    if part:
        where = where / part
    advice = (
        "restore into a directory of your own"
        if st.st_uid not in (os.geteuid(), 0)
        else f"run `chmod go-w '{where}'` or restore elsewhere"
    )
    raise UnsafeTargetError(
        f"'{where}' {why}, who could swap the files a compiler loads from it; {advice}"
    )


def open_tree(root: Path, part: str) -> int | None:
    """A descriptor of the tree's directory: `root` as the caller named it, then `part`
    inside it without following a symlink (`OSError` ELOOP or ENOTDIR if it is one);
    None if there is no such directory."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not part:
        return fd
    try:
        return os.open(part, DIRECTORY_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def read_files(
    tree_at: tuple[Path, str], batch: list[tuple[str, int]]
) -> list[tuple[str, bytes | str]]:
    """The bytes of each file, or why not, one line: it is gone, or no longer passes the
    listing's rules (a symlink on its path, not a regular file, or another user's)."""
    try:
        top = open_tree(*tree_at)
    except OSError:
        top = None
    if top is None:
        return [(relative, GONE) for relative, _ in batch]
    try:
        return [(relative, _read_one(top, relative)) for relative, _ in batch]
    finally:
        os.close(top)


GONE: Final = "it went away while being captured"


def _read_one(top: int, relative: str) -> bytes | str:
    *directories, name = relative.split("/")
    opened: list[int] = []
    try:
        at = top
        for directory in directories:
            at = os.open(directory, DIRECTORY_FLAGS, dir_fd=at)
            opened.append(at)
            if (why := swappable(os.fstat(at))) is not None:
                return f"a directory on its path {why}"
        # What lies at the name now counts, not what the listing saw: a FIFO put in
        # place since is refused, never waited on.
        fd = open_owned(name, dir_fd=at)
        if isinstance(fd, str):
            return fd
        opened.append(fd)
        read = read_bounded(fd, MAX_FILE_BYTES, relative)
        if read.over is not None:
            return f"larger than {MAX_FILE_BYTES:,} bytes (it grew since the listing)"
        return read.data
    except OSError:
        return GONE  # removed (or a directory replaced) since the listing
    finally:
        for fd in opened:
            os.close(fd)


def check_ancestors(
    target: Path, *, elsewhere: str = "restore into a directory of your own"
) -> None:
    """Refuse a target under a directory another user could rename it out of, or swap.

    Whoever can write a directory above the target can move the target away
    and put a directory of their own at its path after the restore, so the
    compiler loads their files. A directory with the sticky bit (`/tmp`) is
    safe: others cannot rename what they do not own there. Both the path as
    given and the one its symlinks lead to are checked. `elsewhere`: the fix
    the message offers besides `chmod`.
    """
    given = Path(os.path.abspath(target))
    for directory in dict.fromkeys([*given.parents, *Path(os.path.realpath(target)).parents]):
        try:
            st = os.stat(directory)
        except FileNotFoundError:
            continue
        if st.st_uid not in (os.geteuid(), 0):
            raise UnsafeTargetError(
                f"'{target}' lies under '{directory}', which belongs to another user (uid "
                f"{st.st_uid}), who could swap the files a compiler loads from it; {elsewhere}"
            )
        if open_to_others(st):
            raise UnsafeTargetError(
                f"'{target}' lies under '{directory}', which other users can write (mode "
                f"{stat.filemode(st.st_mode)}): they could swap the files a compiler loads "
                f"from it; run `chmod go-w '{directory}'` or {elsewhere}"
            )
    # A symlink on the way that another user owns: they could point it at a directory
    # of theirs after the restore, and the compiler would load their files.
    # As given, not `abspath`'s: a `..` after a symlink climbs from where it points.
    redirect = why_redirectable(Path(os.getcwd(), target), directories=False)
    if redirect is not None:
        raise UnsafeTargetError(f"'{target}' is refused: {redirect}; {elsewhere}")


def make_target(target: Path) -> None:
    """Make the directory `target` (and its parents) if missing; `UnsafeTargetError`
    naming the link where it, or a directory on the way, is a symlink to a missing
    path (`mkdir` says only "File exists" of the link, which sends the user looking
    for a file).

    Each missing parent is made 0755 at most too (`make_directories`): under a
    umask of 002 `mkdir -p` made the parents group-writable, and the next restore
    refused the target beneath them (`check_ancestors`).
    """
    try:
        make_directories(target, _DIRECTORY_MODE)
    except FileExistsError:
        if (dangling := missing_link(target)) is None:
            raise
        raise UnsafeTargetError(
            f"cannot restore into '{target}': {dangling}; create what it points to, or "
            "point it elsewhere"
        ) from None


class Writer:
    """Places files under one target directory, refusing what would leave it.

    Not thread-safe: one restore drives it, from one worker thread at a time.
    `close()` releases the directory descriptors it holds.

    Each directory is opened once (by descriptor, relative to its parent's,
    never following a symlink) and, unless this restore made it, listed once:
    a file is looked up in that listing, not asked of the file system, and
    written as a temporary name renamed into place (4 system calls). A name
    that appears after the listing (another process of this user writing the
    same cache) may be replaced, whole, by the restored file.
    """

    def __init__(self, target: Path) -> None:
        self.target = target
        check_ancestors(target)
        make_target(target)
        fd = os.open(target, DIRECTORY_FLAGS & ~os.O_NOFOLLOW)  # the caller named it
        try:
            check_directory(fd, target)
        except BaseException:
            os.close(fd)
            raise
        self._fds: dict[tuple[str, ...], int] = {(): fd}
        self._names: dict[int, set[str]] = {fd: _listed(fd)}
        self._refused: dict[tuple[str, ...], str] = {}
        self._seen: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._claimed: dict[tuple[str, ...], tuple[str, ...]] = {}
        """Each path claimed, with its folded form."""
        self._placed: set[tuple[str, ...]] = set()
        self._token = secrets.token_hex(8)
        self._written = 0

    @property
    def is_open(self) -> bool:
        return bool(self._fds)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._names.clear()

    def claim(self, parts: tuple[str, ...]) -> str | None:
        """Reserve a path for this restore; the reason if it is a case-folding twin of another.

        Only the names below the deepest directory already claimed (by an earlier
        file, spelled the same) are folded and looked up: for most files, their own.
        """
        known = len(parts)
        while known and parts[:known] not in self._claimed:
            known -= 1
        folds = self._claimed[parts[:known]] if known else ()
        for depth in range(known + 1, len(parts) + 1):
            prefix = parts[:depth]
            folds = (*folds, _fold(parts[depth - 1]))
            spelled = self._seen.setdefault(folds, prefix)
            if spelled != prefix:
                return (
                    f"it differs only in case or Unicode form from {'/'.join(spelled)!r} "
                    "(one file on a case-insensitive file system)"
                )
            self._claimed[prefix] = folds
        return None

    def write(self, parts: tuple[str, ...], data: bytes) -> bool | str:
        """Write one file at `parts` whole: True if written, False if kept, else why not.

        A file already at that path is left alone (what this machine has
        wins), as is anything that is not a regular file.
        """
        directory = self._fds.get(parts[:-1])
        if directory is None:  # the directory's first file
            opened = self._directory(parts[:-1])
            if isinstance(opened, str):
                return opened
            directory = opened
        name = parts[-1]
        names = self._names[directory]
        if name in names:
            return self._already(directory, parts)
        self._written += 1  # with the token, unique: O_EXCL refuses a clash all the same
        temporary = f"{TEMPORARY_PREFIX}{self._token}-{self._written}{_TEMPORARY_SUFFIX}"
        fd = os.open(temporary, _FILE_FLAGS, _FILE_MODE, dir_fd=directory)
        try:
            written = os.write(fd, data)  # whole, but for a signal or a full disk
            if written < len(data):
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            os.unlink(temporary, dir_fd=directory)
            raise
        os.close(fd)
        try:
            os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException as error:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            if isinstance(error, IsADirectoryError):  # one put at the name since the listing
                return self._already(directory, parts)
            raise
        names.add(name)
        self._placed.add(parts)
        return True

    def placed(self, parts: tuple[str, ...]) -> bool:
        """Whether this restore wrote the regular file at `parts` (renamed it into place).

        What is there was written by this restore, in a directory no other user
        can write, so asking the file system (`mode_at`) would tell nothing more.
        """
        return parts in self._placed

    def mode_at(self, parts: tuple[str, ...]) -> int | None:
        """The mode of what is at `parts` (a symlink's own), None if nothing is: looked up
        through the directories' descriptors, none made, no symlink followed."""
        directory = self._fds.get(parts[:-1])
        opened: list[int] = []
        try:
            if directory is None:  # a directory this restore wrote nothing into
                directory = self._fds[()]
                for name in parts[:-1]:
                    directory = os.open(name, DIRECTORY_FLAGS, dir_fd=directory)
                    opened.append(directory)
            return os.stat(parts[-1], dir_fd=directory, follow_symlinks=False).st_mode
        except OSError:
            return None
        finally:
            for fd in opened:
                os.close(fd)

    def _already(self, directory: int, parts: tuple[str, ...]) -> bool | str:
        """False if a regular file is at `parts` (kept), else why nothing is written there."""
        try:
            st = os.stat(parts[-1], dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            return "it went away while it was being written; left alone"
        if stat.S_ISREG(st.st_mode):
            return False
        return f"{_kind(st.st_mode)} is already at {'/'.join(parts)!r}; left alone"

    def _directory(self, parts: tuple[str, ...]) -> int | str:
        found = self._fds.get(parts)
        if found is not None:
            return found
        refused = self._refused.get(parts)
        if refused is not None:
            return refused
        parent = self._directory(parts[:-1])
        if isinstance(parent, str):
            return parent
        name = parts[-1]
        where = "/".join(parts)
        try:
            os.mkdir(name, _DIRECTORY_MODE, dir_fd=parent)
        except FileExistsError:
            made = False
        else:
            made = True  # new, so empty: no killed restore left anything in it
            self._names[parent].add(name)
        try:
            fd = os.open(name, DIRECTORY_FLAGS, dir_fd=parent)
        except OSError:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            reason = f"{_kind(st.st_mode)} is at {where!r} where a directory belongs; left alone"
            self._refused[parts] = reason
            return reason
        try:
            check_directory(fd, self.target, where)
        except UnsafeTargetError as error:
            os.close(fd)
            self._refused[parts] = str(error)
            return str(error)
        self._fds[parts] = fd
        self._names[fd] = set() if made else _listed(fd)
        return fd


def _listed(directory: int) -> set[str]:
    """The names in `directory`, once temporary files a killed restore left there (old
    enough not to be another's) are removed."""
    names = set(os.listdir(directory))
    stale = [n for n in names if n.startswith(TEMPORARY_PREFIX) and n.endswith(_TEMPORARY_SUFFIX)]
    if stale:
        _remove_stale(directory, stale)
    return names


def _remove_stale(directory: int, names: list[str]) -> None:
    """Remove the temporary files `names` a killed restore left (old enough not to be another's)."""
    now = time.time()
    for name in names:
        try:
            st = os.stat(name, dir_fd=directory, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > _STALE_SECONDS:
                os.unlink(name, dir_fd=directory)
        except OSError:
            continue


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a file"
    return "a special file"
