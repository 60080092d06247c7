"""Environments for synchronous code: the async `Environment`, reached across one thread hop.

A `BlockingEnvironment` holds an open `Environment` that lives on
warmenv.blocking's loop thread and calls each of its methods there (the
crossing of `warmenv.blocking._loop`), so the two cannot differ in what they
do: only in how they are waited for. Its stores answer hits on the caller's
thread (`warmenv.blocking._store`).
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, final, overload

import attrs

from warmenv._errors import ClosedError
from warmenv._faces import SyncOnly
from warmenv.blocking._loop import Held, LoopThread, refuse_event_loop_thread, shared_loop
from warmenv.blocking._store import BlockingStore
from warmenv.environment import Degraded, Environment
from warmenv.environment import open_environment as _open_async
from warmenv.persistence.codec import Codec
from warmenv.persistence.explain import Explanation
from warmenv.persistence.hot import DEFAULT_HOT_BYTES
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.statistics import EnvironmentStatistics
from warmenv.persistence.storage import Failed, NamespaceSummary, Purged
from warmenv.persistence.store import CacheMode, Store

if TYPE_CHECKING:
    from warmenv.remote import RemoteTier

__all__ = ["BlockingEnvironment", "open", "open_environment"]

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:
    from typing_extensions import TypeVar

P = ParamSpec("P")
R = TypeVar("R")
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)


@attrs.define
class _Lifetime:
    """Whether the environment has been closed."""

    closed: bool = False


def _parameters_of(
    opener: Callable[P, object],
) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """Give the decorated function `opener`'s parameters: one definition of them, checked
    by mypy at every call, at run time on the call (a wrong keyword raises `TypeError`
    there, not later), and shown by `inspect.signature` and `help()`."""
    parameters = inspect.signature(opener)

    def decorate(function: Callable[..., R]) -> Callable[P, R]:
        @functools.wraps(function)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                parameters.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{function.__name__}() {exc}") from None
            return function(*args, **kwargs)

        returns = inspect.signature(function).return_annotation
        checked.__signature__ = parameters.replace(  # type: ignore[attr-defined]
            return_annotation=returns
        )
        return checked

    return decorate


@_parameters_of(_open_async)
def open(*args: Any, **kwargs: Any) -> BlockingEnvironment:  # as sqlite3's is connect
    """Open an environment from synchronous code, without a `with` block.

    Its parameters are `warmenv.open_environment`'s (the one definition of
    them): `remote` names the fleet's shared tier (`None`: the configured
    one; `""`: none), and with one, `get_or_compute` runs one computation
    per key across the fleet. The environment may be shared by any number
    of threads. It stays open until `close()`, the end of a `with` block
    around it, its collection (the last reference to it and its stores
    dropped), or interpreter exit, whichever comes first, as a connection of
    the sqlite3 module does.
    """
    refuse_event_loop_thread("open()")
    loop = shared_loop()
    return BlockingEnvironment(loop.hold(_open_async(*args, **kwargs)), loop)


@_parameters_of(open)
def open_environment(*args: Any, **kwargs: Any) -> _Opening:
    """Open an environment for the duration of a `with` block, from synchronous code.

    Arguments as for `open` (its parameters, the one definition of them);
    the environment opens on entering the block and is closed (on the loop
    thread) when it exits. `open_environment(...).__enter__()` keeps it open
    as `open(...)` does: the environment owns itself, not the context manager.
    """
    return _Opening(functools.partial(open, *args, **kwargs))


@final
class _Opening(SyncOnly):
    """What `open_environment` returns: opens on `__enter__`, closes on `__exit__`."""

    __slots__ = ("_env", "_open")

    def __init__(self, opening: Callable[[], BlockingEnvironment]) -> None:
        self._open = opening
        self._env: BlockingEnvironment | None = None

    def __enter__(self) -> BlockingEnvironment:
        refuse_event_loop_thread("open_environment()")
        self._env = self._open()
        return self._env

    def __exit__(self, *exc_info: object) -> None:
        env, self._env = self._env, None
        if env is not None:
            env.__exit__(*exc_info)


@final
class BlockingEnvironment(SyncOnly):
    """An open environment for synchronous code; see `warmenv.Environment`.

    A context manager closing it at the end of the block; `close()` closes it
    too, and so does its collection or interpreter exit, if nothing did before.
    """

    __slots__ = ("__weakref__", "_env", "_finalizer", "_held", "_lifetime", "_loop")

    def __init__(self, held: Held[Environment], loop: LoopThread) -> None:
        self._env = held.value
        self._held = held
        self._loop = loop
        self._lifetime = _Lifetime()
        # Collected unclosed: tell the loop to close it (a finaliser may run on
        # any thread, so it does not wait). At exit the loop closes it, waiting.
        self._finalizer = weakref.finalize(self, held.release, wait=False)
        self._finalizer.atexit = False

    def __enter__(self) -> BlockingEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close(exc_info)

    def close(self) -> None:
        """Close the environment (on the loop thread), waiting until it is closed.

        Its stores raise `ClosedError` afterwards. Closing again does nothing.
        """
        self._close((None, None, None))

    def _close(self, exc_info: tuple[Any, ...]) -> None:
        refuse_event_loop_thread("BlockingEnvironment.close()")
        self._lifetime.closed = True
        self._finalizer.detach()
        self._held.release((exc_info[0], exc_info[1], exc_info[2]), wait=True)

    @property
    def environment(self) -> Environment:
        """The async environment underneath (usable only on the loop thread)."""
        return self._env

    @property
    def name(self) -> str:
        return self._env.name

    @property
    def path(self) -> Path:
        return self._env.path

    @property
    def in_memory(self) -> bool:
        """Whether this environment degraded to memory (nothing persists)."""
        return self._env.in_memory

    @property
    def remote(self) -> RemoteTier | None:
        """The fleet's shared tier behind every storage, or `None` (local only)."""
        return self._env.remote

    @property
    def read_only(self) -> bool:
        """Whether writes fail because the database could only be opened read-only."""
        return self._env.read_only

    @property
    def degraded(self) -> Degraded | None:
        """Why this environment is not its file opened read-write (`Environment.degraded`)."""
        return self._env.degraded

    @property
    def max_bytes(self) -> int | None:
        """The bound `gc()` (and close) evicts entries down to; `None`: unbounded."""
        return self._env.max_bytes

    def describe(self) -> str:
        return self._env.describe()

    def __repr__(self) -> str:
        closed = ", closed" if self._lifetime.closed else ""
        return f"<BlockingEnvironment: {self._env.describe()}{closed}>"

    @overload
    def store(
        self,
        namespace: Namespace | str,
        codec: None = None,
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | timedelta | None = None,
    ) -> BlockingStore[Any, Any]: ...
    @overload
    def store(
        self,
        namespace: Namespace | str,
        codec: Codec[K, V],
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | timedelta | None = None,
    ) -> BlockingStore[K, V]: ...
    def store(
        self,
        namespace: Namespace | str,
        codec: Codec[Any, Any] | None = None,
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
        ttl: float | timedelta | None = None,
    ) -> BlockingStore[Any, Any]:
        """A store over one namespace (an `EAGER` one loads it now).

        Without a codec it is a `JsonCodec` store whose types the annotation
        gives: `store: BlockingStore[str, int] = env.store(ns)`. `max_entries`
        and `hot_bytes` bound its memory, and `ttl` how old a hit may be, as
        for `Store.open`.
        """
        refuse_event_loop_thread("BlockingEnvironment.store()")
        self._check_open()
        opening = functools.partial(
            self._env.store,
            namespace,
            codec,
            mode,
            max_entries=max_entries,
            hot_bytes=hot_bytes,
            ttl=ttl,
        )
        store: Store[Any, Any] = self._loop.call(opening)
        return BlockingStore(store, self._loop, owner=self)

    def namespaces(self) -> list[NamespaceSummary]:
        """Every namespace holding entries, with counts and sizes."""
        refuse_event_loop_thread("BlockingEnvironment.namespaces()")
        self._check_open()
        return self._loop.call(self._env.namespaces)

    def statistics(self) -> EnvironmentStatistics:
        """Every namespace's and imported bundle's counts; see `Environment.statistics`.

        Hits answered on any thread are included, flushed or not.
        """
        refuse_event_loop_thread("BlockingEnvironment.statistics()")
        self._check_open()
        return self._loop.call(self._env.statistics)

    def explain(self, namespace: Namespace | str, key: bytes | str | None = None) -> Explanation:
        """Why a lookup of `namespace` (and `key`) misses; see `Environment.explain`."""
        refuse_event_loop_thread("BlockingEnvironment.explain()")
        self._check_open()
        return self._loop.call(self._env.explain, namespace, key)

    def gc(
        self,
        *,
        max_bytes: int | None = None,
        older_than: float | timedelta | None = None,
        keep_versions: int | None = None,
    ) -> Purged | Failed:
        """Evict old versions, entries unused for a while, then by size; see `Environment.gc`."""
        refuse_event_loop_thread("BlockingEnvironment.gc()")
        self._check_open()
        collecting = functools.partial(
            self._env.gc, max_bytes=max_bytes, older_than=older_than, keep_versions=keep_versions
        )
        return self._loop.call(collecting)

    def purge_bundle(self, digest_or_name: str) -> Purged | Failed:
        """Remove the entries one bundle imported; see `Environment.purge_bundle`."""
        refuse_event_loop_thread("BlockingEnvironment.purge_bundle()")
        self._check_open()
        return self._loop.call(self._env.purge_bundle, digest_or_name)

    def vacuum(self, *, wait: float = 30.0) -> tuple[int, int]:
        """Give freed space back to the file system; see `Environment.vacuum`."""
        refuse_event_loop_thread("BlockingEnvironment.vacuum()")
        self._check_open()
        return self._loop.call(functools.partial(self._env.vacuum, wait=wait))

    def opened(self) -> Environment:
        """The async environment underneath, or `ClosedError` once this one is closed.

        For warmenv.blocking's own functions (`import_bundle`, `export_bundle`).
        """
        self._check_open()
        return self._env

    def _check_open(self) -> None:
        if self._lifetime.closed:
            raise ClosedError(f"{self._env.describe()} is closed; open it again to use it")
