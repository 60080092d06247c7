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
scan batches into `Environment.insert_imported`. Either way memory stays
bounded by the batch size, whatever the bundle's size, and each entry keeps
the `written_at` and `cost` it carries (bundle format 2).

Before anything is written, the bundle's signature is checked against the
trust asked for (`trust=`, by default the configuration's `trusted_keys`
and `require_signature`; `warmenv.bundle.signing`), on the same private
copy; a bundle whose signature was checked always has its digest checked
too (`verify=False` notwithstanding), since the signature vouches for the
digest and only that check compares it with the entries.

A bundle named by an http(s) URL is downloaded into that private directory
instead of copied (`warmenv.bundle.download`), as the first steps of the
event stream (`Downloading` events, then `Started`), and the downloaded file
is the private copy that is verified and imported.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from pathlib import Path
from typing import Unpack, final

import anyio
import anyio.lowlevel

from warmenv._faces import AsyncOnly, async_with_only
from warmenv._facts import is_captured_tree
from warmenv._keys import PublicKey
from warmenv._url import is_url, redact
from warmenv.bundle.base import Bundle
from warmenv.bundle.download import Download, read_head
from warmenv.bundle.errors import CorruptBundleError
from warmenv.bundle.events import (
    BundleFinished,
    BundleProgress,
    BundleStarted,
    EventStreamBase,
    ImportEvent,
    ImportReport,
    Verifying,
)
from warmenv.bundle.manifest import BundleManifest
from warmenv.bundle.open import open_private, read_names
from warmenv.bundle.options import ImportOptions, Validate, check_options, refuse_unknown
from warmenv.bundle.preflight import of_version, stale
from warmenv.bundle.signing import Trust, check_signature, resolve_trust
from warmenv.environment import Environment
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.namespace import Namespace, matches_any
from warmenv.persistence.sqlite.bulk import CopiedBatch
from warmenv.persistence.storage import (
    BundleRef,
    NamespaceSummary,
)

__all__ = ["ImportProgress", "import_bundle", "importing"]

log = logging.getLogger("warmenv.bundle")


async def import_bundle(
    source: str | Path | Bundle, env: Environment, **options: Unpack[ImportOptions]
) -> ImportReport:
    """Import every entry of `source` (a path, an http(s) URL or an open bundle) into `env`.

    `options` are the keywords of every import (`ImportOptions`); see
    `importing` for what `version` and `share` do. A bundle whose signature
    `trust` refuses raises `SignatureError` before anything is written.
    """
    refuse_unknown(options, "import_bundle")
    async with importing(source, env, **options) as progress:
        async for _ in progress:
            pass
    return progress.report


def importing(
    source: str | Path | Bundle, env: Environment, **options: Unpack[ImportOptions]
) -> AbstractAsyncContextManager[ImportProgress]:
    """`async with importing(...) as progress: async for event in progress:` runs the import.

    The import advances as the events are consumed. Leaving the block early
    (a `break`, an error, cancellation) stops it after the last whole batch,
    and `progress.report` then says what was committed (`complete=False`).
    Leaving the block without having read an event runs the import to its
    end, as `import_bundle` would; leaving it with an error before reading
    any imports nothing.

    A URL is downloaded as the stream's first steps (`Downloading` events
    before `Started`); a download that fails, or is cancelled, leaves nothing.

    `version` (the application's version) imports only the namespaces whose
    version segment is that version, the only ones its lookups can hit; the
    others are named in the report (`other_versions`). A bundle holding
    none of that version raises `StaleBundleError` before anything is
    written, and before its body is downloaded or copied where its names can
    be read first: from the start of the file (by `Range` requests for a
    URL), where a flat bundle's header and the manifest of a SQLite bundle
    of format 2 list them, or a SQLite file's entries where it lies. A
    SQLite bundle by URL whose manifest lists none (exported before the
    list, or in format 1) is downloaded first, then refused.

    `share` (0 < share <= 1) bounds the import's share of the time while it
    runs: after each batch it pauses `busy * (1 - share) / share` seconds,
    `busy` being how long the batch took, so that a service importing in the
    background keeps the rest for its requests (the environment's one
    connection included, which every storage call of the process shares).
    The pauses are in `report.paused`; 1 (the default) never pauses.

    `options` are `ImportOptions`; this is where their defaults apply. They
    are checked here, at the call, before the block is entered (as
    `exporting` refuses its unknown keywords): an unknown keyword or a value
    of the wrong kind is one `TypeError` or `ValueError` line.
    """
    given = check_options(source, env, options, "importing")
    return AsyncOnly(_importing(source, env, options, given), _IMPORTING_FORM, _IMPORTING)


_IMPORTING_FORM = "importing(source, env) as progress"
_IMPORTING = async_with_only("importing(...)", _IMPORTING_FORM)


@asynccontextmanager
async def _importing(
    source: str | Path | Bundle, env: Environment, options: ImportOptions, given: Trust | None
) -> AsyncIterator[ImportProgress]:
    namespaces = options.get("namespaces")
    version = options.get("version")
    batch_size = options.get("batch_size", 1024)
    share = options.get("share", 1.0)
    validate = options.get("validate")
    verify = options.get("verify", True)
    download = options.get("download")
    trust = options.get("trust")
    checked = given if given is not None else await anyio.to_thread.run_sync(resolve_trust, trust)
    near = env.snapshot_directory()
    if is_url(source):
        assert isinstance(source, str)
        if version is not None or checked.checks:
            # The manifest comes first: refused by it, a bundle's body is never fetched (the
            # copy that is downloaded is checked again before anything is written).
            header, opened = await read_head(source, download)
            try:
                if header is not None:
                    # The signature first: under a trust, only a signed list is believed.
                    check_signature(header.manifest, checked, redact(source))
                    if version is not None and header.namespaces is not None:
                        refuse_stale(redact(source), list(header.namespaces), namespaces, version)
            except BaseException:
                if opened is not None:  # a server that ignored the range: its body not read on
                    await opened.aclose()
                raise
        else:
            opened = None
        progress = ImportProgress(
            Download(source, near, download, opened),
            env,
            namespaces,
            version,
            batch_size,
            share,
            validate,
            verify,
        )
        progress.trust = checked
        try:
            yield progress
            await progress.finish()
        finally:
            with anyio.CancelScope(shield=True):
                await progress.aclose()
        return
    if isinstance(source, str | os.PathLike):
        if version is not None:
            found = await read_names(Path(source))
            if found is not None and found.namespaces is not None:
                refuse_stale(os.fspath(source), list(found.namespaces), namespaces, version)
        bundle: Bundle = await open_private(Path(source), near, verified=verify)
        owned = True
    else:
        if version is not None:
            names = [s.namespace for s in await source.namespaces()]  # noqa: ASYNC240
            refuse_stale(source.describe(), names, namespaces, version)  # noqa: ASYNC240
        copy = await source.private_copy(near)  # noqa: ASYNC240 (a Bundle here)
        bundle, owned = (source, False) if copy is None else (copy, True)
    progress = ImportProgress(bundle, env, namespaces, version, batch_size, share, validate, verify)
    progress.trust = checked
    try:
        yield progress
        await progress.finish()
    finally:
        with anyio.CancelScope(shield=True):
            await progress.aclose()
            if owned:
                await bundle.aclose()


@final
class ImportProgress(EventStreamBase[ImportEvent, ImportReport]):
    """The events of one import; `report` once it has finished, or what it committed so far."""

    _operation = "import"

    def __init__(
        self,
        bundle: Bundle | Download,
        env: Environment,
        prefixes: list[str] | None,
        version: str | None,
        batch_size: int,
        share: float,
        validate: Validate | None,
        verify: bool,
    ) -> None:
        self._bundle = bundle
        self._env = env
        self._prefixes = prefixes
        self._version = version
        self._batch_size = batch_size
        self._validate = validate
        self._verify = verify
        self.trust = Trust()
        self._signer: PublicKey | None = None
        self._share = share
        self._tally: _Tally | None = None
        self._manifest: BundleManifest | None = None
        self._started_at = 0.0
        self._stopped_at: float | None = None
        super().__init__()

    @property
    def manifest(self) -> BundleManifest | None:
        """The bundle's manifest once the import has opened it (`None` before: a download)."""
        return self._manifest

    def _partial_report(self) -> ImportReport | None:
        if self._tally is None:
            return None
        return self._tally.report(
            self._started_at, self._stopped_at, complete=False, signer=self._signer
        )

    async def aclose(self) -> None:
        await super().aclose()
        if isinstance(self._bundle, Download):
            await self._bundle.release()  # if it never began
        if self._stopped_at is None:
            self._stopped_at = time.perf_counter()

    async def _run(self) -> AsyncGenerator[ImportEvent, None]:
        # Running from its first step (download and digest check included) to its
        # end: the stores' computations read their keys after each batch it lands.
        try:
            async with aclosing(self._steps()) as steps:
                async for step in steps:
                    yield step
        finally:
            self._env.arrivals.end()

    async def _steps(self) -> AsyncGenerator[ImportEvent, None]:
        download = self._bundle
        if not isinstance(download, Download):
            async with aclosing(self._import(download)) as events:
                async for event in events:
                    yield event
            return
        async with aclosing(download.fetch()) as fetching:
            async for step in fetching:
                yield step
        bundle = await download.open()  # from here the bundle owns the downloaded file
        try:
            async with aclosing(self._import(bundle)) as events:
                async for event in events:
                    yield event
        finally:
            with anyio.CancelScope(shield=True):
                await bundle.aclose()

    async def _import(self, bundle: Bundle) -> AsyncGenerator[ImportEvent, None]:
        # On the copy that is imported, before anything is written (or read but its header).
        signer = self._signer = check_signature(bundle.manifest, self.trust, bundle.describe())
        started_at = self._started_at = time.perf_counter()
        self._manifest = bundle.manifest
        tally = self._tally = _Tally()
        selected = [
            s for s in await bundle.namespaces() if matches_any(s.namespace, self._prefixes)
        ]
        prefixes = self._prefixes
        if self._version is not None:
            same, other = of_version([s.namespace for s in selected], self._version)
            if not same:
                raise stale(bundle.describe(), other, self._version)
            kept = set(same)
            selected = [s for s in selected if s.namespace in kept]
            tally.other_versions = tuple(other)
            prefixes = _version_prefixes(self._prefixes, same, self._version)
        total_entries = sum(s.entries for s in selected)
        total_bytes = sum(s.bytes for s in selected)
        yield BundleStarted(tuple(s.namespace for s in selected), total_entries, total_bytes)
        if self._verify or signer is not None:
            async with aclosing(_verifying(bundle)) as steps:
                async for step in steps:
                    yield step
        for summary in selected:
            tally.by_ns[summary.namespace] = (0, 0)
        # Stores computing a key this import may land re-read it after each batch.
        arrivals = self._env.arrivals
        # The namespaces the application has stores of first, the rest as listed.
        first = sorted(selected, key=lambda s: s.namespace not in arrivals.wanted)
        entry_file = bundle.entry_file
        copier = None
        if entry_file is not None and self._validate is None:
            copier = self._env.bulk_copy(
                entry_file,
                prefixes,
                self._batch_size,
                bundle=_ref(bundle, signer),
                first=[s.namespace for s in selected if s.namespace in arrivals.wanted],
            )
        if copier is not None:
            batches = _copy_in_bulk(copier, tally)
        else:
            batches = _copy_by_scan(
                bundle, self._env, first, tally, self._batch_size, self._validate, signer
            )
        pace = Pace(self._share)
        async with aclosing(batches):
            async for namespace in batches:
                arrivals.landed()
                yield BundleProgress(
                    namespace, tally.done, total_entries, tally.bytes_done, total_bytes
                )
                tally.paused += await pace.rest()
        report = tally.report(started_at, None, complete=True, signer=signer)
        self._report = report
        yield BundleFinished(report)


class _Tally:
    def __init__(self) -> None:
        self.imported = self.skipped = self.failed = self.rejected = 0
        self.imported_bytes = self.done = self.bytes_done = 0
        self.by_ns: dict[str, tuple[int, int]] = {}
        self.other_versions: tuple[str, ...] = ()
        self.paused = 0.0

    def add_imported(self, namespace: str, entries: int, size: int) -> None:
        old = self.by_ns.get(namespace, (0, 0))
        self.by_ns[namespace] = (old[0] + entries, old[1] + size)
        self.imported += entries
        self.imported_bytes += size

    def report(
        self,
        started_at: float,
        stopped_at: float | None,
        *,
        complete: bool,
        signer: PublicKey | None,
    ) -> ImportReport:
        ended = time.perf_counter() if stopped_at is None else stopped_at
        return ImportReport(
            namespaces=tuple(
                NamespaceSummary(ns, entries, size) for ns, (entries, size) in self.by_ns.items()
            ),
            imported=self.imported,
            skipped=self.skipped,
            failed=self.failed,
            rejected=self.rejected,
            bytes=self.imported_bytes,
            elapsed=ended - started_at,
            complete=complete,
            other_versions=self.other_versions,
            signer=signer,
            paused=self.paused,
        )


@final
class Pace:
    """Pauses between an import's batches that keep it to a `share` of the time.

    `clock` is the monotonic clock the batches are measured with (a test
    passes its own).
    """

    def __init__(self, share: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self._share = float(share)
        self._clock = clock
        self._since = clock()

    def pause(self) -> float:
        """How long to pause now: the time since the last pause ended, scaled by the share."""
        busy = max(0.0, self._clock() - self._since)
        return busy * (1 - self._share) / self._share

    async def rest(self) -> float:
        """Pause as `pause()` says (not at all with a share of 1); the seconds paused."""
        if self._share >= 1:
            return 0.0
        started = self._clock()
        await anyio.sleep(self.pause())
        self._since = self._clock()
        return self._since - started


def refuse_stale(label: str, names: list[str], prefixes: list[str] | None, version: str) -> None:
    """Raise `StaleBundleError` if no namespace selected of `names` is of `version`."""
    same, other = of_version([n for n in names if matches_any(n, prefixes)], version)
    if not same:
        raise stale(label, other, version)


def _version_prefixes(prefixes: list[str] | None, same: list[str], version: str) -> list[str]:
    """Prefixes that select, of the namespaces `prefixes` select, those of `version`.

    A few, however many namespaces: one per application name (`app/<version>`)
    or per prefix given, so a bulk copy's SQL condition stays small; and each
    captured compiler cache by its full name (their version segment is facts,
    which `version` does not decide: `of_version` kept them; a few per tool).
    """
    trees = [n for n in same if is_captured_tree(n)]
    if prefixes is None:
        apps = {f"{Namespace.raw(n).name}/{version}" for n in same if not is_captured_tree(n)}
        return sorted(apps) + trees
    narrowed: list[str] = []
    for prefix in prefixes:
        segments = prefix.strip("/").split("/")
        if segments == [""]:  # every namespace
            return _version_prefixes(None, same, version)
        if is_captured_tree(segments[0]):
            continue  # its trees selected are in `trees`
        if len(segments) == 1:
            narrowed.append(f"{segments[0]}/{version}")
        elif segments[1] == version:
            narrowed.append(prefix)
    return narrowed + trees


async def _verifying(bundle: Bundle) -> AsyncGenerator[Verifying, None]:
    try:
        async with aclosing(bundle.verifying()) as steps:  # type: ignore[type-var]
            async for step in steps:
                yield step
    except CorruptBundleError as exc:
        raise CorruptBundleError(f"{exc}; nothing was imported") from None


def _ref(bundle: Bundle, signer: PublicKey | None) -> BundleRef:
    """What the imported entries record as their provenance (for quarantine), with the
    trusted key whose signature was checked (for a restore that requires one)."""
    return BundleRef(
        bundle.manifest.name, bundle.manifest.digest, None if signer is None else str(signer)
    )


async def _copy_by_scan(
    bundle: Bundle,
    env: Environment,
    selected: list[NamespaceSummary],
    tally: _Tally,
    batch_size: int,
    validate: Validate | None,
    signer: PublicKey | None,
) -> AsyncGenerator[str, None]:
    ref = _ref(bundle, signer)
    for summary in selected:
        namespace = summary.namespace
        batch: list[CarryingEntry] = []
        scan = bundle.scan_with_provenance(namespace, batch_size)
        async with aclosing(scan):  # type: ignore[type-var]
            async for entry in scan:
                batch.append(entry)
                if len(batch) >= batch_size:
                    await _insert_batch(env, namespace, batch, validate, tally, ref)
                    batch = []
                    yield namespace
        if batch:
            await _insert_batch(env, namespace, batch, validate, tally, ref)
        yield namespace


async def _insert_batch(
    env: Environment,
    namespace: str,
    batch: list[CarryingEntry],
    validate: Validate | None,
    tally: _Tally,
    ref: BundleRef,
) -> None:
    accepted = batch
    if validate is not None:
        accepted = [entry for entry in batch if validate(namespace, entry[0], entry[1])]
        tally.rejected += len(batch) - len(accepted)
    # Shielded for the same reason as a bulk batch: the tally must match the commit.
    await anyio.lowlevel.checkpoint_if_cancelled()
    with anyio.CancelScope(shield=True):
        summary = await env.insert_imported(namespace, accepted, bundle=ref)
    size = sum(len(k) + len(v) for k, v, _, _ in accepted)
    # The insert counts but does not name what it stored; when only some
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
    tally.bytes_done += sum(len(k) + len(v) for k, v, _, _ in batch)


async def _copy_in_bulk(
    copier: AsyncGenerator[CopiedBatch, None], tally: _Tally
) -> AsyncGenerator[str, None]:
    async with aclosing(copier):
        while True:
            await anyio.lowlevel.checkpoint_if_cancelled()
            # A batch whose caller is cancelled still commits in the worker;
            # shielding the step (one batch) keeps the tally, and so a
            # partial report, equal to what was committed.
            with anyio.CancelScope(shield=True):
                batch = await anext(copier, None)
            if batch is None:
                return
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
