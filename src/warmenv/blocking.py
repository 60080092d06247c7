"""warmenv from synchronous code: scripts, notebooks, thread pools, WSGI workers.

Every blocking environment in a process is served by one event-loop thread
(started on first use, a daemon, stopped at interpreter exit), so a sync
caller pays a thread hop only when there is I/O to wait for, never an event
loop per call. A hit is answered on the caller's own thread from the store's
memory (`Store.get_nowait`), as cheap as a dict lookup. A miss reads the
environment file on the caller's thread too, with a read-only connection of
its own (WAL readers never wait for the writer); only what that cannot
answer (a key the file does not hold, a shared tier, an environment in
memory) crosses to the loop thread and waits there.

`get_or_compute` runs the computation on the caller's thread: it is the
application's plain function, free to block, and running it on the loop
thread would stall every other thread's misses behind it. Threads asking
for a key that is being computed wait for that run and share its outcome,
its value (each thread gets its own copy) or its exception. This is single
flight within one `BlockingStore` in one process, as for the async `Store`.

Calling into this module from a thread that runs an event loop raises
`EventLoopThreadError`: blocking there would stall that loop (or deadlock
it), and the async API is the one to use.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import inspect
import os
import queue
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVarTuple, final, overload

import anyio
import attrs
from anyio.from_thread import BlockingPortal

from warmenv._errors import ClosedError, WarmenvError
from warmenv.bundle.events import Event, ExportReport, ImportReport
from warmenv.bundle.exporting import BundleFormat, exporting
from warmenv.bundle.importing import Validate, importing
from warmenv.bundle.manifest import EnvironmentInfo
from warmenv.environment import Environment
from warmenv.environment import open_environment as _open_async
from warmenv.persistence.codec import BytesCodec, Codec, JsonCodec, canonical_arguments
from warmenv.persistence.explain import Explanation
from warmenv.persistence.hot import Hot, copied
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.statistics import EnvironmentStatistics
from warmenv.persistence.storage import Failed as _Failed
from warmenv.persistence.storage import Insertion, NamespaceSummary, Purged
from warmenv.persistence.store import _ABSENT, _IMMUTABLE, DEFAULT_HOT_BYTES, CacheMode, Store
from warmenv.remote import RemoteSettings, RemoteTier

__all__ = [
    "BlockingEnvironment",
    "BlockingStore",
    "EventLoopThreadError",
    "export_bundle",
    "import_bundle",
    "open_environment",
]

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:
    from typing_extensions import TypeVar

# As for `Store`: `store = env.store(ns)` is a BlockingStore[Any, Any].
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
D = TypeVar("D")
R = TypeVar("R")
P = ParamSpec("P")
Ts = TypeVarTuple("Ts")


class EventLoopThreadError(WarmenvError, RuntimeError):
    """warmenv.blocking was called on a thread running an event loop."""


# --- where we are ------------------------------------------------------------

_running_asyncio_loop = asyncio._get_running_loop


class _NoSniffio:
    name: str | None = None


try:
    import sniffio

    # trio (>= 0.23) names itself here while it runs on this thread; a plain
    # attribute read, where trio's own in_trio_run() raises and catches.
    _sniffio_local: Any = sniffio.thread_local  # sniffio >= 1.3
except (ImportError, AttributeError):  # no sniffio, so no trio; or a trio too old to use it
    _sniffio_local = _NoSniffio()


def _on_event_loop_thread() -> bool:
    """Whether asyncio or (a current) trio runs on this thread: the hit path's check."""
    return _running_asyncio_loop() is not None or _sniffio_local.name is not None


def _in_trio_run() -> bool:
    if _sniffio_local.name is not None:
        return True
    trio = sys.modules.get("trio")
    if trio is None or hasattr(trio.lowlevel, "in_trio_run"):
        return False
    try:  # a trio too old to say so through sniffio
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _refuse_event_loop_thread(what: str) -> None:
    # Checked on every call, hits included: a hit would work, but the same
    # line would block (or deadlock) the loop on its first miss. (A hit checks
    # asyncio and sniffio's name only; a trio older than 0.23, which does not
    # name itself there, is caught at the first miss instead.)
    if _running_asyncio_loop() is not None or _in_trio_run():
        raise EventLoopThreadError(
            f"warmenv.blocking {what} was called on a thread running an event loop, where"
            " waiting would block that loop; use the async API (warmenv.open_environment,"
            " await store.get(...)) there"
        )


# --- the one event-loop thread -------------------------------------------------


@final
class _LoopThread:
    """An event loop on a daemon thread, reached through a blocking portal."""

    def __init__(self) -> None:
        ready: concurrent.futures.Future[tuple[BlockingPortal, asyncio.AbstractEventLoop]] = (
            concurrent.futures.Future()
        )
        self.thread = threading.Thread(
            target=self._main, args=(ready,), name="warmenv-blocking-loop", daemon=True
        )
        self.thread.start()
        self.portal, self.loop = ready.result()

    @staticmethod
    def _main(
        ready: concurrent.futures.Future[tuple[BlockingPortal, asyncio.AbstractEventLoop]],
    ) -> None:
        loops: list[object] = []

        async def serve() -> None:
            loop = asyncio.get_running_loop()
            loops.append(loop)
            async with BlockingPortal() as portal:
                ready.set_result((portal, loop))
                await portal.sleep_until_stopped()

        try:
            anyio.run(serve)
        except BaseException as exc:  # reported to the thread that started the loop
            if not ready.done():
                ready.set_exception(exc)
            else:
                raise
        finally:
            # anyio tells its worker threads to stop when the loop ends but does
            # not wait for them; wait, so none outlives the loop thread.
            for thread in threading.enumerate():
                if loops and getattr(thread, "loop", None) is loops[0]:
                    thread.join(timeout=10)

    def call(self, fn: Callable[[*Ts], Coroutine[Any, Any, R]], *args: *Ts) -> R:
        """`await fn(*args)` in a task on the loop, waiting for it on this thread.

        What `portal.call` does, at half its cost: this is every miss's round
        trip. The loop is always asyncio's (the thread is ours), and anyio code
        runs in any asyncio task.
        """
        done = threading.Lock()
        done.acquire()
        tasks: list[asyncio.Task[R]] = []

        def start() -> None:
            task = self.loop.create_task(fn(*args))
            tasks.append(task)
            task.add_done_callback(lambda _: done.release())

        try:
            self.loop.call_soon_threadsafe(start)
        except RuntimeError:
            raise ClosedError("warmenv.blocking's event-loop thread has stopped") from None
        try:
            done.acquire()
        except BaseException:  # interrupted: the task is ours to cancel and wait for
            self.loop.call_soon_threadsafe(lambda: tasks[0].cancel())
            done.acquire()
            raise
        return tasks[0].result()

    def stop(self) -> None:
        """Cancel what still runs, end the loop (and its worker threads), join the thread."""
        try:
            self.portal.call(self.portal.stop, True)
        except RuntimeError:
            pass  # already stopped
        self.thread.join(timeout=10)


_loop_lock = threading.Lock()
_loop: _LoopThread | None = None


def _shared_loop() -> _LoopThread:
    loop = _loop
    return _start_loop() if loop is None else loop


def _start_loop() -> _LoopThread:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = _LoopThread()
            atexit.register(_stop_loop)
        return _loop


def _stop_loop() -> None:
    global _loop
    with _loop_lock:
        loop, _loop = _loop, None
    if loop is not None:
        loop.stop()


def _forget_loop_after_fork() -> None:
    # The child has the parent's memory but not its threads: start afresh.
    global _loop, _loop_lock
    _loop = None
    _loop_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_loop_after_fork)


# --- environments ---------------------------------------------------------------


@contextmanager
def open_environment(
    name: str | None = None,
    *,
    root: str | Path | None = None,
    file: str | Path | None = None,
    create: bool = True,
    max_bytes: int | None = None,
    remote: str | RemoteSettings | None = None,
    statistics: bool = True,
) -> Iterator[BlockingEnvironment]:
    """Open an environment for the duration of the block, from synchronous code.

    Arguments as for `warmenv.open_environment`: `remote` names the fleet's
    shared tier (`None`: the configured one; `""`: none), and with one,
    `get_or_compute` runs one computation per key across the fleet. The
    environment may be shared by any number of threads; it is closed (on
    the loop thread) when the block exits.
    """
    _refuse_event_loop_thread("open_environment()")
    loop = _shared_loop()
    opening = _open_async(
        name,
        root=root,
        file=file,
        create=create,
        max_bytes=max_bytes,
        remote=remote,
        statistics=statistics,
    )
    with loop.portal.wrap_async_context_manager(opening) as env:
        blocking = BlockingEnvironment(env, loop)
        try:
            yield blocking
        finally:
            blocking._closed = True


@final
class BlockingEnvironment:
    """An open environment for synchronous code; see `warmenv.Environment`."""

    __slots__ = ("_closed", "_env", "_loop")

    def __init__(self, env: Environment, loop: _LoopThread) -> None:
        self._env = env
        self._loop = loop
        self._closed = False

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
    def max_bytes(self) -> int | None:
        """The bound `gc()` (and close) evicts entries down to; `None`: unbounded."""
        return self._env.max_bytes

    def describe(self) -> str:
        return self._env.describe()

    @overload
    def store(
        self,
        namespace: Namespace | str,
        codec: None = None,
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
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
    ) -> BlockingStore[K, V]: ...
    def store(
        self,
        namespace: Namespace | str,
        codec: Codec[Any, Any] | None = None,
        mode: CacheMode = CacheMode.EAGER,
        *,
        max_entries: int | None = None,
        hot_bytes: int = DEFAULT_HOT_BYTES,
    ) -> BlockingStore[Any, Any]:
        """A store over one namespace (an `EAGER` one loads it now).

        Without a codec it is a `JsonCodec` store whose types the annotation
        gives: `store: BlockingStore[str, int] = env.store(ns)`. `max_entries`
        and `hot_bytes` bound its memory, as for `Store.open`.
        """
        _refuse_event_loop_thread("BlockingEnvironment.store()")
        self._check_open()
        codec = JsonCodec() if codec is None else codec
        opening = functools.partial(
            self._env.store, namespace, codec, mode, max_entries=max_entries, hot_bytes=hot_bytes
        )
        store: Store[Any, Any] = self._loop.call(opening)
        return BlockingStore(store, codec, self._loop)

    def namespaces(self) -> list[NamespaceSummary]:
        """Every namespace holding entries, with counts and sizes."""
        _refuse_event_loop_thread("BlockingEnvironment.namespaces()")
        self._check_open()
        return self._loop.call(self._env.namespaces)

    def statistics(self) -> EnvironmentStatistics:
        """Every namespace's and imported bundle's counts; see `Environment.statistics`.

        Hits answered on any thread are included, flushed or not.
        """
        _refuse_event_loop_thread("BlockingEnvironment.statistics()")
        self._check_open()
        return self._loop.call(self._env.statistics)

    def explain(self, namespace: Namespace | str, key: bytes | str | None = None) -> Explanation:
        """Why a lookup of `namespace` (and `key`) misses; see `Environment.explain`."""
        _refuse_event_loop_thread("BlockingEnvironment.explain()")
        self._check_open()
        return self._loop.call(self._env.explain, namespace, key)

    def gc(
        self,
        *,
        max_bytes: int | None = None,
        older_than: float | timedelta | None = None,
        keep_versions: int | None = None,
    ) -> Purged | _Failed:
        """Evict old versions, entries unused for a while, then by size; see `Environment.gc`."""
        _refuse_event_loop_thread("BlockingEnvironment.gc()")
        self._check_open()
        collecting = functools.partial(
            self._env.gc, max_bytes=max_bytes, older_than=older_than, keep_versions=keep_versions
        )
        return self._loop.call(collecting)

    def purge_bundle(self, digest_or_name: str) -> Purged | _Failed:
        """Remove the entries one bundle imported; see `Environment.purge_bundle`."""
        _refuse_event_loop_thread("BlockingEnvironment.purge_bundle()")
        self._check_open()
        return self._loop.call(self._env.purge_bundle, digest_or_name)

    def vacuum(self) -> tuple[int, int]:
        """Give freed space back to the file system; see `Environment.vacuum`."""
        _refuse_event_loop_thread("BlockingEnvironment.vacuum()")
        self._check_open()
        return self._loop.call(self._env.vacuum)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self._env.describe()} is closed; open it again to use it")


# --- stores ----------------------------------------------------------------------


@attrs.define(eq=False)
class _Run:
    """One computation of one key, run by the thread `owner`, awaited by the others."""

    owner: int
    done: threading.Event = attrs.field(factory=threading.Event)
    error: Exception | None = None
    # Whether the run found a stored value (its waiters count hits) or computed it (misses).
    found: bool = False


@final
class BlockingStore(Generic[K, V]):
    """A `Store` for synchronous callers; hits never leave the calling thread."""

    __slots__ = (
        "_codec",
        "_decoded",
        "_get_nowait",
        "_held",
        "_hits",
        "_json",
        "_lock",
        "_loop",
        "_lru",
        "_memoized",
        "_read_here",
        "_runs",
        "_store",
        "_unpack",
    )

    def __init__(self, store: Store[K, V], codec: Codec[K, V], loop: _LoopThread) -> None:
        self._store = store
        self._get_nowait = store.get_nowait
        # The store's memory, for hits answered here without a call into the
        # store (a hit is one check and one lookup: see `get`). The same
        # objects for the store's life: it clears them, never replaces them.
        self._held = store._values
        # The store's hit counts: a list, appended to from any thread (atomic).
        self._hits = store._hits
        self._lru = store._lru
        self._json = store._json
        self._unpack = store._unpack
        self._decoded = store._decoded
        self._read_here = store._read_here
        self._codec = codec
        self._loop = loop
        self._lock = threading.Lock()
        self._runs: dict[bytes, _Run] = {}
        self._memoized: str | None = None

    @property
    def store(self) -> Store[K, V]:
        """The async store underneath (usable only on the loop thread)."""
        return self._store

    @property
    def mode(self) -> CacheMode:
        return self._store.mode

    @property
    def max_entries(self) -> int | None:
        """The most values held in memory, or `None` for no bound."""
        return self._store.max_entries

    @property
    def hot_bytes(self) -> int:
        """The most memory held by decoded copies of hot values (0 for a non-JSON codec)."""
        return self._store.hot_bytes

    def __len__(self) -> int:
        """Values held in memory."""
        return len(self._store)

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: Any = None) -> Any:
        """The value for `key`, or `default`; a miss reads the storage on this thread.

        Only what the environment file cannot answer here goes to the loop thread.
        """
        # Store.get_nowait, inlined with a short loop check: this is the hit path.
        if _running_asyncio_loop() is not None or _sniffio_local.name is not None:
            _refuse_event_loop_thread("get()")
        memo: Any = key if type(key) is str and self._json else self._store._memo_of(key)
        held: Any = self._held.get(memo, _ABSENT)
        if held is _ABSENT:
            _refuse_event_loop_thread("get()")  # the full check, for a trio older than 0.23
            found = self._read_here(memo, self._store._encode_key(key))
            if found is not _ABSENT:
                return found
            return self._loop.call(self._store.get, key, default)
        if self._lru is not None:
            try:
                self._lru.move_to_end(memo)
            except KeyError:
                pass  # evicted by another thread just now: still a hit
        if self._hits is not None:
            self._hits.append(memo)
        kind = type(held)
        if kind in _IMMUTABLE:
            return held
        if kind is bytes:
            return self._decoded(memo, held)
        if kind is Hot:
            value = held.value.copy()  # Hot.copy, inlined: two calls are a third of this hit
            for inner_key in held.flat:
                value[inner_key] = value[inner_key].copy()
            for inner_key, inner in held.deep:
                value[inner_key] = copied(value[inner_key], inner)
            return value
        return self._unpack(held)

    def insert(self, key: K, value: V) -> Insertion:
        """Store `value`; see `Store.insert`."""
        _refuse_event_loop_thread("insert()")
        return self._loop.call(self._store.insert, key, value)

    def get_or_compute(self, key: K, fn: Callable[[*Ts], V], *args: *Ts) -> V:
        """The stored value, or `fn(*args)` run once, on this thread, for every concurrent asker.

        Threads that ask while a run is in progress wait for it: they get the
        value it stored (each its own copy) or the exception it raised, and
        the next call starts a new run. If the storage already holds a value
        from another process, that value wins and is returned.
        """
        if _on_event_loop_thread():
            _refuse_event_loop_thread("get_or_compute()")
        memo: Any = key if type(key) is str and self._json else self._store._memo_of(key)
        held: Any = self._held.get(memo, _ABSENT)
        if held is _ABSENT:
            _refuse_event_loop_thread("get_or_compute()")
            return self._compute(key, self._codec.encode_key(key), fn, args)
        if self._lru is not None:
            try:
                self._lru.move_to_end(memo)
            except KeyError:
                pass
        if self._hits is not None:
            self._hits.append(memo)
        kind = type(held)
        if kind in _IMMUTABLE:
            return held  # type: ignore[no-any-return]
        if kind is bytes:
            return self._decoded(memo, held)  # type: ignore[no-any-return]
        if kind is Hot:
            value = held.value.copy()  # Hot.copy, inlined, as in `get`
            for inner_key in held.flat:
                value[inner_key] = value[inner_key].copy()
            for inner_key, inner in held.deep:
                value[inner_key] = copied(value[inner_key], inner)
            return value  # type: ignore[no-any-return]
        return self._unpack(held)  # type: ignore[no-any-return]

    @overload
    def memoize(self, fn: Callable[P, V], /) -> Callable[P, V]: ...
    @overload
    def memoize(self, *, key: Callable[P, K]) -> Callable[[Callable[P, V]], Callable[P, V]]: ...
    def memoize(self, fn: Any = None, *, key: Any = None) -> Any:
        """Decorate a plain function so its calls go through `get_or_compute`.

        Keys as for `Store.memoize`: the JSON list of the call's arguments,
        defaults applied (so `store.get([1, 2])` reads what `f(1, 2)` stored,
        and an async `Store.memoize` of the same namespace shares the entries),
        or `key(*args, **kwargs)`.
        """

        def decorate(fn: Callable[..., V]) -> Callable[..., V]:
            name = getattr(fn, "__qualname__", repr(fn))
            signature = None
            if key is None:
                if not isinstance(self._codec, JsonCodec | BytesCodec):
                    raise TypeError(
                        f"{self._store.storage.describe()} uses {type(self._codec).__name__},"
                        f" which cannot encode {name}()'s arguments; pass key= to memoize()"
                    )
                if self._memoized not in (None, name):
                    raise ValueError(
                        f"{self._store.storage.describe()} already memoizes {self._memoized}();"
                        f" give {name}() its own namespace, or pass key= to tell their keys apart"
                    )
                self._memoized = name
                signature = inspect.signature(fn)
            as_bytes = isinstance(self._codec, BytesCodec)

            @functools.wraps(fn)
            def memoized(*args: Any, **kwargs: Any) -> V:
                _refuse_event_loop_thread(f"{name}() (memoized)")
                if signature is None:
                    k = key(*args, **kwargs)
                else:
                    bound = signature.bind(*args, **kwargs)
                    bound.apply_defaults()
                    if as_bytes:
                        k = canonical_arguments(bound.arguments, f"{name}()")
                    else:
                        # Encodes as canonical_arguments does; an unencodable
                        # argument is reported by name below.
                        k = list(bound.arguments.values())
                try:
                    return self._get_nowait(k)
                except anyio.WouldBlock:
                    pass
                except TypeError:
                    if signature is not None:
                        canonical_arguments(bound.arguments, f"{name}()")
                    raise
                call = functools.partial(fn, *args, **kwargs)
                return self._compute(k, self._codec.encode_key(k), call, ())

            return memoized

        return decorate if fn is None else decorate(fn)

    def purge_key(self, key: K) -> Purged | _Failed:
        """Forget one key here and delete it from the storage."""
        _refuse_event_loop_thread("purge_key()")
        return self._loop.call(self._store.purge_key, key)

    def purge(self) -> Purged | _Failed:
        """Forget everything here and delete the namespace from the storage."""
        _refuse_event_loop_thread("purge()")
        return self._loop.call(self._store.purge)

    def _compute(self, key: K, encoded: bytes, fn: Callable[..., V], args: tuple[Any, ...]) -> V:
        me = threading.get_ident()
        while True:
            with self._lock:
                run = self._runs.get(encoded)
                leading = run is None
                if run is None:
                    run = self._runs[encoded] = _Run(me)
            if leading:
                return self._lead(run, key, encoded, fn, args)
            if run.owner == me:
                raise WarmenvError(
                    f"{getattr(fn, '__qualname__', fn)!s} asked {self._store.storage.describe()}"
                    f" for {key!r} while computing that very key; it would wait for itself"
                )
            run.done.wait()
            if run.error is not None:
                raise run.error
            if run.found:
                try:
                    return self._get_nowait(key)  # the value the run left, a copy of our own
                except anyio.WouldBlock:
                    continue  # already dropped again: this thread asks anew
            memo = self._store._memo_of(key)
            held = self._held.get(memo, _ABSENT)
            if held is _ABSENT:
                continue  # abandoned, or already dropped again: this thread runs it
            # Computed for this thread too: a miss, counted where counts change.
            try:
                self._loop.loop.call_soon_threadsafe(self._store._missed)
            except RuntimeError:
                raise ClosedError("warmenv.blocking's event-loop thread has stopped") from None
            return self._store._handout(memo, held)

    def _lead(
        self, run: _Run, key: K, encoded: bytes, fn: Callable[..., V], args: tuple[Any, ...]
    ) -> V:
        try:
            found = self._read_here(self._store._memo(encoded), encoded)
            if found is not _ABSENT:
                run.found = True
                return found  # type: ignore[no-any-return]
            return self._through_the_store(run, key, fn, args)
        except Exception as exc:
            run.error = exc
            raise
        finally:
            # A BaseException (KeyboardInterrupt) leaves no error: a waiter runs it anew.
            with self._lock:
                if self._runs.get(encoded) is run:
                    del self._runs[encoded]
            run.done.set()

    def _through_the_store(
        self, run: _Run, key: K, fn: Callable[..., V], args: tuple[Any, ...]
    ) -> V:
        """`Store.get_or_compute` on the loop thread, with `fn` run on this thread.

        The store decides whether to compute, as for an async caller: after
        reading through (a value another process or host stored is returned)
        and, with a remote, holding the fleet's lease on the key, so that one
        host computes it. When it does, it hands the computation back here
        and waits: `fn` is the application's plain function and may block,
        and the store times it (`cost`) and counts it as for an async `fn`.
        """
        loop = self._loop
        # What the loop thread asks of this one: compute (set the event when
        # done), or None once the store's call has ended.
        asks: queue.SimpleQueue[anyio.Event | None] = queue.SimpleQueue()
        outcome: list[Any] = []  # fn's value, or the exception it raised
        tasks: list[asyncio.Task[V]] = []

        async def computed_here() -> V:
            asked = anyio.Event()
            asks.put(asked)
            await asked.wait()
            if isinstance(outcome[0], _Raised):
                raise outcome[0].error
            return outcome[0]  # type: ignore[no-any-return]

        def start() -> None:
            task = loop.loop.create_task(self._store.get_or_compute(key, computed_here))
            tasks.append(task)
            task.add_done_callback(lambda _: asks.put(None))

        try:
            loop.loop.call_soon_threadsafe(start)
        except RuntimeError:
            raise ClosedError("warmenv.blocking's event-loop thread has stopped") from None
        try:
            while (asked := asks.get()) is not None:
                try:
                    outcome.append(fn(*args))
                except Exception as exc:  # raised by the store's call, as an async fn's is
                    outcome.append(_Raised(exc))
                loop.loop.call_soon_threadsafe(asked.set)
        except BaseException:
            # Interrupted (in fn, or waiting): the store's call is cancelled (its
            # lease released) and waited for; then the interruption goes on.
            loop.loop.call_soon_threadsafe(lambda: tasks[0].cancel())
            while asks.get() is not None:
                pass
            raise
        run.found = not outcome  # the store found a value without asking for fn
        return tasks[0].result()


@attrs.frozen
class _Raised:
    """The exception `fn` raised on the caller's thread, for the store to raise."""

    error: Exception


# --- bundles ----------------------------------------------------------------------

_DONE: Any = object()


def _run_events(
    operation: Callable[[], AbstractAsyncContextManager[Any]],
    progress: Callable[[Event], object] | None,
) -> Any:
    """Run an import or export on the loop thread, calling `progress` on this thread.

    With a callback the two go in lockstep, as `async for` over the events
    does: the operation waits at each event until the callback has returned,
    so a callback that raises stops it right there.
    """
    loop = _shared_loop()
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()

    async def run() -> Any:
        try:
            async with operation() as stream:
                async for event in stream:
                    if progress is not None:
                        handled = anyio.Event()
                        events.put((event, handled))
                        await handled.wait()
            return stream.report
        finally:
            events.put(_DONE)  # after the block: whole batches, files closed

    future = loop.portal.start_task_soon(run)
    try:
        while (item := events.get()) is not _DONE:
            event, handled = item
            progress(event)  # type: ignore[misc]  # only events with a callback are queued
            loop.loop.call_soon_threadsafe(handled.set)
    except BaseException:
        # The callback failed or the caller was interrupted: stop the
        # operation (after its last whole batch) and wait until it has.
        future.cancel()
        while events.get() is not _DONE:
            pass
        raise
    return future.result()


def import_bundle(
    source: str | Path,
    env: BlockingEnvironment,
    *,
    progress: Callable[[Event], object] | None = None,
    namespaces: list[str] | None = None,
    batch_size: int = 1024,
    validate: Validate | None = None,
    verify: bool = True,
) -> ImportReport:
    """Import a bundle into `env`, as `warmenv.bundle.import_bundle` does.

    `progress` is called on this thread with each event (`Started`,
    `Progress`..., `Finished`); if it raises, the import stops after its last
    whole batch and the exception propagates.
    """
    _refuse_event_loop_thread("import_bundle()")
    env._check_open()
    report: ImportReport = _run_events(
        functools.partial(
            importing,
            source,
            env._env,
            namespaces=namespaces,
            batch_size=batch_size,
            validate=validate,
            verify=verify,
        ),
        progress,
    )
    return report


def export_bundle(
    sources: BlockingEnvironment | str | Path | Sequence[BlockingEnvironment | str | Path],
    out: str | Path,
    *,
    name: str,
    version: str,
    progress: Callable[[Event], object] | None = None,
    format: str = BundleFormat.SQLITE,
    namespaces: list[str] | None = None,
    environments: Sequence[EnvironmentInfo] | None = None,
    format_version: int = 2,
) -> ExportReport:
    """Write the entries of `sources` to the bundle `out`, as `warmenv.bundle.export_bundle`.

    `progress` is called on this thread with each event; if it raises, the
    export stops, leaves the previous bundle at `out`, and the exception
    propagates.
    """
    _refuse_event_loop_thread("export_bundle()")
    items = [sources] if isinstance(sources, BlockingEnvironment | str | Path) else sources
    unwrapped: list[Environment | str | Path] = []
    for source in items:
        if isinstance(source, BlockingEnvironment):
            source._check_open()
            unwrapped.append(source._env)
        else:
            unwrapped.append(source)
    report: ExportReport = _run_events(
        functools.partial(
            exporting,
            unwrapped,
            out,
            name=name,
            format=format,
            namespaces=namespaces,
            environments=environments,
            version=version,
            format_version=format_version,
        ),
        progress,
    )
    return report
