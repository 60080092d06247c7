"""Named environments: one SQLite database holding every namespace a machine warmed.

An environment is `<root>/<name>.db`. Opening one never fails for reasons
outside the program's control: a directory that cannot be created or written
degrades to memory (with one warning) and an existing database in a read-only
place opens read-only (reads served, writes `Failed`), because a cache that
crashes its application on a read-only container layer is worse than none.

With a remote (`remote="redis://..."`, else `WARMENV_REMOTE`, else the
configuration's `remote`) every storage the environment hands out is the
local one with the fleet's shared tier behind it (`remote/`);
stores, statistics and the CLI see no difference.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple, final, overload

import anyio.abc
import anyio.to_thread
import attrs

from warmenv._background import Background
from warmenv._errors import ClosedError, warn
from warmenv._faces import ASYNC_ONLY, AsyncWith, async_only
from warmenv._fs import expand_home, is_missing, make_directories, why_redirectable
from warmenv.config import (
    Config,
    activate,
    active,
    check_lock_timeout,
    check_max_bytes,
    check_name,
    check_older_than,
    load_config,
    set_root,
)
from warmenv.persistence import statistics as _statistics
from warmenv.persistence.arrivals import Arrivals
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.codec import Codec
from warmenv.persistence.explain import Explanation, stored_key
from warmenv.persistence.memory import memory_database
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.sqlite.bulk import CopiedBatch
from warmenv.persistence.sqlite.database import (
    Degraded,
    Fallback,
    SqliteDatabase,
    open_database,
    why_unusable,
)
from warmenv.persistence.sqlite.opening import EnvironmentLockedError, NotAnEnvironmentError
from warmenv.persistence.sqlite.storage import SqlStorage
from warmenv.persistence.statistics import (
    Batch,
    Cursor,
    EnvironmentStatistics,
    ImportRecord,
    Recorder,
)
from warmenv.persistence.storage import (
    BundleRef,
    Failed,
    InsertSummary,
    NamespaceSummary,
    Purged,
    Storage,
)
from warmenv.persistence.store import DEFAULT_HOT_BYTES, CacheMode, Store
from warmenv.stream import apply_config, policy_chosen

if TYPE_CHECKING:
    # The shared tier's room (its wire, coredis) is imported only where a tier is configured.
    from warmenv.remote import RemoteSettings, RemoteTier

__all__ = [
    "Degraded",
    "Environment",
    "EnvironmentLockedError",
    "Fallback",
    "NotAnEnvironmentError",
    "activate",
    "active",
    "open_environment",
    "set_root",
]

log = logging.getLogger("warmenv.environment")
K = TypeVar("K")
V = TypeVar("V")
Ts = TypeVarTuple("Ts")


@final
class Environment(AsyncWith):
    """An open environment: hands out storages and stores for its namespaces.

    Over one database, its file's or (when the file cannot be used) one in
    memory, chosen once when it is opened (`degraded` says which and why);
    every operation is the database's, whichever it is.
    """

    _async_form = "open_environment(...) as env"

    __slots__ = (
        "_background",
        "_closed",
        "_db",
        "_recorder",
        "_remote",
        "_unrecorded",
        "max_bytes",
        "name",
        "path",
    )

    def __init__(
        self,
        name: str,
        path: Path,
        db: SqliteDatabase,
        *,
        max_bytes: int | None = None,
        remote: RemoteTier | None = None,
        statistics: bool = True,
    ) -> None:
        self.name = name
        self.path = path
        self._db = db
        db.label = f"environment {name!r} at {path}"  # what its closed storages say
        self._remote = remote
        self._closed = False
        self.max_bytes = check_max_bytes(max_bytes)
        """The size bound (keys plus values) enforced on `gc()` and on close, or None."""
        self._recorder = Recorder(self._write_statistics, enabled=statistics)
        self._background = Background()  # what start_soon runs, stopped on close
        self._unrecorded: list[ImportRecord] = []  # kept here where the file takes no write

    @property
    def remote(self) -> RemoteTier | None:
        """The fleet's shared tier behind every storage, or `None` (local only)."""
        return self._remote

    @property
    def in_memory(self) -> bool:
        """Whether this environment degraded to memory (nothing persists)."""
        return self._db.in_memory

    @property
    def read_only(self) -> bool:
        """Whether writes fail because the database could only be opened read-only."""
        return self._db.read_only

    @property
    def degraded(self) -> Degraded | None:
        """Why this environment is not its file opened read-write (`None`: it is).

        `Degraded(Fallback.MEMORY, reason)` when the file could not be used at
        all, `Degraded(Fallback.READ_ONLY, reason)` when it could only be read;
        `reason` says what stood in the way (see `Degraded.reason`).
        """
        return self._db.degraded

    @property
    def arrivals(self) -> Arrivals:
        """Its imports, announced to its stores batch by batch (`persistence.arrivals`)."""
        return self._db.arrivals

    @property
    def database(self) -> SqliteDatabase:
        """The open database (its file's, or the one in memory)."""
        self._check_open()
        return self._db

    def storage(self, namespace: Namespace | str) -> Storage:
        """The storage of one namespace (a `Namespace`, or a full string verbatim)."""
        self._check_open()
        local = self._local_storage(Namespace.coerce(namespace))
        if self._remote is None:
            return local
        from warmenv.remote.storage import RemoteStorage  # in sys.modules since the tier's open

        return RemoteStorage(local, self._remote)

    def _local_storage(self, namespace: Namespace) -> SqlStorage:
        """This machine's storage of `namespace` (what a shared tier sits in front of)."""
        return self._db.storage(str(namespace))

    @overload
    async def store(
        self,
        namespace: Namespace | str,
        codec: None = None,
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | timedelta | None = None,
    ) -> Store[Any, Any]: ...
    @overload
    async def store(
        self,
        namespace: Namespace | str,
        codec: Codec[K, V],
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | timedelta | None = None,
    ) -> Store[K, V]: ...
    async def store(
        self,
        namespace: Namespace | str,
        codec: Codec[Any, Any] | None = None,
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | timedelta | None = None,
    ) -> Store[Any, Any]:
        """A typed `Store` over one namespace; `max_entries`, `hot_bytes`, `ttl`: see `Store.open`.

        Without a codec it is a `JsonCodec` store of any keys and values
        (`Store[Any, Any]`); annotate to narrow it:
        `store: Store[str, int] = await env.store(ns)`.
        """
        storage = self.storage(namespace)
        counters = self._recorder.counters(storage.namespace)
        return await Store.open(
            storage,
            codec,
            mode,
            max_entries=max_entries,
            counters=counters,
            hot_bytes=hot_bytes,
            ttl=ttl,
        )

    async def statistics(self) -> EnvironmentStatistics:
        """Every namespace's and imported bundle's counts, this process's unflushed ones too.

        Counts written by any process (stores flush in batches) plus the
        ones this process holds in memory; they survive restarts.
        """
        self._check_open()
        await self.flush_statistics()
        found = await self._db.statistics(self._recorder.pending())
        if not self._unrecorded:
            return found
        imports = sorted([*self._unrecorded, *found.imports], key=lambda r: r.at, reverse=True)
        return attrs.evolve(found, imports=imports)

    async def record_import(self, record: ImportRecord) -> None:
        """Keep `record` (how an import ended) with the statistics, for `warmenv stats`.

        Where the file cannot be written (read-only, or a version-1 file) it
        is kept in memory, for this process's `statistics()` only.
        """
        self._check_open()
        if not await self._db.record_import(record):
            self._unrecorded.append(record)

    def start_soon(
        self,
        fn: Callable[[*Ts], Awaitable[object]],
        *args: *Ts,
        name: str | None = None,
        task_group: anyio.abc.TaskGroup | None = None,
    ) -> None:
        """Run `await fn(*args)` in the background, for as long as the environment is open.

        In the task group of `open_environment`'s block, or in `task_group`
        (a caller's own, already entered). Closing the environment cancels
        it and waits for it first, so it never runs on a closed environment.
        What it raises is logged (logger `warmenv.environment`, ERROR) and
        goes no further: background work never ends the environment, nor the
        block or task group it runs in. `warmenv.bundle.warm_up` runs here.
        """
        self._check_open()
        self._background.start_soon(self.describe(), fn, *args, name=name, task_group=task_group)

    def set_task_group(self, task_group: anyio.abc.TaskGroup) -> None:
        """Make `task_group` the one `start_soon` runs in by default (`open_environment` does)."""
        self._background.task_group = task_group

    async def flush_statistics(self) -> bool:
        """Write the counts stores gathered so far (done every few seconds and on close).

        False when they could not be written (read-only, busy): they are kept
        in memory and still shown by `statistics()`.
        """
        self._check_open()
        return await self._recorder.flush()

    async def run_statistics_flusher(self, interval: float | None = None) -> None:
        """Flush every `interval` seconds (default `FLUSH_INTERVAL`) until cancelled.

        `open_environment` runs it for the duration of its block.
        """
        await self._recorder.run(_statistics.FLUSH_INTERVAL if interval is None else interval)

    async def _write_statistics(self, batch: Batch, start: Cursor) -> Cursor | None:
        if self._remote is not None:  # a hit counts by its entry's origin: written first
            await self._remote.backfill.settle()
        return await self._db.flush_statistics(batch, start)  # one slice

    def bulk_copy(
        self,
        file: Path,
        prefixes: list[str] | None,
        batch_size: int,
        *,
        bundle: BundleRef | None = None,
        first: Sequence[str] = (),
    ) -> AsyncGenerator[CopiedBatch, None] | None:
        """Batches copying the entry file `file` in as IMPORTED, or `None` if not possible here;
        the namespaces `first` (those the application can hit first) before the rest.

        Only a file no other process can change may be passed (an import's
        private, verified copy): it is read by path. `bundle` is recorded as
        the copied entries' origin, for `info` and `purge_bundle`. `None` in memory.
        """
        self._check_open()
        return self._db.copy_from(file, prefixes, batch_size, bundle=bundle, first=first)

    async def insert_imported(
        self,
        namespace: Namespace | str,
        entries: list[CarryingEntry],
        *,
        bundle: BundleRef | None = None,
    ) -> InsertSummary:
        """Insert a bundle's `(key, value, written_at, cost)` entries as IMPORTED, in one
        transaction, each keeping what it carries (`None`: written now, cost unknown).

        An import's path where `bulk_copy` is not possible (a flat bundle, a
        validated import, an environment in memory); the insert rule applies.
        """
        self._check_open()
        name = str(Namespace.coerce(namespace))
        return await self._db.insert_imported(name, entries, bundle)

    def snapshot_directory(self) -> Path | None:
        """Where an import's private copy of a bundle should go (`None`: the temp directory)."""
        self._check_open()
        if self._db.in_memory or self._db.read_only:
            return None
        return self.path.parent

    async def namespaces(self) -> list[NamespaceSummary]:
        """Every namespace holding entries, with counts and sizes."""
        self._check_open()
        return await self._db.namespaces()

    async def explain(
        self, namespace: Namespace | str, key: bytes | str | None = None
    ) -> Explanation:
        """Why a lookup of `namespace` (and `key`) misses: the namespaces nearby, nearest first.

        A `str` key is one of a store of the default codec (`JsonCodec`);
        pass `bytes` to ask about a key exactly as stored.
        """
        self._check_open()
        # Namespaces are listed where they are stored: the local storage (a
        # shared tier in front of it explains from it too).
        return await self._local_storage(Namespace.coerce(namespace)).explain(stored_key(key))

    async def bundle_signers(self) -> dict[str, str]:
        """The key (its text, `ed25519:...`) whose signature was checked when each bundle
        was imported, by the bundle's digest; a bundle imported unsigned is not listed
        (`warmenv.caches.restore` reads it under `require_signature`)."""
        self._check_open()
        return await self._db.bundle_signers()

    async def purge_bundle(self, digest_or_name: str) -> Purged | Failed:
        """Remove the entries that came from one bundle and are still imported.

        Quarantine for a bad bundle: `digest_or_name` is the bundle's digest
        (with or without its `blake2b-256:` prefix) or its manifest name.
        Local values, including ones that replaced the bundle's, stay. A name
        that more than one imported bundle bears (two builds called the same)
        raises `WarmenvError` listing their digests, and nothing is deleted.
        """
        self._check_open()
        if not isinstance(digest_or_name, str) or not digest_or_name:
            raise ValueError(f"purge_bundle takes a bundle digest or name, got {digest_or_name!r}")
        return await self._db.purge_bundle(digest_or_name)

    async def gc(
        self,
        *,
        max_bytes: int | None = None,
        older_than: float | timedelta | None = None,
        keep_versions: int | None = None,
    ) -> Purged | Failed:
        """Evict entries: old versions, entries unused for a while, then by size.

        `keep_versions`: per application name and path, keep the N versions
        written most recently, dropping the namespaces of older ones.
        `older_than` (seconds or a timedelta): drop entries neither written nor
        hit for that long. `max_bytes` (default: the environment's own):
        drop the least recently hit entries, never-hit ones first, until keys
        and values add up to at most that. One transaction.
        """
        self._check_open()
        limit = self.max_bytes if max_bytes is None else check_max_bytes(max_bytes)
        age = check_older_than(older_than)
        if keep_versions is not None and (
            not isinstance(keep_versions, int)
            or isinstance(keep_versions, bool)
            or keep_versions < 1
        ):
            raise ValueError(f"keep_versions must be an int >= 1, got {keep_versions!r}")
        return await self._db.gc(max_bytes=limit, older_than=age, keep_versions=keep_versions)

    async def vacuum(self, *, wait: float = 30.0) -> tuple[int, int]:
        """Give freed space back to the file system: the file's size before and after.

        Purging and eviction leave free pages inside the file; this rewrites
        it compactly (it needs as much free disk as the file's size, and waits
        up to `wait` seconds for other processes' transactions). A reader
        that stays inside a transaction longer keeps the file from shrinking:
        that raises `WarmenvError` saying so. `(0, 0)` in memory.
        """
        self._check_open()
        if not wait >= 0:
            raise ValueError(f"wait must be 0 or more seconds, not {wait!r}")
        return await self._db.vacuum(wait)

    async def touch(self, namespace: Namespace | str, keys: Iterable[bytes]) -> int:
        """Record hits on `keys` (batched by the caller), for eviction's order."""
        self._check_open()
        return await self._db.touch(str(Namespace.coerce(namespace)), keys)

    async def close(self) -> None:
        """Close the database; the environment and its storages are unusable after.

        Values fetched from the shared tier and still queued for the local file
        are written first. With `max_bytes`, entries past the bound are evicted first.
        """
        if self._closed:
            return
        await self._background.stop()
        with anyio.CancelScope(shield=True):
            if self._remote is not None:  # fetched values queued for this file: written first
                await self._remote.backfill.flush()
            await self._recorder.flush()
        if self.max_bytes is not None and not self.read_only:
            with anyio.CancelScope(shield=True):
                await self.gc()
        # Closed first: a close refused (from another event loop) can be retried.
        await self._db.close()
        self._closed = True  # its database emptied what its stores held (forget_on_close)

    def describe(self) -> str:
        """The environment's name and file, and whether it is in memory or read-only."""
        mode = " (in memory)" if self.in_memory else " (read-only)" if self.read_only else ""
        shared = f", shared through {self._remote.describe()}" if self._remote else ""
        return f"{self._db.label}{mode}{shared}"

    def __repr__(self) -> str:
        return f"<Environment: {self.describe()}{', closed' if self._closed else ''}>"

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self.describe()} is closed; open it again to use it")

    async def __aenter__(self) -> Environment:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def _remote_settings(remote: str | RemoteSettings) -> RemoteSettings | None:
    """The shared tier `remote` names, or None for `""` (no tier). The tier's room
    (`warmenv.remote`, coredis behind it) is imported only when there is one."""
    if isinstance(remote, str) and not remote:
        return None
    from warmenv.remote import remote_settings

    return remote_settings(remote)


@async_only("open_environment(...) as env", ASYNC_ONLY)
@asynccontextmanager
async def open_environment(
    name: str | None = None,
    *,
    root: str | Path | None = None,
    file: str | Path | None = None,
    create: bool = True,
    read_only: bool = False,
    max_bytes: int | None = None,
    remote: str | RemoteSettings | None = None,
    statistics: bool = True,
    lock_timeout: float | None = None,
) -> AsyncIterator[Environment]:
    """Open an environment for the duration of the block.

    `name` and `root` default to `active()`; `file` opens that database file
    instead of `<root>/<name>.db`. With `create=False` an environment that
    does not exist yet raises `FileNotFoundError` and nothing is created (for
    callers that only read, such as `warmenv ls`); with `read_only=True`
    nothing is created, upgraded or written either (`env.read_only`). A file
    warmenv cannot prove is its own raises `NotAnEnvironmentError`, left as
    it is. `max_bytes` bounds the entries' size (keys plus values): past it,
    the least recently hit are evicted on `env.gc()` and at the latest on
    close (default: the configured `max_bytes`). With `statistics` (the
    default) stores count their hits and misses, flushed every few seconds
    by a background task of this block and on close. `lock_timeout`: seconds
    the open and each write wait for another process's lock (default: the
    configured one, 30); past it the open raises `EnvironmentLockedError`.

    `remote` is a `redis://` or `rediss://` URL (or `RemoteSettings` to tune
    timeouts and caps) for the fleet's shared tier; `None` means the
    configured one (the variable `WARMENV_REMOTE`, else the file's `remote`),
    and `""` turns the tier off. Redis being down never fails the open: the
    tier connects on first use and falls back to local.
    """
    check_max_bytes(max_bytes)
    check_lock_timeout(lock_timeout)
    config = None
    if remote is None:
        config = await anyio.to_thread.run_sync(load_config)
        remote = config.remote or ""
    settings = _remote_settings(remote)
    opened = await _open(
        name,
        root,
        file,
        create=create and not read_only,
        read_only=read_only,
        max_bytes=max_bytes,
        lock_timeout=lock_timeout,
        config=config,
    )
    tier = AsyncExitStack()
    # The block's own exception leaves unwrapped: it is caught inside the task
    # group (which would put it in an exception group on trio) and raised after.
    error: BaseException | None = None
    flusher_done = anyio.Event()
    env: Environment | None = None

    async def flusher(env: Environment) -> None:
        try:
            await env.run_statistics_flusher()
        finally:
            flusher_done.set()

    try:
        shared = None
        if settings is not None:
            from warmenv.remote import RemoteTier

            shared = await tier.enter_async_context(RemoteTier.connect(settings, opened.name))
        env = Environment(
            opened.name,
            opened.path,
            opened.db,
            max_bytes=opened.max_bytes,
            remote=shared,
            statistics=statistics,
        )
        try:
            async with anyio.create_task_group() as tg:
                env.set_task_group(tg)
                if statistics:
                    tg.start_soon(flusher, env)
                else:
                    flusher_done.set()
                try:
                    yield env
                except BaseException as exc:
                    error = exc
                finally:
                    tg.cancel_scope.cancel()
                    # Waited for shielded, so that leaving the block is no more a
                    # checkpoint than it was without the flusher: a block that
                    # completed inside a cancelled scope still completes.
                    with anyio.CancelScope(shield=True):
                        await flusher_done.wait()
        except anyio.get_cancelled_exc_class():
            if error is not None or not flusher_done.is_set():
                raise
            # trio's nursery exit is a checkpoint, which leaving the block was
            # not: a cancellation raised only there is left to the caller's next
            # checkpoint (cancellation is level-triggered), as it was before.
    finally:
        try:
            # Not in a cancel scope of its own: the tier's task group was entered
            # before anything of this block and must be exited as the innermost.
            await tier.aclose()
        finally:
            if env is not None:
                await env.close()
            else:  # the tier failed to connect: nothing but the database to close
                with anyio.CancelScope(shield=True):
                    await opened.db.close()
    if error is not None:
        raise error


def environment_file(name: str | None = None, *, root: str | Path | None = None) -> Path:
    """The database file `open_environment(name, root=root)` opens, `<root>/<name>.db`
    (each defaulting to `active()`'s), found without creating or opening anything;
    `ValueError` for a name that names no environment (`config.check_name`)."""
    return _locate(name, root, None)[1]


def _locate(name: str | None, root: str | Path | None, file: str | Path | None) -> tuple[str, Path]:
    """The environment's name and database path, and its directory created."""
    if file is not None:
        path = expand_home(file, "file")
        env_name = check_name(name) if name is not None else path.stem
    else:
        if name is not None:
            check_name(name)
        if name is None or root is None:
            default_name, default_root = active()
            name = default_name if name is None else name
            root = default_root if root is None else root
        path = expand_home(root, "root") / f"{name}.db"
        env_name = name
    return env_name, path


async def _open(
    name: str | None,
    root: str | Path | None,
    file: str | Path | None,
    *,
    create: bool = True,
    read_only: bool = False,
    max_bytes: int | None = None,
    lock_timeout: float | None = None,
    config: Config | None = None,
) -> _Opened:
    env_name, path = _locate(name, root, file)
    if not create and await anyio.to_thread.run_sync(is_missing, path):
        raise FileNotFoundError(
            errno.ENOENT, f"no environment {env_name!r} (no file {path})", str(path)
        )
    if not policy_chosen() or max_bytes is None or lock_timeout is None:
        if config is None:  # not read yet by the caller
            config = await anyio.to_thread.run_sync(load_config)
        if not policy_chosen():  # the configured stream_policy, unless code chose one
            apply_config(config, chosen=False)
        if max_bytes is None:
            max_bytes = config.max_bytes
        if lock_timeout is None:
            lock_timeout = config.lock_timeout
    # Before anything is created: a directory made through another user's
    # symlink is as much theirs to aim as the file (`why_redirectable`).
    reason = await anyio.to_thread.run_sync(why_redirectable, path)
    if reason is None:
        try:
            if create:
                # 0755, not 0777 less the umask: a root others can write is refused
                await anyio.to_thread.run_sync(make_directories, path.parent)
            db = await open_database(
                path, create=create, read_only=read_only, lock_timeout=lock_timeout
            )
        except (OSError, sqlite3.Error) as exc:
            reason = await anyio.to_thread.run_sync(why_unusable, path, exc)
    if reason is not None:
        warn(
            f"environment {env_name!r}: cannot use {path} ({reason}); "
            "keeping its entries in memory for this process only"
        )
        db = memory_database(Degraded(Fallback.MEMORY, reason))
    if db.degraded is not None and db.read_only:
        log.warning("%s opened read-only: reads are served, writes will fail", path)
    return _Opened(env_name, path, db, max_bytes)


@attrs.frozen
class _Opened:
    """An environment's database, opened: what its `Environment` is made of."""

    name: str
    path: Path
    db: SqliteDatabase
    max_bytes: int | None
