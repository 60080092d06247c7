"""How an existing SQLite file is opened: read-write where we may write it, else read-only.

SQLite offered a file it cannot write opens it read-only in silence, and a
read-only connection to a WAL database creates -wal and -shm files beside it
(owned by us), so the mode is chosen here, before SQLite sees the path, from
what this process may do and from what lies beside the file. An environment,
the bulk copy's ATTACH of a bundle, and the bundle files all open by these
URIs. The functions resolve the path (file system calls): async code calls
them on a worker thread.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

__all__ = ["open_uris", "read_only_uris", "writable"]


def open_uris(path: Path, *, read_write: bool) -> list[str]:
    """The URIs to open an existing file by, in the order to try them.

    - `mode=rw`, with `read_write` and only where this process may write the
      file (`writable`): never creates the file, and the last connection to
      close it removes the -wal and -shm files it needed, so a read leaves
      nothing beside the file. A file we may not write is never offered to
      `mode=rw`: SQLite would quietly open it read-only, a check that writes
      nothing would pass, and every later write would fail one by one.
    - then `read_only_uris`: how a file is read that we do not (or cannot) write.
    """
    resolved = path.resolve()
    first = [f"{resolved.as_uri()}?mode=rw"] if read_write and writable(resolved) else []
    return first + read_only_uris(resolved)


def read_only_uris(path: Path) -> list[str]:
    """How to read a WAL database without writing it or creating any file beside it.

    A `mode=ro` connection cannot checkpoint, so it never removes the -wal
    and -shm files it opens, and where none exist and the directory is
    writable it creates them (owned by us, with the database's permission
    bits, so the file's owner may then be unable to write its own -shm).
    So the choice follows what is beside the file:

    - a rollback journal beside it (a file in journal mode DELETE being
      written, or left hot by a crash): `mode=ro`, which honours it.
    - no -wal file (or an empty one and no -shm): `immutable=1`, the main
      file alone, no lock, nothing created. It is complete: SQLite removes a
      -wal file only after checkpointing every commit in it into the main file.
    - a -wal file and a -shm file (a writer has the file open, or left them):
      `mode=ro` reads through them under the writers' locks, sees every
      commit and creates nothing; `immutable=1` after it would ignore the
      -wal's commits, so it is not tried.
    - a -wal file with content and no -shm (a writer died before
      checkpointing): its commits can only be read through a -shm file that
      we would create and leave behind, so the file is refused
      (`sqlite3.OperationalError`): opening it once as its owner recovers it.

    Residual risk of `immutable=1`: it takes no lock, so a writer who may
    write the file and opens it afterwards is not seen (its commits stay in
    its -wal, unseen by this connection until it is opened again), and if
    that writer checkpoints into the main file while a read is under way,
    that read may see pages of two versions (an error, or a torn result).
    Nothing safer exists for a reader that may not create the -shm file
    through which SQLite's readers and writers coordinate.
    """
    resolved = path.resolve()
    uri = resolved.as_uri()
    wal = _size(resolved.with_name(resolved.name + "-wal"))
    shm = _size(resolved.with_name(resolved.name + "-shm")) is not None
    journal = _journal(resolved.with_name(resolved.name + "-journal"))
    if journal == "hot" or (journal == "spent" and not _is_wal(resolved)):
        # A rollback journal (a file not in WAL mode, mid-write or left by a crash):
        # immutable=1 would read the half-written main file; mode=ro honours the journal
        # (or fails, where rolling it back would need a write), never reads torn pages.
        # A spent one (its header zeroed, as PERSIST leaves it) beside a WAL file is
        # none of that, and mode=ro there would create the -wal and -shm files.
        return [f"{uri}?mode=ro"]
    if wal is None or (wal == 0 and not shm):
        return [f"{uri}?immutable=1"]
    if shm:
        return [f"{uri}?mode=ro"]
    raise sqlite3.OperationalError(
        f"{resolved}-wal holds commits not yet in {resolved} and there is no -shm file "
        "(a writer stopped before checkpointing); reading it would leave a -shm file "
        "behind, so it is not read: open it once as a user who may write it"
    )


def writable(path: Path) -> bool:
    """Whether this process may open `path` for writing (what SQLite's `mode=rw` needs).

    Opened, not `os.access`ed: the answer is the kernel's for our effective
    user, groups, ACLs and a read-only mount alike. Non-blocking, so a FIFO
    answers at once; nothing is created or changed.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def _journal(path: Path) -> str | None:
    """What is at a database's `-journal` path: None (nothing, or empty), "spent" (a
    journal whose first byte is zero, which SQLite does not roll back) or "hot"
    (anything else, an unreadable one included: SQLite decides, never read around)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # a FIFO answers at once
    except FileNotFoundError:
        return None
    except OSError:
        return "hot"
    try:
        if os.fstat(fd).st_size == 0:
            return None
        return "spent" if os.pread(fd, 1, 0) == b"\0" else "hot"
    except OSError:
        return "hot"
    finally:
        os.close(fd)


def _is_wal(path: Path) -> bool:
    """Whether the database's header says WAL mode (read and write versions 2)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.pread(fd, 2, 18) == b"\x02\x02"
    except OSError:
        return False
    finally:
        os.close(fd)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None
