"""One open environment database: the connection every namespace shares, and its opening.

An environment is one SQLite file in WAL mode: readers carry on while a
writer commits, and the busy timeout makes writers of several processes
queue rather than fail. Opening decides once how the file is used: read-write
(proven ours, its schema created, checked or upgraded: `opening`), or
read-only where it exists and cannot be written (`uris.read_only_uris`), so
that a read-only container layer serves reads instead of failing every write
one by one. The database's operations are each one function on the
connection's worker (`schema`, `statistics`, `eviction`, `bulk`).
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import secrets
import sqlite3
import stat
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar, final

import anyio
import anyio.to_thread
import attrs

from warmenv import _sqlite
from warmenv._errors import ClosedError, WarmenvError, warn
from warmenv._fs import missing_link, non_regular_kind
from warmenv.persistence.arrivals import Arrivals
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.explain import Explanation, explain
from warmenv.persistence.sqlite import bulk, eviction, opening, schema, statistics, uris
from warmenv.persistence.sqlite.bulk import BulkCopies, CopiedBatch
from warmenv.persistence.sqlite.storage import SqliteStorage, SqlStorage
from warmenv.persistence.statistics import (
    START,
    Batch,
    Cursor,
    EnvironmentStatistics,
    ImportRecord,
)
from warmenv.persistence.storage import (
    BundleRef,
    Failed,
    HeldValues,
    InsertSummary,
    NamespaceSummary,
    Origin,
    Purged,
    check_bundle,
    check_key,
    wall_clock,
)

__all__ = ["Degraded", "Fallback", "SqliteDatabase", "open_database", "why_unusable"]

log = logging.getLogger("warmenv.storage")
T = TypeVar("T")


class Fallback(enum.Enum):
    """What an environment fell back to when its file could not be opened read-write."""

    READ_ONLY = "read-only"
    """The file exists and is read (reads served, writes `Failed`)."""
    MEMORY = "memory"
    """The file cannot be used at all: entries live in memory for this process only."""


@attrs.frozen
class Degraded:
    """Why an environment is not its file opened read-write: the fallback, and the cause."""

    fallback: Fallback
    reason: str
    """What stood in the way, in terms of the file system where it says why (a
    directory in the way, a permission, a FIFO at the path), else as the
    operating system or SQLite said it: a sentence to show as it is."""


NamespaceStorage = Callable[["SqliteDatabase", str], SqlStorage]
"""How a database hands out the storage of one of its namespaces."""


@final
class SqliteDatabase:
    """One open environment database: the connection every namespace shares.

    A file's, or one in memory (`warmenv.persistence.memory`): the same
    tables, the same SQL. What differs is decided when it is opened: how its
    namespaces describe themselves (`storage`), and that a database in memory
    has no file to copy a bundle into in bulk or to vacuum.
    """

    __slots__ = (
        "_bulk",
        "_closed",
        "_held",
        "_storage",
        "arrivals",
        "connection",
        "degraded",
        "in_memory",
        "label",
        "path",
        "read_only",
        "version",
    )

    def __init__(
        self,
        connection: _sqlite.Connection,
        path: Path,
        *,
        read_only: bool,
        version: int = int(schema.ENVIRONMENT_VERSION),
        in_memory: bool = False,
        degraded: Degraded | None = None,
        storage: NamespaceStorage = SqliteStorage,
    ) -> None:
        self.connection = connection
        self.path = path
        self.read_only = read_only
        self.version = version
        """The schema version read: 2, or 1 for a version-1 file that could not be upgraded."""
        self.in_memory = in_memory
        """Whether the database lives in process memory (nothing persists)."""
        self.degraded = degraded
        """Why this is not the file opened read-write (None: it is)."""
        self._storage = storage
        self._bulk = BulkCopies()
        self.arrivals = Arrivals()
        """The imports into this database, announced batch by batch (`persistence.arrivals`)."""
        self._held: weakref.WeakSet[HeldValues] = weakref.WeakSet()  # its stores' memory
        self._closed = False
        self.label = "the database in memory" if in_memory else f"the environment at {path}"
        """How errors name it: its environment (`Environment` says which), else its file."""

    def storage(self, namespace: str) -> SqlStorage:
        """The storage of one namespace (its full string)."""
        return self._storage(self, namespace)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self.connection.run(fn)
        except ClosedError as exc:
            raise self._closed_error(exc) from None

    def run_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn` on the calling thread (`Connection.run_here`)."""
        try:
            return self.connection.run_here(fn)
        except ClosedError as exc:
            raise self._closed_error(exc) from None

    def _closed_error(self, exc: ClosedError) -> ClosedError:
        """`exc` (the connection's, which knows no environment) naming this one."""
        if self._closed:
            return ClosedError(f"{self.label} is closed; open it again to use it")
        return ClosedError(f"{self.label}: {exc}")  # a fork's copy, say: the connection says

    async def close(self) -> None:
        """Close the connection, then empty what every store over it holds in memory."""
        await self.connection.close()
        self._closed = True
        for held in list(self._held):
            held.close()

    def forget_on_close(self, held: HeldValues) -> None:
        """Empty `held` when this database closes (at once if it has): `Storage.forget_on_close`."""
        if self._closed:
            held.close()
        else:
            self._held.add(held)

    async def namespaces(self) -> list[NamespaceSummary]:
        try:
            rows: list[NamespaceSummary] = await self.run(statistics.namespaces)
        except sqlite3.Error as exc:
            log.warning("listing namespaces of %s failed: %s", self.path, exc)
            return []
        return rows

    def copy_from(
        self,
        source: Path,
        prefixes: list[str] | None,
        batch_size: int,
        *,
        bundle: BundleRef | None = None,
        first: Sequence[str] = (),
    ) -> AsyncGenerator[CopiedBatch, None] | None:
        """Copy the entries of the entry file `source` in, as IMPORTED, a batch at a time
        (`BulkCopies.copy`: the caller must own `source`, a private verified snapshot),
        the namespaces `first` before the rest.

        `None` in memory: its calls run on the event loop's thread (`_sqlite._memory`),
        where reading a bundle's file in SQLite would block the loop.
        """
        if self.in_memory:
            return None
        return self._bulk.copy(
            self.run, self.path, source, prefixes, batch_size, bundle=bundle, first=first
        )

    async def insert_imported(
        self,
        namespace: str,
        entries: list[CarryingEntry],
        bundle: BundleRef | None,
    ) -> InsertSummary:
        """Insert `(key, value, written_at, cost)` entries as IMPORTED, in one transaction.

        An import's path for what it cannot copy in bulk (a flat bundle, a
        bundle checked entry by entry): each entry keeps the written_at (else
        now) and cost it carries, as the bulk copy keeps a bundle's columns.
        The values come from a bundle reader, which believed them already.
        """
        bundle = check_bundle(bundle, Origin.IMPORTED)
        try:
            stored = await self.run(partial(bulk.insert_imported, namespace, entries, bundle))
        except sqlite3.Error as exc:
            reason = self._failed("import", exc).reason
            return InsertSummary(stored=0, conflict=0, failed=len(entries), reason=reason)
        return InsertSummary(stored=stored, conflict=len(entries) - stored, failed=0)

    async def touch(self, namespace: str, keys: Iterable[bytes]) -> int:
        """Record that `keys` of `namespace` were hit now: eviction keeps them longest.

        For a store to call with the keys it served since its last call, in
        batches (every few seconds, and at close), never per hit. Coarse: an
        entry hit within the last `HIT_GRANULARITY` seconds is not written
        again. Returns how many entries were updated; a failure (read-only,
        busy) is logged and counts 0, as recency is only a hint.
        """
        wanted = [check_key(k) for k in keys]
        if not wanted or self.read_only or self.version < 2:
            return 0
        try:
            return await self.run(partial(eviction.touch, namespace, wanted, int(wall_clock())))
        except sqlite3.Error as exc:
            log.warning("recording hits in %s failed: %s", self.path, exc)
            return 0

    async def bundle_signers(self) -> dict[str, str]:
        """The trusted key that signed each bundle imported with a checked signature."""
        try:
            return await self.run(schema.bundle_signers)
        except sqlite3.Error as exc:
            log.warning("reading the bundle signers of %s failed: %s", self.path, exc)
            return {}

    async def purge_bundle(self, digest_or_name: str) -> Purged | Failed:
        """Delete the entries still carrying that bundle's origin (imported from it)."""
        try:
            return Purged(await self.run(partial(eviction.purge_bundle, digest_or_name)))
        except sqlite3.Error as exc:
            return self._failed("purge_bundle", exc)

    async def gc(
        self,
        *,
        max_bytes: int | None = None,
        older_than: float | None = None,
        keep_versions: int | None = None,
    ) -> Purged | Failed:
        """Evict entries by version, age and size, in one transaction; how many went.

        `keep_versions`: per application name and path, only the versions
        written most recently are kept. `older_than` (seconds): entries neither
        written nor hit for that long go. `max_bytes`: then the least recently
        hit entries (never hit first, oldest written first) go until the keys
        and values left add up to at most that.
        """
        now = wall_clock()
        try:
            evict = partial(eviction.gc, max_bytes, older_than, keep_versions, now)
            return Purged(await self.run(evict))
        except sqlite3.Error as exc:
            return self._failed("gc", exc)

    async def vacuum(self, wait: float = _sqlite.BUSY_TIMEOUT_SECONDS) -> tuple[int, int]:
        """Give the space of deleted entries back to the file system; sizes before and after.

        Sizes are the database file plus its write-ahead log, in bytes; `(0, 0)`
        in memory, which has no file.
        """
        if self.in_memory:
            return 0, 0
        if self.read_only:
            raise WarmenvError(
                f"cannot vacuum {self.path}: it is open read-only; vacuum it where it is writable"
            )
        before = await anyio.to_thread.run_sync(eviction.file_size, self.path)
        try:
            done = await self.run(partial(eviction.vacuum, wait))
        except sqlite3.Error as exc:
            raise WarmenvError(
                f"vacuum of {self.path} failed ({exc}); it needs free disk about the file's "
                "size and no other process inside a transaction: retry when both hold"
            ) from None
        if not done:
            raise WarmenvError(
                f"vacuum of {self.path} could not finish: another process kept a read "
                f"transaction open for over {wait:g} s, so the compacted copy is still in the "
                "write-ahead log and the file is not smaller; run vacuum again once that "
                "process is done (or with a longer wait)"
            )
        after = await anyio.to_thread.run_sync(eviction.file_size, self.path)
        return before, after

    async def flush_statistics(self, batch: Batch, start: Cursor = START) -> Cursor | None:
        """Add one slice of a batch, from `start`, in one transaction; where it ended, or None.

        One slice (`statistics.cut`: about `SLICE_ROWS` rows) per call, so a
        call queued behind it waits for that slice only; the caller calls
        again from where this one ended. Each hit key is resolved against its
        entry (origin, cost, bundle) inside the transaction, and its recency
        recorded, so the hit path never reads provenance. A read-only or
        version-1 file keeps nothing (the counts stay in memory for
        `statistics()`); a failure (busy, full disk) is logged and the caller
        keeps this slice and the rest for the next flush.
        """
        if self.read_only or self.version < 2:
            return None
        try:
            return await self.run(partial(statistics.flush, batch, start, int(wall_clock())))
        except sqlite3.Error as exc:
            log.warning("recording statistics in %s failed (kept for later): %s", self.path, exc)
            return None

    async def explain(self, namespace: str, key: bytes | None) -> Explanation:
        """Why a lookup in `namespace` (of `key`) misses here, read in one hop.

        A failing read explains over nothing rather than raising (logged):
        an explanation is a diagnosis, never a new error.
        """
        try:
            return await self.run(partial(statistics.explain_miss, namespace, key))
        except sqlite3.Error as exc:
            log.warning("explaining a miss in %s failed: %s", self.path, exc)
            return explain([], namespace, key, lambda names, key: set())

    async def statistics(self, pending: Batch) -> EnvironmentStatistics:
        """The stored counts of every namespace and bundle, plus `pending` (not yet stored)."""
        return await self.run(partial(statistics.read, pending, self.version))

    async def record_import(self, record: ImportRecord) -> bool:
        """Keep `record` with the statistics; False where it cannot be written (logged)."""
        if self.read_only or self.version < 2:
            return False
        try:
            await self.run(partial(statistics.record_import, record))
        except sqlite3.Error as exc:
            log.warning("recording an import in %s failed: %s", self.path, exc)
            return False
        return True

    def _failed(self, operation: str, exc: sqlite3.Error) -> Failed:
        reason = f"{operation} on {self.path} failed: {exc}"
        log.warning("%s", reason)
        return Failed(reason)


async def open_database(
    path: Path,
    *,
    create: bool = True,
    read_only: bool = False,
    lock_timeout: float = _sqlite.BUSY_TIMEOUT_SECONDS,
) -> SqliteDatabase:
    """Open (and if need be create) the database at `path`, read-write if possible.

    A file that is there must be proven warmenv's (`opening`): anything else
    raises `NotAnEnvironmentError` and is left as it is. A missing one is
    created (with `create`) under a private name and linked into place, so
    no process ever sees it half made. Falls back to read-only
    (`uris.open_uris`) when the file exists but cannot be written. With
    `read_only` nothing is created, converted or written: the file is read
    as it is. `lock_timeout` (seconds) bounds every wait for another
    process's lock, the open's included: past it the open raises
    `EnvironmentLockedError` (busy is not read-only, and is never taken for
    it). Raises `sqlite3.Error` or `OSError` when neither works.
    """
    kind = await anyio.to_thread.run_sync(non_regular_kind, path)
    if kind is not None:  # SQLite would block on a FIFO or read a device forever
        raise OSError(errno.EINVAL, f"{path} is {kind}, not a database file", str(path))
    exists = await anyio.to_thread.run_sync(path.exists)
    if not exists and (read_only or not create):
        raise FileNotFoundError(path)
    try:
        if exists:
            await anyio.to_thread.run_sync(
                partial(opening.prove_unwritten, path, busy_timeout=lock_timeout)
            )
        if read_only:
            return await _open_readonly(path, None, lock_timeout, read_write=True)
        if not exists:
            await _create(path)
        return await _open_writable(path, lock_timeout)
    except opening.NotAnEnvironmentError as exc:
        raise exc.at(path) from None
    except sqlite3.Error as exc:
        if opening.is_busy(exc):
            raise opening.EnvironmentLockedError(path, lock_timeout) from None
        raise


def _prepare_query_only(conn: sqlite3.Connection) -> int:
    # A mode=rw connection opened only to read refuses every write, as mode=ro does.
    conn.execute("PRAGMA query_only = ON")
    return opening.prepare_readonly(conn)


async def _open_writable(path: Path, lock_timeout: float) -> SqliteDatabase:
    if not await anyio.to_thread.run_sync(uris.writable, path):
        # Never offered to a read-write open: SQLite would quietly open it
        # read-only, leave -wal and -shm files, and accept writes that all fail.
        return await _open_readonly(path, f"{path} is not writable by this process", lock_timeout)
    try:
        uri = f"{(await anyio.to_thread.run_sync(path.resolve)).as_uri()}?mode=rw"
        connection, prepared = await _sqlite.open_with(
            uri, opening.prepare_writable, uri=True, busy_timeout=lock_timeout
        )
    except sqlite3.Error as exc:
        if opening.is_busy(exc):
            raise  # another process's lock: not a reason to open read-only
        why = f"opening {path} for writing failed: {exc}"
        if not await anyio.to_thread.run_sync(_may_create_in, path.parent):
            why += f" (its directory {path.parent} is not writable by this process)"
    else:
        if prepared.rebuilt_from is not None:
            warn(
                f"{path}: schema version {prepared.rebuilt_from} is not one this warmenv "
                f"reads (1 or {schema.ENVIRONMENT_VERSION}); its entries were dropped and "
                "the table rebuilt"
            )
        if prepared.upgraded_from is not None:
            log.info(
                "%s: upgraded from schema version %s to %s in place",
                path,
                prepared.upgraded_from,
                schema.ENVIRONMENT_VERSION,
            )
        return SqliteDatabase(connection, path, read_only=False)
    return await _open_readonly(path, why, lock_timeout)


async def _create(path: Path) -> None:
    """Make a new environment at `path`: built under a private name, then linked into place.

    The link fails if anything appeared at `path` meanwhile (another process
    made the environment first, or someone put a file there): what is there
    is opened, and proven ours, as any existing file is.
    """
    private = path.with_name(f".{path.name}.warmenv-new.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        connection, _ = await _sqlite.open_with(str(private), opening.prepare_new)
        await connection.close()  # the last connection: the -wal is checkpointed and removed
        await anyio.to_thread.run_sync(_link, private, path)
    finally:
        await anyio.to_thread.run_sync(_remove, private)


def _link(private: Path, path: Path) -> None:
    try:
        os.link(private, path)
    except FileExistsError:
        pass  # someone else's: opened and checked as an existing file
    except OSError:
        # A file system without hard links: only a path still free is taken.
        if not path.exists() and not path.is_symlink():
            os.replace(private, path)


def _remove(private: Path) -> None:
    for leftover in (private, *(private.with_name(private.name + s) for s in ("-wal", "-shm"))):
        leftover.unlink(missing_ok=True)


async def _open_readonly(
    path: Path, why: str | None, lock_timeout: float, *, read_write: bool = False
) -> SqliteDatabase:
    """Open an environment only to read it (`uris.open_uris`), writing nothing to it.

    `why` is why it could not be opened for writing (None: reading was asked
    for, and the environment is not degraded); `read_write` tries `mode=rw`
    first, where this process may write the file (nothing is written through it).
    """
    candidates = await anyio.to_thread.run_sync(
        partial(uris.open_uris, path, read_write=read_write)
    )
    error: sqlite3.Error | None = None
    for uri in candidates:
        try:
            connection, version = await _sqlite.open_with(
                uri, _prepare_query_only, uri=True, busy_timeout=lock_timeout
            )
        except sqlite3.Error as exc:
            if opening.is_busy(exc):
                raise
            error = exc
            continue
        degraded = None if why is None else Degraded(Fallback.READ_ONLY, why)
        return SqliteDatabase(connection, path, read_only=True, version=version, degraded=degraded)
    assert error is not None
    raise error


def why_unusable(path: Path, error: BaseException) -> str:
    """Why the database at `path` could not be opened at all (`error`), as `Degraded.reason`.

    Said in terms of the file system where it tells: the first directory on
    the way that is not one or may not be searched, the directory a missing
    file (or missing directories) would be created in that may not be
    written; the path is a FIFO, a directory, a device; the file may not be
    read. Else what the operating system or SQLite said. Never raises: it
    runs where the open already failed, to explain the fallback, so every
    look at the file system here is one that answers even when denied.
    File-system calls: async code calls it on a worker thread.
    """
    obstacle = _obstacle_above(path)
    if obstacle is not None:
        return obstacle
    kind = non_regular_kind(path)
    if kind is not None:
        return f"{path} is {kind}, not a database file"
    if not os.path.lexists(path):
        if not _may_create_in(path.parent):
            return f"{path.parent} is not writable by this process"
    elif not os.access(path, os.R_OK):
        return f"{path} is not readable by this process"
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}"
    return str(error)


def _obstacle_above(path: Path) -> str | None:
    """The first directory on the way down to `path` that stops it, said as a reason.

    Walked from the top, so the directory named is the one to fix: not a
    directory, not searchable (so nothing below it can even be looked at),
    or, where the rest of the way is missing, the last one there that may
    not be written (so the rest cannot be created).
    """
    for directory in reversed(path.parents):
        try:
            mode = os.stat(directory).st_mode
        except FileNotFoundError:
            if (dangling := missing_link(directory)) is not None:
                return dangling  # nothing can be created through it
            above = directory.parent
            return None if _may_create_in(above) else f"{above} is not writable by this process"
        except OSError as exc:  # a symlink loop, a name too long, an I/O error
            return f"{directory}: {exc.strerror}"
        if not stat.S_ISDIR(mode):
            return f"{directory} is not a directory"
        if not os.access(directory, os.X_OK):
            return f"{directory} is not searchable by this process"
    return None


def _may_create_in(directory: Path) -> bool:
    """Whether this process may create files in `directory` (a -wal file, a database)."""
    return os.access(directory, os.W_OK | os.X_OK)
