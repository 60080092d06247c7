"""The tier's clock: a loop too busy to read an answer is not a server that did not answer.

A real LoopClock on the test's own loop; the busy loop is a callback that holds
it (a spin, as a host whose computations hold the GIL), the server's answer an
await of 50 ms. tests/test_fleet_load.py is the same class with real hosts.
"""

from __future__ import annotations

import time

import anyio
import pytest

from warmenv.remote.lag import TICK, LoopClock

pytestmark = pytest.mark.anyio

TIMEOUT = 0.25


def _hold_the_loop(seconds: float) -> None:
    """Run on the loop's thread without yielding: no other task runs meanwhile."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def test_a_loop_held_before_the_ticker_runs_is_no_server_time() -> None:
    # The loop is held right after the deadline is set, before the ticker has run
    # once: when it was just started, and when it was idle between calls (the
    # host's case: a call after a quiet spell, on a loop its threads starve).
    async with anyio.create_task_group() as tasks:
        clock = LoopClock(tasks)
        for call in ("first", "after an idle spell"):
            with clock.deadline(TIMEOUT) as deadline:
                _hold_the_loop(2 * TIMEOUT)
                await anyio.sleep(0.05)  # the server's answer, once the loop is free
            assert not deadline.fell_due, f"{call} call: the loop's lateness fell due"
            await anyio.sleep(0.05)  # the ticker goes idle: nothing is in flight
        assert clock.lag >= 2 * 2 * TIMEOUT
        tasks.cancel_scope.cancel()


async def test_a_server_that_does_not_answer_still_falls_due() -> None:
    async with anyio.create_task_group() as tasks:
        clock = LoopClock(tasks)
        for _ in range(2):
            with clock.deadline(TIMEOUT) as deadline:
                _hold_the_loop(2 * TIMEOUT)
                await anyio.sleep(60)  # no answer
                pytest.fail("the deadline did not end the call")
            assert deadline.fell_due
            await anyio.sleep(0.05)
        tasks.cancel_scope.cancel()


async def test_a_loop_late_at_every_tick_still_meets_the_backstop() -> None:
    # Every tick comes two ticks late: all of it is our lateness, the server's time
    # stands still, and only the backstop (on the loop's own clock) ends the call.
    backstop = 4 * TIMEOUT

    async def starve() -> None:
        while True:
            _hold_the_loop(3 * TICK)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tasks:
        clock = LoopClock(tasks)
        tasks.start_soon(starve)
        started = time.monotonic()
        with clock.deadline(TIMEOUT, backstop) as deadline:
            await anyio.sleep(60)  # no answer
            pytest.fail("the backstop did not end the call")
        took = time.monotonic() - started
        assert deadline.fell_due and backstop <= took < 2 * backstop
        assert clock.waited < TIMEOUT, "the server's time ran: no test of the backstop"
        tasks.cancel_scope.cancel()
