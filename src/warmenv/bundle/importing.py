"""Import: copy a bundle's entries into an environment, as IMPORTED.

Import is insert-only and idempotent: entries already present are skipped,
and a value computed locally is never overwritten (the storage's insert rule
decides, as for every write). The digest is checked before the first batch
is committed, so a bundle whose content does not match its manifest imports
nothing. Each batch is one transaction, so an import that is cancelled or
killed leaves whole batches behind, and running it again completes it.

What was verified is what is imported: a bundle named by path is copied,
through the descriptor that was checked to be a regular file, into a
private directory, and that copy is verified and imported (an open bundle
backed by a file is copied the same way). Renaming another file over the
path, rewriting or truncating it in place, cannot reach the import; the
copy costs one sequential file copy (see docs/benchmarks.md).

A SQLite bundle going into a SQLite environment is copied inside SQLite
(ATTACH, then INSERT ... SELECT over rowid ranges); anything else streams
scan batches into `insert_many`. Either way memory stays bounded by the
batch size, whatever the bundle's size.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import final

import anyio

from warmenv.bundle.base import Bundle
from warmenv.bundle.errors import CorruptBundleError
from warmenv.bundle.events import (
    Event,
    EventStream,
    Finished,
    ImportReport,
    Progress,
    Started,
)
from warmenv.bundle.open import open_private
from warmenv.environment import Environment
from warmenv.persistence.namespace import matches_any
from warmenv.persistence.sqlite import CopiedBatch
from warmenv.persistence.storage import NamespaceSummary, Origin, Storage, check_batch_size

__all__ = ["ImportProgress", "import_bundle", "importing"]

Validate = Callable[[str, bytes, bytes], bool]
log = logging.getLogger("warmenv.bundle")


async def import_bundle(
    source: str | Path | Bundle,
    env: Environment,
    *,
    namespaces: list[str] | None = None,
    batch_size: int = 1024,
    validate: Validate | None = None,
    verify: bool = True,
) -> ImportReport:
    """Import every entry of `source` (a path or an open bundle) into `env`."""
    async with importing(
        source, env, namespaces=namespaces, batch_size=batch_size, validate=validate, verify=verify
    ) as progress:
        async for _ in progress:
            pass
    return progress.report


@asynccontextmanager
async def importing(
    source: str | Path | Bundle,
    env: Environment,
    *,
    namespaces: list[str] | None = None,
    batch_size: int = 1024,
    validate: Validate | None = None,
    verify: bool = True,
) -> AsyncIterator[ImportProgress]:
    """`async with importing(...) as progress: async for event in progress:` runs the import.

    The import advances as the events are consumed; leaving the block early
    stops it after the last whole batch.
    """
    check_batch_size(batch_size)
    near = env.snapshot_directory()
    if isinstance(source, str | os.PathLike):
        bundle: Bundle = await open_private(Path(source), near)
        owned = True
    else:
        copy = await source.private_copy(near)  # noqa: ASYNC240 (a Bundle here)
        bundle, owned = (source, False) if copy is None else (copy, True)
    progress = ImportProgress(bundle, env, namespaces, batch_size, validate, verify)
    try:
        yield progress
    finally:
        with anyio.CancelScope(shield=True):
            await progress.aclose()
            if owned:
                await bundle.aclose()


@final
class ImportProgress(EventStream[ImportReport]):
    """The events of one import; `report` once it has finished."""

    _operation = "import"

    def __init__(
        self,
        bundle: Bundle,
        env: Environment,
        prefixes: list[str] | None,
        batch_size: int,
        validate: Validate | None,
        verify: bool,
    ) -> None:
        self._bundle = bundle
        self._env = env
        self._prefixes = prefixes
        self._batch_size = batch_size
        self._validate = validate
        self._verify = verify
        super().__init__()

    async def _run(self) -> AsyncGenerator[Event, None]:
        started_at = time.perf_counter()
        selected = [
            s for s in await self._bundle.namespaces() if matches_any(s.namespace, self._prefixes)
        ]
        total_entries = sum(s.entries for s in selected)
        total_bytes = sum(s.bytes for s in selected)
        yield Started(tuple(s.namespace for s in selected), total_entries, total_bytes)
        if self._verify:
            await _verify(self._bundle)
        tally = _Tally()
        for summary in selected:
            tally.by_ns[summary.namespace] = (0, 0)
        entry_file = self._bundle.entry_file
        copier = None
        if entry_file is not None and self._validate is None:
            copier = self._env.bulk_copy(entry_file, self._prefixes, self._batch_size)
        if copier is not None:
            batches = _copy_in_bulk(copier, tally)
        else:
            batches = _copy_by_scan(self._bundle, self._env, selected, self, tally)
        async with aclosing(batches):
            async for namespace in batches:
                yield Progress(namespace, tally.done, total_entries, tally.bytes_done, total_bytes)
        report = ImportReport(
            namespaces=tuple(
                NamespaceSummary(ns, entries, size) for ns, (entries, size) in tally.by_ns.items()
            ),
            imported=tally.imported,
            skipped=tally.skipped,
            failed=tally.failed,
            rejected=tally.rejected,
            bytes=tally.imported_bytes,
            elapsed=time.perf_counter() - started_at,
        )
        self._report = report
        yield Finished(report)


class _Tally:
    def __init__(self) -> None:
        self.imported = self.skipped = self.failed = self.rejected = 0
        self.imported_bytes = self.done = self.bytes_done = 0
        self.by_ns: dict[str, tuple[int, int]] = {}

    def add_imported(self, namespace: str, entries: int, size: int) -> None:
        old = self.by_ns.get(namespace, (0, 0))
        self.by_ns[namespace] = (old[0] + entries, old[1] + size)
        self.imported += entries
        self.imported_bytes += size


async def _verify(bundle: Bundle) -> None:
    try:
        await bundle.verify()
    except CorruptBundleError as exc:
        raise CorruptBundleError(f"{exc}; nothing was imported") from None


async def _copy_by_scan(
    bundle: Bundle,
    env: Environment,
    selected: list[NamespaceSummary],
    progress: ImportProgress,
    tally: _Tally,
) -> AsyncGenerator[str, None]:
    validate = progress._validate
    for summary in selected:
        namespace = summary.namespace
        storage = env.storage(namespace)
        batch: list[tuple[bytes, bytes]] = []
        scan = bundle.scan(namespace, progress._batch_size)
        async with aclosing(scan):  # type: ignore[type-var]
            async for key, value in scan:
                batch.append((key, value))
                if len(batch) >= progress._batch_size:
                    await _insert_batch(storage, namespace, batch, validate, tally)
                    batch = []
                    yield namespace
        if batch:
            await _insert_batch(storage, namespace, batch, validate, tally)
        yield namespace


async def _insert_batch(
    storage: Storage,
    namespace: str,
    batch: list[tuple[bytes, bytes]],
    validate: Validate | None,
    tally: _Tally,
) -> None:
    accepted = batch
    if validate is not None:
        accepted = [(k, v) for k, v in batch if validate(namespace, k, v)]
        tally.rejected += len(batch) - len(accepted)
    summary = await storage.insert_many(accepted, Origin.IMPORTED)
    size = sum(len(k) + len(v) for k, v in accepted)
    # insert_many counts but does not name what it stored; when only some
    # were, their bytes are estimated by their share of the batch.
    stored_bytes = (
        size
        if summary.stored == len(accepted)
        else (size * summary.stored // max(len(accepted), 1))
    )
    tally.add_imported(namespace, summary.stored, stored_bytes)
    tally.skipped += summary.conflict
    tally.failed += summary.failed
    tally.done += len(batch)
    tally.bytes_done += sum(len(k) + len(v) for k, v in batch)


async def _copy_in_bulk(
    copier: AsyncGenerator[CopiedBatch, None], tally: _Tally
) -> AsyncGenerator[str, None]:
    async with aclosing(copier):
        async for batch in copier:
            for namespace, entries, size in batch.imported:
                tally.add_imported(namespace, entries, size)
            if batch.failed:
                tally.failed += batch.seen
            else:
                tally.skipped += batch.seen - sum(entries for _, entries, _ in batch.imported)
            tally.done += batch.seen
            tally.bytes_done += batch.seen_bytes
            if batch.seen:
                yield batch.last_namespace
