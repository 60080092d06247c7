"""Bundle import and export for synchronous code, with progress on the caller's thread.

The async operations (`warmenv.bundle.importing`, `exporting`) run on the
loop thread and take the same options, forwarded one by one (a test derives
these signatures from the async ones, so an option added there fails it
until it is added here). A `progress` callback runs on the caller's thread
in lockstep with the events: the operation waits at each event until the
callback has returned, so a callback that raises stops it right there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from warmenv.blocking._environment import BlockingEnvironment
from warmenv.blocking._loop import Ask, refuse_event_loop_thread, shared_loop
from warmenv.bundle import Bundle, DownloadOptions
from warmenv.bundle.events import Event, ExportReport, ImportReport
from warmenv.bundle.exporting import BundleFormat, exporting
from warmenv.bundle.importing import Validate, importing
from warmenv.bundle.manifest import EnvironmentInfo
from warmenv.environment import Environment

__all__ = ["export_bundle", "import_bundle"]


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


def import_bundle(
    source: str | Path | Bundle,
    env: BlockingEnvironment,
    *,
    progress: Callable[[Event], object] | None = None,
    namespaces: list[str] | None = None,
    batch_size: int = 1024,
    validate: Validate | None = None,
    verify: bool = True,
    download: DownloadOptions | None = None,
) -> ImportReport:
    """Import a bundle into `env`, as `warmenv.bundle.import_bundle` does.

    `source` is a path, an http(s) URL (`download` sets the limits of
    fetching it) or an open bundle. `progress` is called on this thread with
    each event (`Started`, `Progress`..., `Finished`); if it raises, the
    import stops after its last whole batch and the exception propagates.
    """
    refuse_event_loop_thread("import_bundle()")
    report: ImportReport = _run_events(
        functools.partial(
            importing,
            source,
            env.opened(),
            namespaces=namespaces,
            batch_size=batch_size,
            validate=validate,
            verify=verify,
            download=download,
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
    refuse_event_loop_thread("export_bundle()")
    items = [sources] if isinstance(sources, BlockingEnvironment | str | Path) else sources
    unwrapped: list[Environment | str | Path] = [
        source.opened() if isinstance(source, BlockingEnvironment) else source for source in items
    ]
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
