"""Named environments: one SQLite database holding every namespace a machine warmed.

An environment is `<root>/<name>.db`. Opening one never fails for reasons
outside the program's control: a directory that cannot be created or written
degrades to memory (with one warning) and an existing database in a read-only
place opens read-only (reads served, writes `Failed`), because a cache that
crashes its application on a read-only container layer is worse than none.

With a remote (`remote="redis://..."` or `WARMENV_REMOTE`) every storage the
environment hands out is the local one with the fleet's shared tier behind it
(`persistence/remote.py`); stores, statistics and the CLI see no difference.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
import warnings
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, final

import anyio.to_thread

from warmenv._errors import ClosedError, WarmenvWarning
from warmenv.config import is_valid_name, load_config
from warmenv.persistence.codec import Codec
from warmenv.persistence.explain import Explanation, explain_database, explain_memory
from warmenv.persistence.memory import MemoryStorage, MemoryTable
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.remote import RemoteSettings, RemoteStorage, RemoteTier, remote_settings
from warmenv.persistence.sqlite import CopiedBatch, SqliteDatabase, SqliteStorage, open_database
from warmenv.persistence.storage import NamespaceSummary, Storage
from warmenv.persistence.store import CacheMode, Store
from warmenv.stream import adopt_config, policy_chosen

__all__ = ["Environment", "activate", "active", "open_environment", "set_root"]

log = logging.getLogger("warmenv.environment")
K = TypeVar("K")
V = TypeVar("V")

_defaults_lock = threading.Lock()
_active_name: str | None = None
_active_root: Path | None = None


def check_name(name: object) -> str:
    """`name` if it may name an environment, else `ValueError` saying what may."""
    if not is_valid_name(name):
        raise ValueError(
            f"invalid environment name {name!r}: use letters, digits, '.', '_' and '-' "
            "(and not '.' or '..')"
        )
    assert isinstance(name, str)
    return name


def activate(name: str) -> None:
    """Make `name` the environment `open_environment()` opens by default."""
    global _active_name
    with _defaults_lock:
        _active_name = check_name(name)


def set_root(path: str | Path) -> None:
    """Make `path` the directory `open_environment()` looks in by default."""
    global _active_root
    with _defaults_lock:
        _active_root = Path(path).expanduser()


def active() -> tuple[str, Path]:
    """The default `(name, root)`: set by `activate`/`set_root`, else configured."""
    with _defaults_lock:
        name, root = _active_name, _active_root
    if name is None or root is None:
        config = load_config()
        name = config.environment if name is None else name
        root = config.root if root is None else root
    return name, root


@final
class Environment:
    """An open environment: hands out storages and stores for its namespaces."""

    __slots__ = ("_closed", "_db", "_memory", "_remote", "name", "path")

    def __init__(
        self,
        name: str,
        path: Path,
        db: SqliteDatabase | None,
        memory: MemoryTable | None,
        remote: RemoteTier | None = None,
    ) -> None:
        self.name = name
        self.path = path
        self._db = db
        self._memory = memory
        self._remote = remote
        self._closed = False

    @property
    def remote(self) -> RemoteTier | None:
        """The fleet's shared tier behind every storage, or `None` (local only)."""
        return self._remote

    @property
    def in_memory(self) -> bool:
        """Whether this environment degraded to memory (nothing persists)."""
        return self._db is None

    @property
    def read_only(self) -> bool:
        """Whether writes fail because the database could only be opened read-only."""
        return self._db is not None and self._db.read_only

    @property
    def database(self) -> SqliteDatabase | None:
        """The open database, or `None` for an in-memory environment."""
        self._check_open()
        return self._db

    def storage(self, namespace: Namespace | str) -> Storage:
        """The storage of one namespace (a `Namespace`, or a full string verbatim)."""
        self._check_open()
        ns = Namespace.coerce(namespace)
        local: Storage
        if self._db is not None:
            local = SqliteStorage(self._db, ns)
        else:
            local = MemoryStorage(ns, table=self._memory)
        if self._remote is not None:
            return RemoteStorage(local, self._remote)
        return local

    async def store(
        self,
        namespace: Namespace | str,
        codec: Codec[K, V] | None = None,
        mode: CacheMode = CacheMode.EAGER,
    ) -> Store[K, V]:
        """A typed `Store` over one namespace."""
        return await Store.open(self.storage(namespace), codec, mode)

    def bulk_copy(
        self, file: Path, prefixes: list[str] | None, batch_size: int
    ) -> AsyncGenerator[CopiedBatch, None] | None:
        """Batches copying the entry file `file` in as IMPORTED, or `None` if not possible here.

        Only a file no other process can change may be passed (an import's
        private, verified copy): it is read by path.
        """
        self._check_open()
        if self._db is None:
            return None
        return self._db.copy_from(file, prefixes, batch_size)

    def snapshot_directory(self) -> Path | None:
        """Where an import's private copy of a bundle should go (`None`: the temp directory)."""
        self._check_open()
        if self._db is None or self._db.read_only:
            return None
        return self.path.parent

    async def namespaces(self) -> list[NamespaceSummary]:
        """Every namespace holding entries, with counts and sizes."""
        self._check_open()
        if self._db is not None:
            return await self._db.namespaces()
        assert self._memory is not None
        return self._memory.summaries()

    async def explain(
        self, namespace: Namespace | str, key: bytes | str | None = None
    ) -> Explanation:
        """Why a lookup of `namespace` (and `key`) misses: the namespaces nearby, nearest first.

        A `str` key is one of a store of the default codec (`JsonCodec`);
        pass `bytes` to ask about a key exactly as stored.
        """
        self._check_open()
        if self._db is not None:
            return await explain_database(self._db, namespace, key)
        assert self._memory is not None
        return await explain_memory(self._memory.summaries(), self.storage, namespace, key)

    async def close(self) -> None:
        """Close the database; the environment and its storages are unusable after."""
        if self._closed:
            return
        if self._db is not None:
            # Closed first: a close refused (from another event loop) can be retried.
            await self._db.close()
        self._closed = True

    def describe(self) -> str:
        """The environment's name and file, and whether it is in memory or read-only."""
        mode = " (in memory)" if self.in_memory else " (read-only)" if self.read_only else ""
        shared = f", shared through {self._remote.describe()}" if self._remote else ""
        return f"environment {self.name!r} at {self.path}{mode}{shared}"

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self.describe()} is closed; open it again to use it")

    async def __aenter__(self) -> Environment:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


@asynccontextmanager
async def open_environment(
    name: str | None = None,
    *,
    root: str | Path | None = None,
    file: str | Path | None = None,
    create: bool = True,
    remote: str | RemoteSettings | None = None,
) -> AsyncIterator[Environment]:
    """Open an environment for the duration of the block.

    `name` and `root` default to `active()`; `file` opens that database file
    instead of `<root>/<name>.db`. With `create=False` an environment that
    does not exist yet raises `FileNotFoundError` and nothing is created (for
    callers that only read, such as `warmenv ls`).

    `remote` is a `redis://` or `rediss://` URL (or `RemoteSettings` to tune
    timeouts and caps) for the fleet's shared tier; `None` reads the variable
    `WARMENV_REMOTE`, and `""` turns the tier off. Redis being down never
    fails the open: the tier connects on first use and falls back to local.
    """
    settings = remote_settings(remote)
    async with AsyncExitStack() as stack:
        env = await _open(name, root, file, create=create)
        stack.push_async_callback(env.close)
        if settings is not None:
            env._remote = await stack.enter_async_context(RemoteTier.connect(settings, env.name))
        yield env


def _locate(name: str | None, root: str | Path | None, file: str | Path | None) -> tuple[str, Path]:
    """The environment's name and database path, and its directory created."""
    if file is not None:
        path = Path(file).expanduser()
        env_name = check_name(name) if name is not None else path.stem
    else:
        if name is not None:
            check_name(name)
        if name is None or root is None:
            default_name, default_root = active()
            name = default_name if name is None else name
            root = default_root if root is None else root
        path = Path(root).expanduser() / f"{name}.db"
        env_name = name
    return env_name, path


async def _open(
    name: str | None, root: str | Path | None, file: str | Path | None, *, create: bool = True
) -> Environment:
    env_name, path = _locate(name, root, file)
    if not create and not await anyio.to_thread.run_sync(path.is_file):
        raise FileNotFoundError(
            errno.ENOENT, f"no environment {env_name!r} (no file {path})", str(path)
        )
    if not policy_chosen():  # the configured stream_policy, unless code chose one
        adopt_config(await anyio.to_thread.run_sync(load_config))
    try:
        if create:
            await anyio.to_thread.run_sync(partial(path.parent.mkdir, parents=True, exist_ok=True))
        db = await open_database(path, create=create)
    except (OSError, sqlite3.Error) as exc:
        warnings.warn(
            f"environment {env_name!r}: cannot use {path} ({exc}); "
            "keeping its entries in memory for this process only",
            WarmenvWarning,
            stacklevel=4,
        )
        return Environment(env_name, path, None, MemoryTable())
    if db.read_only:
        log.warning("%s opened read-only: reads are served, writes will fail", path)
    return Environment(env_name, path, db, None)
