"""The tier's clock: time as the server has had it, not as our own busy loop lived it.

A host whose event loop is starved (computations holding the GIL on worker
threads, a callback that runs long) reads a server's answer late: the bytes
wait in the socket until the loop comes round to them. A deadline on the
loop's own clock counts that wait against the server and calls a healthy Redis
an outage, and an outage turns a fleet's lease into a local computation. So
the tier's deadlines run on this clock: wall time less the time the loop was
seen running late. While a bounded call is in flight a ticker asks to be woken
every `TICK`; a wake-up that comes later than asked adds its lateness to the
lag, and one a tick or more late adds the whole interval (the loop was busy
throughout, as far as can be told: a burst of our own calls, or threads
holding the GIL). The first tick after the ticker was idle is measured from
when a deadline asked to wake it: a ticker that resumes late was kept waiting
by the same busy loop, and that wait is lateness too (left uncounted, a
starved host spent its whole timeout before the first tick and called a
healthy Redis an outage: tests/test_fleet_load.py under load). A call's
deadline falls due once the server has had `timeout` seconds of a loop that
was ready to read its answer, however long that took in wall time.

The price: on a starved loop an outage (a server that does not answer) is
noticed later in wall time, by the factor the loop is starved; a refused or
broken connection is noticed at once, as before.

Our own parsing of an answer is lateness too, as far as this clock can tell, so
what a server can make us parse is bounded where replies are read
(`reader.BoundedStream`: size, nesting and elements): a hostile reply stretches
a deadline by at most the parsing of one bounded reply.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final, TypeAlias, final

import anyio
import attrs

from warmenv._backend import sniffio_thread

if TYPE_CHECKING:
    from types import TracebackType

    import trio
    from anyio.abc import TaskGroup

__all__ = ["TICK", "LoopClock", "Scope"]

Scope: TypeAlias = "anyio.CancelScope | trio.CancelScope"
"""A deadline's scope: `cancel()` it; `cancelled_caught` says whether it fell due."""

TICK: Final = 0.005
"""How often the ticker asks to be woken while a bounded call is in flight (seconds)."""


@final
@attrs.define(eq=False)
class LoopClock:
    """Deadlines in the server's time: wall time less our own loop's observed lateness."""

    _tasks: TaskGroup
    """Where the ticker runs (started by the first bounded call)."""
    _lag: float = attrs.field(init=False, default=0.0)
    _due: dict[Scope, float] = attrs.field(init=False, factory=dict)
    _wake: anyio.Event = attrs.field(init=False, factory=anyio.Event)
    _ticking: bool = attrs.field(init=False, default=False)
    _asleep: bool = attrs.field(init=False, default=True)
    """Whether the ticker is idle (or not started): the next deadline wakes it."""
    _woken_at: float = attrs.field(init=False, default=0.0)
    """When the idle ticker was last asked to wake: its first tick is measured from then."""
    _asked: float = attrs.field(init=False, default=0.0)
    """When the ticker last asked to be woken (or the last call in flight ended)."""
    _waited: float = attrs.field(init=False, default=0.0)
    _since: float = attrs.field(init=False, default=0.0)
    """When (on this clock) the bounded calls now in flight began to be in flight."""

    @property
    def lag(self) -> float:
        """The seconds our loop has been seen running late, in all (for statistics)."""
        return self._lag

    @property
    def waited(self) -> float:
        """The seconds, on this clock, that at least one bounded call was in flight, in all.

        What calls to the server cost this process: calls side by side count
        once, and our loop's lateness not at all (for statistics).
        """
        return self._waited + (self.now() - self._since if self._due else 0.0)

    def now(self) -> float:
        """Monotonic seconds, less the loop's lateness seen so far."""
        return time.monotonic() - self._lag

    def deadline(self, seconds: float) -> _Deadline:
        """A scope cancelled once the server has had `seconds` (see the module docstring).

        Its `cancelled_caught` says whether the deadline fell due.
        """
        return _Deadline(self, seconds)

    def begin(self, scope: Scope, seconds: float) -> None:
        """`scope` is in flight, due in `seconds` (entered by `deadline`'s context)."""
        now = time.monotonic() - self._lag
        if not self._due:
            self._since = now
        self._due[scope] = now + seconds
        if self._asleep:
            # The ticker waits on `_wake` only once it has said it is asleep.
            self._asleep = False
            self._woken_at = time.monotonic()
            self._wake.set()
        if not self._ticking:
            self._ticking = True
            self._tasks.start_soon(self._tick)

    def end(self, scope: Scope) -> None:
        """`scope` is over (left by `deadline`'s context)."""
        del self._due[scope]
        if not self._due:
            # The loop's lateness since the last tick (unwinding a burst of calls
            # the deadline cancelled, say) is ours, not the server's.
            self._settle()
            self._waited += self.now() - self._since

    async def _tick(self) -> None:
        self._asked = self._woken_at
        while True:
            if not self._due:
                # Idle: nothing to measure, and no wake-ups while nothing is in flight.
                self._asleep = True
                self._wake = anyio.Event()
                await self._wake.wait()
                self._asked = self._woken_at
            await anyio.sleep(TICK)
            self._settle()
            now = self.now()
            for scope, due in list(self._due.items()):
                if now >= due:
                    scope.cancel()

    def _settle(self) -> None:
        """Count our lateness since the ticker last asked to wake (or the last call ended)."""
        took = time.monotonic() - self._asked
        if took >= 2 * TICK:
            # Late by a tick or more: the loop was busy, as far as can be told, the
            # whole time (an answer it could have read would have ended the call).
            self._lag += took
        elif took > TICK:
            self._lag += took - TICK
        self._asked = time.monotonic()


@final
class _Deadline:
    """`LoopClock.deadline`'s scope: a class, as a generator's context costs a remote hit
    as much again as the clock's own work (benchmarks/remote_instructions.py)."""

    __slots__ = ("_clock", "_scope", "_seconds")

    def __init__(self, clock: LoopClock, seconds: float) -> None:
        self._clock = clock
        self._seconds = seconds
        # Under trio, trio's own scope: anyio's wraps it, at a quarter more per remote hit.
        self._scope: Scope
        if sniffio_thread.name == "trio":
            import trio

            self._scope = trio.CancelScope()
        else:
            self._scope = anyio.CancelScope()

    def __enter__(self) -> Scope:
        self._clock.begin(self._scope, self._seconds)
        try:
            return self._scope.__enter__()
        except BaseException:
            self._clock.end(self._scope)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        try:
            return self._scope.__exit__(exc_type, exc, traceback)
        finally:
            self._clock.end(self._scope)
