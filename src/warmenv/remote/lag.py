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
broken connection is noticed at once, as before. A loop late at every tick
would never let the server's time run, so each deadline also has a backstop
in the loop's own time (`wire.backstop`, far past the timeout): the one bound
of a call, as coredis's own timers are switched off for the tier's calls
(two per call cost a remote hit a twentieth of its instructions,
`benchmarks/remote_instructions.py`).

A deadline that falls due cancels the call the way its event loop cancels
natively, once: on trio a cancel scope's `cancel()`; on asyncio the call's
task's `cancel()`, undone by `uncancel()` when the call unwinds (as
`asyncio.timeout` does), because an anyio cancel scope per call cost a
remote hit as much again as the rest of the deadline. A cancellation the
deadline did not make (a caller's scope, a caller's `task.cancel()`) goes on
through it untouched, and the deadline's own is never seen past it.

Our own parsing of an answer is lateness too, as far as this clock can tell, so
what a server can make us parse is bounded where replies are read
(`reader.BoundedStream`: size, nesting and elements): a hostile reply stretches
a deadline by at most the parsing of one bounded reply.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Final, final

import anyio
import attrs

from warmenv._backend import sniffio_thread

if TYPE_CHECKING:
    from types import TracebackType

    import trio
    from anyio.abc import TaskGroup

__all__ = ["TICK", "Deadline", "LoopClock"]

TICK: Final = 0.005
"""How often the ticker asks to be woken while a bounded call is in flight (seconds)."""


def _trio_scope() -> type[trio.CancelScope] | None:
    if sniffio_thread.name != "trio":
        return None
    import trio

    return trio.CancelScope


@final
@attrs.define(eq=False)
class LoopClock:
    """Deadlines in the server's time: wall time less our own loop's observed lateness."""

    _tasks: TaskGroup
    """Where the ticker runs (started by the first bounded call)."""
    _lag: float = attrs.field(init=False, default=0.0)
    _due: set[Deadline] = attrs.field(init=False, factory=set)
    """The deadlines of the calls in flight."""
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
    _trio_scope: type[trio.CancelScope] | None = attrs.field(init=False, factory=_trio_scope)
    """trio's cancel scope under trio, else None (picked once: a tier's loop stays)."""

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

    def deadline(self, seconds: float, backstop: float = math.inf) -> Deadline:
        """A deadline for the call of its `with` block: once the server has had `seconds`
        (see the module docstring), or once `backstop` seconds have passed on the loop's
        own clock, the call is cancelled, and the block's exit swallows that cancellation.

        Its `fell_due` says whether it did.
        """
        if self._trio_scope is not None:
            return _TrioDeadline(self, seconds, backstop, self._trio_scope())
        return _AsyncioDeadline(self, seconds, backstop)

    def begin(self, deadline: Deadline) -> None:
        """`deadline` is in flight (entered by its `with`)."""
        wall = time.monotonic()
        now = wall - self._lag
        if not self._due:
            self._since = now
        deadline.due = now + deadline.seconds
        deadline.backstop_due = wall + deadline.backstop
        self._due.add(deadline)
        if self._asleep:
            # The ticker waits on `_wake` only once it has said it is asleep.
            self._asleep = False
            self._woken_at = wall
            self._wake.set()
        if not self._ticking:
            self._ticking = True
            self._tasks.start_soon(self._tick)

    def end(self, deadline: Deadline) -> None:
        """`deadline` is over (left by its `with`)."""
        self._due.remove(deadline)
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
            wall = time.monotonic()
            now = wall - self._lag
            for deadline in list(self._due):
                if not deadline.fell_due and (now >= deadline.due or wall >= deadline.backstop_due):
                    deadline.fall_due()

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


class Deadline:
    """`LoopClock.deadline`'s context, one class per event loop: a class, as a generator's
    context costs a remote hit as much again as the clock's own work
    (benchmarks/remote_instructions.py)."""

    __slots__ = ("_clock", "backstop", "backstop_due", "due", "fell_due", "seconds")

    def __init__(self, clock: LoopClock, seconds: float, backstop: float) -> None:
        self._clock = clock
        self.seconds = seconds
        """The server's time the call may take."""
        self.backstop = backstop
        """The loop's own time the call may take, however late the loop runs."""
        self.due = self.backstop_due = math.inf
        """When it falls due on the clock (`LoopClock.now`), and on the loop's own
        (`time.monotonic`): set once entered."""
        self.fell_due = False
        """Whether it fell due while the call was in flight (and cancelled the call)."""

    def fall_due(self) -> None:
        """Cancel the call (the ticker's, once)."""
        raise NotImplementedError

    def __enter__(self) -> Deadline:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        raise NotImplementedError


@final
class _AsyncioDeadline(Deadline):
    """The call's task is cancelled natively, and uncancelled as `asyncio.timeout` does.

    Cancelling the task, not an anyio scope, is safe only because nothing
    between the deadline and the awaits of a call shields (coredis's calls
    hold no shielded scope): a native cancellation goes through anyio's
    unshielded scopes untouched, and the cancel scopes of callers count and
    undo only their own requests (`Task.cancelling`).
    """

    __slots__ = ("_cancelling", "_task")

    def __enter__(self) -> Deadline:
        task = asyncio.current_task()
        assert task is not None, "a remote call runs in a task"
        self._task = task
        self._cancelling = task.cancelling()
        self._clock.begin(self)
        return self

    def fall_due(self) -> None:
        if self._task.cancelling() > self._cancelling:
            # Someone else asked first (a caller's scope, in the same loop pass): theirs
            # goes on. A second `cancel()` would replace their message with ours, and
            # anyio's scope lets through a `CancelledError` it cannot call its own.
            return
        self.fell_due = True
        self._task.cancel("warmenv: the remote call's deadline fell due")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._clock.end(self)
        # Ours only if no one else asked to cancel the task meanwhile: a caller's
        # request that came with ours (or after it) is the caller's to see.
        return (
            self.fell_due
            and self._task.uncancel() <= self._cancelling
            and exc_type is not None
            and issubclass(exc_type, asyncio.CancelledError)
        )


@final
class _TrioDeadline(Deadline):
    """The call runs in a trio cancel scope (anyio's wraps it, at a quarter more per hit)."""

    __slots__ = ("_scope",)

    def __init__(
        self, clock: LoopClock, seconds: float, backstop: float, scope: trio.CancelScope
    ) -> None:
        super().__init__(clock, seconds, backstop)
        self._scope = scope

    def __enter__(self) -> Deadline:
        self._clock.begin(self)
        try:
            self._scope.__enter__()
        except BaseException:
            self._clock.end(self)
            raise
        return self

    def fall_due(self) -> None:
        self.fell_due = True
        self._scope.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        try:
            return self._scope.__exit__(exc_type, exc, traceback)
        finally:
            self._clock.end(self)
