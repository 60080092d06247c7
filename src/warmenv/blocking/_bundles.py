"""Bundle import, export and warm-up for synchronous code, with progress off the loop.

The async operations (`warmenv.bundle.importing`, `exporting`) run on the
loop thread and take the same options, passed on whole: an import's are
`ImportOptions`, an export's `ExportOptions` (one definition each,
`warmenv.bundle.options`), so an option added there reaches these faces too. A `progress`
callback runs on the caller's thread in lockstep with the events: the
operation waits at each event until the callback has returned, so a
callback that raises stops it right there.

A warm-up (`warm_up`) runs on the loop thread in the task group of the
environment's `with` block, as the async one does in `open_environment`'s;
its handle (`BlockingWarmUp`) reads the async handle's state from any
thread, and its `on_event` runs on a worker thread (it may block: the
warm-up waits for it, the loop does not).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Unpack, final

import anyio
import anyio.to_thread

from warmenv.blocking._environment import BlockingEnvironment
from warmenv.blocking._loop import Ask, LoopThread, refuse_event_loop_thread, shared_loop
from warmenv.bundle import Bundle
from warmenv.bundle.events import Event, ExportReport, ImportEvent, ImportReport
from warmenv.bundle.exporting import exporting
from warmenv.bundle.importing import importing
from warmenv.bundle.options import ExportOptions, ImportOptions, refuse_unknown
from warmenv.bundle.warmup import OnEvent, WarmUp, WarmUpState, check_timeout
from warmenv.bundle.warmup import warm_up as _warm_up
from warmenv.environment import Environment

__all__ = ["BlockingWarmUp", "export_bundle", "import_bundle", "warm_up"]


def _run_events(
    operation: Callable[[], AbstractAsyncContextManager[Any]],
    progress: Callable[[Event], object] | None,
) -> Any:
    """Run an import or export on the loop thread, calling `progress` on this thread.

    If `progress` raises (or the caller is interrupted), the operation is
    cancelled (after its last whole batch) and waited for, then the
    exception propagates here.
    """

    async def run(ask: Ask[object]) -> Any:
        async with operation() as stream:
            async for event in stream:
                if progress is not None:
                    await ask(functools.partial(progress, event))
        return stream.report

    return shared_loop().asking(run, hand_back_errors=False)


def _opened(env: object) -> Environment:
    """The async environment under `env`; `TypeError` at the call if `env` is none of ours.

    The other arguments are checked by the async forms as they start, before
    any work (`warmenv.bundle.options.check_options`), and raised here.
    """
    if not isinstance(env, BlockingEnvironment):
        twin = " (an async Environment goes to warmenv.bundle's form)"
        raise TypeError(
            "env must be a BlockingEnvironment (from warmenv.blocking.open_environment), got "
            f"{type(env).__name__}" + (twin if isinstance(env, Environment) else "")
        )
    return env.opened()


def import_bundle(
    source: str | Path | Bundle,
    env: BlockingEnvironment,
    *,
    progress: Callable[[Event], object] | None = None,
    **options: Unpack[ImportOptions],
) -> ImportReport:
    """Import a bundle into `env`, as `warmenv.bundle.import_bundle` does.

    `source` is a path, an http(s) URL or an open bundle; `options` are every
    import's (`ImportOptions`). `progress` is called on this thread with
    each event (`Started`, `Progress`..., `Finished`); if it raises, the
    import stops after its last whole batch and the exception propagates.
    """
    refuse_event_loop_thread("import_bundle()")
    refuse_unknown(options, "import_bundle")
    report: ImportReport = _run_events(
        functools.partial(importing, source, _opened(env), **options), progress
    )
    return report


def export_bundle(
    sources: BlockingEnvironment | str | Path | Sequence[BlockingEnvironment | str | Path],
    out: str | Path,
    *,
    progress: Callable[[Event], object] | None = None,
    **options: Unpack[ExportOptions],
) -> ExportReport:
    """Write the entries of `sources` to the bundle `out`, as `warmenv.bundle.export_bundle`.

    `options` are every export's (`ExportOptions`). `progress` is called on
    this thread with each event; if it raises, the export stops, leaves the
    previous bundle at `out`, and the exception propagates.
    """
    refuse_event_loop_thread("export_bundle()")
    refuse_unknown(options, "export_bundle", ExportOptions)
    items = [sources] if isinstance(sources, BlockingEnvironment | str | Path) else sources
    unwrapped: list[Environment | str | Path] = [
        _opened(source) if isinstance(source, BlockingEnvironment) else source for source in items
    ]
    report: ExportReport = _run_events(
        functools.partial(exporting, unwrapped, out, **options), progress
    )
    return report


def warm_up(
    source: str | Path | Bundle,
    env: BlockingEnvironment,
    *,
    on_event: OnEvent | None = None,
    **options: Unpack[ImportOptions],
) -> BlockingWarmUp:
    """Start importing `source` into `env` in the background, as `warmenv.bundle.warm_up`.

    `options` are every import's (`ImportOptions`). It runs on
    warmenv.blocking's loop thread until it ends or the environment's `with`
    block does (which cancels it after its last whole batch); a failure is
    logged, recorded and kept on the handle, never raised. `on_event` is
    called with each event on a worker thread, in order (the warm-up waits
    for it, leaving the block does not); if it raises, the warm-up fails.
    """
    refuse_event_loop_thread("warm_up()")
    refuse_unknown(options, "warm_up")
    loop = shared_loop()
    opened = _opened(env)
    forward: Callable[[ImportEvent], Awaitable[object]] | None = None
    if on_event is not None:
        if not callable(on_event):
            raise TypeError(
                f"on_event must be a function, got {type(on_event).__name__} {on_event!r}"
            )
        callback = on_event

        def forward(event: ImportEvent) -> Awaitable[object]:
            # Abandoned on cancellation: leaving the block does not wait for a callback.
            return anyio.to_thread.run_sync(callback, event, abandon_on_cancel=True)

    async def start() -> WarmUp:
        return _warm_up(source, opened, on_event=forward, **options)

    return BlockingWarmUp(loop.call(start), loop)


@final
class BlockingWarmUp:
    """A warm-up started by `warmenv.blocking.warm_up`; see `warmenv.bundle.WarmUp`.

    Its state is read from any thread; `wait()` blocks the calling thread.
    """

    __slots__ = ("_handle", "_loop")

    def __init__(self, handle: WarmUp, loop: LoopThread) -> None:
        self._handle = handle
        self._loop = loop

    @property
    def source(self) -> str:
        """What is imported: the path, or the URL with its credentials hidden."""
        return self._handle.source

    @property
    def state(self) -> WarmUpState:
        return self._handle.state

    @property
    def done(self) -> bool:
        """Whether it has ended (finished, failed or cancelled)."""
        return self._handle.done

    @property
    def report(self) -> ImportReport | None:
        """What it imported (see `WarmUp.report`)."""
        return self._handle.report

    @property
    def error(self) -> Exception | None:
        """Why it failed (`FAILED`), else `None`."""
        return self._handle.error

    @property
    def latest(self) -> ImportEvent | None:
        """The last import event."""
        return self._handle.latest

    def cancel(self) -> None:
        """Stop it after its last whole batch; returns at once (`wait()` for the end)."""
        self._loop.soon(self._handle.cancel)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until it has ended, or `timeout` seconds (`None`: no bound); whether it has
        ended. Never raises its error (read `state` and `error`); as `WarmUp.wait`."""
        refuse_event_loop_thread("BlockingWarmUp.wait()")
        check_timeout(timeout)
        return self._loop.call(self._handle.wait, timeout)

    def __repr__(self) -> str:
        return f"<BlockingWarmUp of {self.source!r}: {self.state.value}>"
