"""Background work that lives exactly as long as its owner (an open environment).

`Environment.start_soon` runs a task (`warmenv.bundle.warm_up`, say) in a
task group the caller already entered, and closing the environment cancels
the task and waits for it to end, its cleanup included, before the database
closes: background work never runs on a closed environment. What a task
raises is logged and goes no further, so it never ends the environment nor
the block or task group it runs in. The bookkeeping lives here, apart from
the environment it serves, so that it reads as one thing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVarTuple, final

import anyio
import anyio.abc
import attrs

from warmenv._errors import WarmenvError

__all__ = ["Background"]

log = logging.getLogger("warmenv.environment")  # the environment's logger: its tasks
Ts = TypeVarTuple("Ts")


@attrs.frozen(eq=False)
class _Task:
    """One task: its cancel scope, and whether it has ended."""

    scope: anyio.CancelScope
    done: anyio.Event


@final
@attrs.define
class Background:
    """The tasks running on behalf of one owner, and the task group they run in by default."""

    task_group: anyio.abc.TaskGroup | None = None
    """Where `start_soon` runs a task given no task group (`open_environment`'s block)."""
    _tasks: set[_Task] = attrs.field(init=False, factory=set)

    def start_soon(
        self,
        owner: str,
        fn: Callable[[*Ts], Awaitable[object]],
        *args: *Ts,
        name: str | None = None,
        task_group: anyio.abc.TaskGroup | None = None,
    ) -> None:
        """Run `await fn(*args)` in `task_group` (else this one's) until `stop`.

        `owner` (its description) names it in the log and in the error when
        there is no task group to run in.
        """
        group = self.task_group if task_group is None else task_group
        if group is None:
            raise WarmenvError(
                f"{owner} has no task group of its own (it was not opened by "
                "open_environment); pass task_group= (an entered anyio task group)"
            )
        task = _Task(anyio.CancelScope(), anyio.Event())
        self._tasks.add(task)
        label = name or getattr(fn, "__qualname__", repr(fn))

        async def run() -> None:
            try:
                with task.scope:
                    await fn(*args)
            except Exception:
                log.exception("background task %s of %s failed", label, owner)
            finally:
                self._tasks.discard(task)
                task.done.set()

        group.start_soon(run, name=label)

    async def stop(self) -> None:
        """Cancel every task and wait until each has ended (its cleanup included)."""
        self.task_group = None
        for task in list(self._tasks):
            task.scope.cancel()
        with anyio.CancelScope(shield=True):
            for task in list(self._tasks):
                await task.done.wait()
