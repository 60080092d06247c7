"""Single flight: one run per key at a time, its outcome shared by every asker.

A store reads a missing key from its storage once however many tasks ask for
it at that moment, and runs a computation once for all of them;
`warmenv.blocking` does the same for threads. The rules are the same for both
and live here, with one driver for tasks (`run`) and one for threads
(`run_blocking`):

- the first asker of a key starts a run; the others wait for it and get its
  outcome, the value or the very exception it raised, and the next call
  after a failure starts a new run;
- a waiter that is cancelled stops waiting and the run goes on;
- a run whose starter is cancelled (or interrupted) is abandoned, not
  shared: one of its waiters starts a new one, so no waiter is handed a
  cancellation that is not its own;
- a run knows who runs it (a task, a thread): an asker that is that runner,
  asking again from inside its own run, would wait for itself forever, and
  is told so instead;
- what a run runs is what its face takes: the async store awaits what `fn`
  returns (`awaited`), `warmenv.blocking` takes a plain function's value
  (`refuse_async`, `plain`); the other kind is refused in one line saying
  which face takes it.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Hashable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, final

import anyio
import attrs

from warmenv._errors import WarmenvError
from warmenv.persistence._held import ABSENT
from warmenv.persistence.arrivals import Arrivals

__all__ = ["Flights", "awaited", "plain", "refuse_async", "unless_imported", "waits_for_itself"]

KT = TypeVar("KT", bound=Hashable)
T = TypeVar("T")


def _name(fn: Callable[..., object]) -> str:
    while isinstance(fn, functools.partial):  # get_or_compute's own, around fn and kwargs
        fn = fn.func
    return f"{getattr(fn, '__qualname__', None) or repr(fn)}()"


def awaited(fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> Awaitable[T]:
    """`fn(*args)` for the async store to await; `TypeError` at once if it is no awaitable.

    A plain function is told only once it has returned, as trio's
    `start_soon` tells one: a function returning a coroutine (a lambda or
    `partial` around an async function) is as good as an `async def` and
    looks the same until called. The error says what to do, where Python
    would say "object dict can't be used in 'await' expression"; nothing is
    stored.
    """
    result = fn(*args)
    if not inspect.isawaitable(result):
        raise TypeError(
            f"{_name(fn)} returned {type(result).__name__}, not an awaitable: the async "
            "store awaits what fn returns; make it an async def, or use warmenv.blocking, "
            "whose store runs plain functions"
        )
    return result


def refuse_async(fn: Callable[..., object]) -> None:
    """`TypeError` for an async function given to `warmenv.blocking`, before it runs.

    Its coroutine would never be awaited: the value stored would be the
    coroutine object, which no codec takes.
    """
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (an object whose __call__ is async)
    ):
        raise TypeError(
            f"{_name(fn)} is an async function: warmenv.blocking's store runs plain "
            "functions; await it through the async store (`await store.get_or_compute(...)`), "
            "or pass a plain function"
        )


def plain(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """`fn(*args)` for `warmenv.blocking`; `TypeError` if it returned an awaitable.

    What `refuse_async` cannot see before the call (a plain function
    returning a coroutine); the coroutine is closed, never left unawaited.
    """
    result = fn(*args)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(
            f"{_name(fn)} returned {type(result).__name__}, an awaitable: warmenv.blocking's "
            "store stores what fn returns; await it through the async store "
            "(`await store.get_or_compute(...)`), or return the value itself"
        )
    return result


def waits_for_itself(fn: object, storage: Describes, key: object) -> WarmenvError:
    """The error for `fn`, which asked `storage` for `key` while its own run computes it."""
    return WarmenvError(
        f"{getattr(fn, '__qualname__', fn)!s} asked {storage.describe()} for {key!r} while"
        " computing that very key; it would wait for itself"
    )


class Describes(Protocol):
    def describe(self) -> str: ...


@attrs.define(eq=False)
class _Flight:
    """One run for one key: who runs it, and how it ended.

    `done` is made by the first waiter, under the flights' lock (`Flights._join`):
    most runs (a read, a remote hit) have none, and an event made per run
    would cost each of them its making (anyio's asks which backend runs).
    """

    owner: object
    done: anyio.Event | threading.Event | None = None
    outcome: Any = None
    error: Exception | None = None
    traceback: TracebackType | None = None
    abandoned: bool = False
    """The starter was cancelled (or interrupted): a waiter starts a new run."""

    def result(self) -> Any:
        """The shared outcome: the run's value, or the exception it raised."""
        if self.error is not None:
            raise self.error.with_traceback(self.traceback)
        return self.outcome


@final
class Flights(Generic[KT, T]):
    """The runs in progress, by key; see the module docstring.

    One instance serves either the tasks of one event loop (`run`) or
    threads (`run_blocking`), not both: their waits differ.
    """

    __slots__ = ("_flights", "_lock")

    def __init__(self) -> None:
        self._flights: dict[KT, _Flight] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Runs in progress."""
        return len(self._flights)

    async def run(
        self,
        key: KT,
        fn: Callable[[], Awaitable[T]],
        *,
        owner: object = None,
        itself: Callable[[], Exception] | None = None,
    ) -> T:
        """`await fn()` once for every task asking for `key` while it runs.

        `owner` names the asking task (None: not checked); if it is the task
        running `key`'s run, `itself()` is raised rather than waited for.
        """
        while True:
            flight, done = self._join(key, owner, anyio.Event, itself)
            if done is None:
                with _Landing(self._flights, self._lock, key, flight):
                    flight.outcome = await fn()
                return flight.outcome  # type: ignore[no-any-return]
            await done.wait()  # type: ignore[misc]
            if not flight.abandoned:
                return flight.result()  # type: ignore[no-any-return]

    def run_blocking(
        self,
        key: KT,
        fn: Callable[[], T],
        *,
        owner: object = None,
        itself: Callable[[], Exception] | None = None,
    ) -> T:
        """`fn()` once for every thread asking for `key` while it runs; as `run`."""
        while True:
            flight, done = self._join(key, owner, threading.Event, itself)
            if done is None:
                with _Landing(self._flights, self._lock, key, flight):
                    flight.outcome = fn()
                return flight.outcome  # type: ignore[no-any-return]
            done.wait()
            if not flight.abandoned:
                return flight.result()  # type: ignore[no-any-return]

    def _join(
        self,
        key: KT,
        owner: object,
        event: Callable[[], anyio.Event | threading.Event],
        itself: Callable[[], Exception] | None,
    ) -> tuple[_Flight, anyio.Event | threading.Event | None]:
        """The run in progress for `key` and the event its end sets, or a new run this
        asker leads (and None).

        The event is made by the run's first waiter, under the lock under which
        the leader takes the run out before setting it (`_Landing`): none is missed.
        """
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                flight = self._flights[key] = _Flight(owner)
                return flight, None
            if owner is None or flight.owner is not owner:
                if flight.done is None:
                    flight.done = event()
                return flight, flight.done
        if itself is not None:
            raise itself()
        raise WarmenvError(
            "a run asked for its own key while computing it; it would wait for itself"
        )


@final
class _Landing:
    """Around a leader's run: record how it ended, then let the waiters go."""

    __slots__ = ("_flight", "_flights", "_key", "_lock")

    def __init__(
        self, flights: dict[Any, _Flight], lock: threading.Lock, key: object, flight: _Flight
    ) -> None:
        self._flights = flights
        self._lock = lock
        self._key = key
        self._flight = flight

    def __enter__(self) -> None:
        pass

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        flight = self._flight
        if isinstance(exc, Exception):
            flight.error, flight.traceback = exc, tb
        elif exc is not None:
            # Cancellation (or an interrupt) is the starter's, not an outcome to share.
            flight.abandoned = True
        with self._lock:
            if self._flights.get(self._key) is flight:
                del self._flights[self._key]
            done = flight.done  # no waiter can join once it is out: read under the lock
        if done is not None:
            done.set()


async def unless_imported(
    read: Callable[[], Awaitable[Any]],
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    arrivals: Arrivals,
    seen: int,
) -> tuple[bool, Any]:
    """`(False, await fn(*args))`, or `(True, what read() found)` if an import lands it first.

    For a run computing its key while an import runs (`Arrivals`): `read`
    (which answers `ABSENT` for a miss) is called after each batch
    landed since `seen`; once it finds the key, `fn` is cancelled (its value
    would only replace the imported one) and the run's askers get what was
    read. An exception of `fn` is raised as it is, not in a group.
    """
    found: list[Any] = []
    read_after = [seen]  # the batch count before the last read the watcher finished

    async def watch(scope: anyio.CancelScope, seen: int) -> None:
        while True:
            seen = await arrivals.after(seen)
            held = await read()
            read_after[0] = seen
            if held is not ABSENT:
                found.append(held)
                scope.cancel()
                return

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch, tasks.cancel_scope, seen)
            value = await awaited(fn, args)
            tasks.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
            raise group.exceptions[0] from None  # fn's own, as without an import
        raise
    if not found and arrivals.batches != read_after[0]:
        # fn ended after a batch landed but before the watcher's read of it ended.
        held = await read()
        if held is not ABSENT:
            found.append(held)
    if found:
        return True, found[0]
    return False, value
