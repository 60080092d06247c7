"""Export: write the entries of one or more environments into a bundle file.

Several sources merge into one sorted stream (first source wins on a
repeated namespace and key), read twice under one snapshot per source: once
for the counts and sizes (the flat format puts its index before its data,
and progress events want totals), once to write. Memory holds one batch per
source, whatever the bundle's size.

Bundles are written in format 2 by default: each entry carries its
`written_at` and `cost` from the source environment (unknown where the
source has none, or holds a value no reader would believe), covered by the
digest, so a hit on the entry after an import counts the time it saved.
`format_version=1` writes what warmenv 0.1 wrote instead, for a fleet whose
readers know only format 1 (they refuse format 2): the entries alone, under
the format-1 digest, so what they carry is dropped and a hit on them after
an import saves nothing that statistics can count.

`sign=` signs the bundle (`warmenv.bundle.signing`): the manifest is
written with a placeholder signature of the final length, and signed, with
its digest, once the last entry is written. In format 2 the manifest also
lists the namespaces the bundle holds (known from the first pass), and both
formats write it ahead of the entries, so an import by URL reads it, and may
refuse a stale bundle, by a range request for the file's first bytes.

The bundle is written to a staging file beside `out`, synced, and renamed
onto `out` only when complete, so a failed, cancelled or killed export leaves
the previous bundle (or nothing) at `out`. Staging files that a killed export
left behind are removed by the next export to the same `out`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Unpack, final

import anyio
import anyio.to_thread
import attrs

from warmenv._faces import AsyncOnly, async_with_only
from warmenv._fs import check_output_directory, expand_home, missing_link, non_regular_kind
from warmenv.bundle import _files, formats
from warmenv.bundle.base import (
    FORMAT_VERSIONS,
    BundleFormat,
    CarriedRow,
    PackedRow,
    StagingCopier,
    StagingWriter,
)
from warmenv.bundle.errors import InvalidSourceError, NotABundleError
from warmenv.bundle.events import (
    BundleFinished,
    BundleProgress,
    BundleStarted,
    EventStream,
    ExportEvent,
    ExportReport,
)
from warmenv.bundle.manifest import (
    DIGEST_PLACEHOLDER,
    BackgroundDigest,
    BundleManifest,
    listing,
    now_iso,
    this_machine,
)
from warmenv.bundle.options import ExportOptions, refuse_unknown
from warmenv.bundle.signing import SigningKey
from warmenv.bundle.sqlite.sources import reading
from warmenv.environment import Environment
from warmenv.persistence.namespace import check_version
from warmenv.persistence.sqlite.export import ExportSources
from warmenv.persistence.storage import NamespaceSummary

__all__ = ["BundleFormat", "ExportProgress", "export_bundle", "exporting"]

# A step (one hop to a worker thread, one progress event, one batch for the digest's
# thread) holds at most 1,024 entries and about 4 MiB of them: large entries never put
# more than a few MiB in memory at once (1,024 entries of 10 MiB were 10 GiB). Small
# entries keep 1,024 a step: steps of 4 MiB of 1 KiB entries took the same CPU a byte
# but two to five times the wall time at load 13 (their rows and frames no longer in
# the CPU's caches when read back and hashed, it seems), so fewer hops were no gain.
_STEP_BYTES = 4 << 20
_STEP_ROWS = 1024

Source = Environment | str | Path


async def export_bundle(
    sources: Source | Sequence[Source], out: str | Path, **options: Unpack[ExportOptions]
) -> ExportReport:
    """Write the entries of `sources` to the bundle `out`; see the module docstring.

    `options` are the keywords of every export (`ExportOptions`): `name` and
    `version` (the application's version, recorded in the manifest) are
    required. `format_version=1` writes a bundle that readers of format 1
    (warmenv 0.1) accept, without each entry's written_at and cost. `sign` (a
    `SigningKey`, or the path of a private key file `warmenv keygen` wrote)
    signs the bundle.
    """
    refuse_unknown(options, "export_bundle", ExportOptions)
    async with exporting(sources, out, **options) as progress:
        async for _ in progress:
            pass
    return progress.report


def exporting(
    sources: Source | Sequence[Source], out: str | Path, **options: Unpack[ExportOptions]
) -> AbstractAsyncContextManager[ExportProgress]:
    """`async with exporting(...) as progress: async for event in progress:` runs the export.

    The export advances as the events are consumed. Leaving the block without
    having read an event runs it to its end, as `export_bundle` would;
    leaving it early (a `break`, an error, cancellation) publishes nothing:
    `out` is as it was, the staging file is removed, and `progress.report`
    raises `NotFinishedError`.

    `options` are `ExportOptions`; this is where their defaults apply. An
    unknown keyword, or a missing `name` or `version`, is `TypeError` here,
    at the call; their values are checked as the block is entered.
    """
    refuse_unknown(options, "exporting", ExportOptions)
    return AsyncOnly(_exporting(sources, out, options), _EXPORTING_FORM, _EXPORTING)


_EXPORTING_FORM = "exporting(sources, out, name=...) as progress"
_EXPORTING = async_with_only("exporting(...)", _EXPORTING_FORM)


@asynccontextmanager
async def _exporting(
    sources: Source | Sequence[Source], out: str | Path, options: ExportOptions
) -> AsyncIterator[ExportProgress]:
    name = options["name"]
    version: str | None = options["version"]
    format = options.get("format", BundleFormat.SQLITE)
    namespaces = options.get("namespaces")
    environments = options.get("environments")
    format_version = options.get("format_version", 2)
    sign = options.get("sign")
    try:
        bundle_format = BundleFormat(format)
    except ValueError:
        raise ValueError(f"unknown bundle format {format!r}; use 'sqlite' or 'flat'") from None
    # A bool is an int to Python, but format_version=True is a mistake, not format 1.
    if type(format_version) is not int or format_version not in FORMAT_VERSIONS:
        raise ValueError(
            f"unknown bundle format version {format_version!r}; use 2 (the default) or 1 "
            "(for readers of format 1, such as warmenv 0.1)"
        )
    if not isinstance(name, str) or not name:
        raise ValueError("a bundle needs a non-empty name")
    if version is None:
        raise TypeError(
            "export_bundle() needs version=: pass your application's own version, "
            'e.g. version="1.2" (warmenv never substitutes its own)'
        )
    check_version(version)  # the one rule: what namespaces of that version can hold
    manifest = BundleManifest(
        name=name,
        version=version,
        created=now_iso(),
        environments=tuple(environments) if environments is not None else (this_machine(),),
        digest=DIGEST_PLACEHOLDER,
    )
    signer = sign
    if sign is not None and not isinstance(sign, SigningKey):  # a key file: read it first
        signer = await anyio.to_thread.run_sync(SigningKey.load, sign)
    assert signer is None or isinstance(signer, SigningKey)
    if signer is not None:
        manifest = signer.placeholder(manifest)
    manifest.check_readable()
    paths = await anyio.to_thread.run_sync(_source_paths, _as_list(sources))
    job = _ExportJob(paths, Path(out), bundle_format, format_version, namespaces, manifest)
    job.signer = signer
    progress = ExportProgress(job)
    try:
        yield progress
        await progress.finish()
    finally:
        with anyio.CancelScope(shield=True):
            await progress.aclose()


def _as_list(sources: Source | Sequence[Source]) -> list[Source]:
    if isinstance(sources, Environment | str | Path):
        return [sources]
    return list(sources)


def _source_paths(sources: list[Source]) -> list[Path]:
    paths: list[Path] = []
    for source in sources:
        if isinstance(source, Environment):
            if source.in_memory:
                raise InvalidSourceError(
                    f"{source.describe()} lives in memory only; there is no file to export"
                )
            paths.append(source.path)
            continue
        path = expand_home(source)
        if path.is_dir():
            found = sorted(p for p in path.glob("*.db") if p.is_file())
            if not found:
                raise InvalidSourceError(f"{path} holds no environment (*.db) to export")
            paths.extend(found)
        elif path.is_file():
            _refuse_bundle(path)
            paths.append(path)
        elif (kind := non_regular_kind(path)) is not None:
            raise InvalidSourceError(f"{path} is {kind}, not an environment database")
        elif (dangling := missing_link(path)) is not None:
            raise InvalidSourceError(f"{dangling}; {_SOURCES}")
        else:
            raise InvalidSourceError(f"{path} does not exist; {_SOURCES}")
    if not paths:
        raise InvalidSourceError("no sources given to export")
    return paths


_SOURCES = "give an environment's .db file or a root of them"


def _refuse_bundle(path: Path) -> None:
    """Refuse a bundle given as a source: a bundle is imported into an environment, and
    that is exported. Reading one as a source (SQLite's can be read as an environment of
    version 1) would drop its signature and claim its entries for this machine, and one
    given there is most often OUT and SOURCE swapped (`export env b.bundle`)."""
    try:
        fd = _files.open_regular(path)
    except (NotABundleError, OSError):
        return  # the source's own open says what is wrong with it
    try:
        head = _files.read_head(fd)
    finally:
        os.close(fd)
    found = formats.sniff(head)
    if found is None or formats.is_environment(head):
        return  # an environment, or no bundle: the source's own open says what it is
    if found.is_bundle(path):
        raise InvalidSourceError(
            f"{path} is a warmenv bundle, not an environment: export reads environments; "
            f"import it into one first (`warmenv import {path} --env NAME`), then export that"
        )


@final
class ExportProgress(EventStream[ExportReport]):
    """The events of one export; `report` once it has finished."""

    _operation = "export"

    def __init__(self, job: _ExportJob) -> None:
        # The job opens nothing until started, so holding it from here on
        # means every file it creates can be cleaned up by aclose().
        self._job = job
        super().__init__()

    def _not_finished(self) -> str:
        if self._started and self._closed:
            return (
                f"the export was stopped before it finished; nothing was published and "
                f"'{self._job.out}' is as it was"
            )
        return super()._not_finished()

    async def _run(self) -> AsyncGenerator[ExportEvent, None]:
        started_at = time.perf_counter()
        job = self._job
        await anyio.to_thread.run_sync(job.start)
        yield BundleStarted(tuple(job.totals), job.total_entries, job.total_bytes)
        while (step := await anyio.to_thread.run_sync(job.step)) is not None:
            yield BundleProgress(step, job.done, job.total_entries, job.bytes_done, job.total_bytes)
        manifest = await anyio.to_thread.run_sync(job.commit)
        report = ExportReport(
            manifest=manifest,
            path=job.out,
            entries=job.total_entries,
            bytes=job.total_bytes,
            namespaces=tuple(
                NamespaceSummary(ns, entries, size) for ns, (entries, size) in job.totals.items()
            ),
            elapsed=time.perf_counter() - started_at,
            left_out=job.skipped,
        )
        self._report = report
        yield BundleFinished(report)

    async def aclose(self) -> None:
        """Stop the export if it is still running and remove its staging file."""
        await super().aclose()
        await anyio.to_thread.run_sync(self._job.abandon)


class _ExportJob:
    """The synchronous export, advanced one batch at a time from worker threads."""

    def __init__(
        self,
        sources: list[Path],
        out: Path,
        format: BundleFormat,
        format_version: int,
        prefixes: list[str] | None,
        manifest: BundleManifest,
    ) -> None:
        self.out = out
        self.format = formats.of(format)
        self.format_version = format_version
        self.manifest = manifest
        self.done = self.bytes_done = 0
        self.skipped = 0
        self.staging: Path | None = None
        self._staging_lock: int | None = None
        self._output: StagingWriter | None = None
        # Where the format fills the bundle from its one source itself (SQLite's copy
        # inside SQLite); the digest is then taken from the rows as written.
        self._copier: StagingCopier | None = None
        self._sources_reader: ExportSources | None = None
        self._rows: Iterator[CarriedRow] = iter(())
        self._digest = BackgroundDigest(format_version)
        self._sources = sources
        self._prefixes = prefixes
        self._sources_named = ", ".join(map(str, sources))  # how errors reading them say it
        self.totals: dict[str, tuple[int, int]] = {}
        self.total_entries = self.total_bytes = 0
        self._step_rows = _STEP_ROWS  # set from the totals by `start`
        self.signer: SigningKey | None = None

    def start(self) -> None:
        """Open the sources and the staging file, and count what will be written.

        Separate from `__init__` so the caller holds the job before any file
        exists: whatever happens from here on, `abandon()` can clean it up.
        """
        _check_out(self.out)
        _files.remove_stale(
            self.out.parent, prefix=f".{self.out.name}.", suffix=_files.STAGING_SUFFIX
        )
        try:
            sources = self._sources
            copier = None
            if len(sources) == 1:
                copier = self.format.copier(
                    self._new_staging,
                    sources[0],
                    self._prefixes,
                    format_version=self.format_version,
                    expected_bytes=self._expected_bytes(),
                )
            if copier is not None:
                self._output = self._copier = copier
                self.totals = copier.totals
                self.skipped = copier.skipped
                self._list_namespaces()
                copier.reserve(self.manifest)
            else:
                with reading(self._sources_named):
                    reader = self._sources_reader = ExportSources(sources, self._prefixes)
                    self.skipped = reader.skipped
                    self.totals = reader.totals()
                    self._rows = reader.rows()
                self._list_namespaces()
                self._output = self.format.writer(
                    self._new_staging(),
                    self.manifest,
                    self.totals,
                    format_version=self.format_version,
                    expected_bytes=self._expected_bytes(),
                )
            self.total_entries = sum(e for e, _ in self.totals.values())
            self.total_bytes = sum(b for _, b in self.totals.values())
            per_entry = max(1, self.total_bytes // max(1, self.total_entries))
            self._step_rows = min(_STEP_ROWS, max(1, _STEP_BYTES // per_entry))
        except BaseException:
            self.abandon()
            raise

    def _list_namespaces(self) -> None:
        """The manifest lists the namespaces the bundle will hold (format 2), so an import
        can refuse a stale bundle by its first bytes; format 1 is 0.1's manifest."""
        if self.format_version >= 2:
            self.manifest = listing(self.manifest, self.totals)

    def _new_staging(self) -> Path:
        # Claimed by its lock while it lives (`_files`): a cleaner beside it, in this
        # PID namespace or another, leaves it alone.
        self.staging, self._staging_lock = _files.new_staging(self.out)
        return self.staging

    def _expected_bytes(self) -> int:
        """What the bundle will hold, or before the totals are counted, the sources' size."""
        return sum(size for _, size in self.totals.values()) or sum(map(_size, self._sources))

    def step(self) -> str | None:
        """Write one batch; the last namespace written, or `None` when all are."""
        packed: list[PackedRow] | None = None  # what a writer stores: rows carried packed
        if self._copier is not None:
            batch = self._copier.copy_step(self._step_rows)  # the rows as written
        else:
            with reading(self._sources_named):
                batch = list(itertools.islice(self._rows, self._step_rows))
            packed = []
        if not batch:
            return None
        # One pass frames the batch for the digest, counts its bytes and packs it.
        self.bytes_done += self._digest.add_rows(batch, packed)
        if packed is not None:
            assert self._output is not None
            self._output.add(batch, packed)
        self.done += len(batch)
        return batch[-1][0]

    def commit(self) -> BundleManifest:
        """Finish the staging file, sync it and rename it onto `out`."""
        manifest = attrs.evolve(self.manifest, digest=self._digest.value())
        if self.signer is not None:
            manifest = self.signer.sign(manifest)
        assert self.staging is not None and self._output is not None
        self._output.finish(manifest)
        self._output = self._copier = None
        _check_out(self.out)  # something foreign may have appeared meanwhile
        os.replace(self.staging, self.out)
        self.staging = None
        self._release_staging()
        _files.fsync_dir(self.out.parent)
        self._close_sources()
        return manifest

    def abandon(self) -> None:
        """Close everything and remove the staging file (after failure or cancellation)."""
        self._digest.close()
        output, self._output, self._copier = self._output, None, None
        if output is not None:
            output.close()
        if self.staging is not None:
            with contextlib.suppress(FileNotFoundError):
                self.staging.unlink()
            self.staging = None
        self._release_staging()
        self._close_sources()

    def _release_staging(self) -> None:
        if self._staging_lock is not None:
            _files.release(self._staging_lock)
            self._staging_lock = None

    def _close_sources(self) -> None:
        if self._sources_reader is not None:
            self._sources_reader.close()
            self._sources_reader = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the source's own open says what is wrong with it


def _check_out(out: Path) -> None:
    """`out` may be replaced only if it is absent or already a warmenv bundle.

    Anything else is left as it is, and the refusal says what it is and to
    write elsewhere, never to remove it: a file that is not a bundle is not
    export's to judge (it may be a live environment, or someone's notes).
    """
    if not os.path.lexists(out):
        check_output_directory(out)
        return
    if out.is_dir():
        raise IsADirectoryError(
            f"{out} is a directory: give a bundle file to write, such as {out / 'NAME.bundle'}"
        )
    try:
        fd = _files.open_regular(out)
    except (NotABundleError, OSError) as exc:
        raise FileExistsError(
            f"'{out}' exists and is not a warmenv bundle ({exc}); it was left as it is: "
            f"{_ELSEWHERE}"
        ) from None
    try:
        head = _files.read_head(fd)
    finally:
        os.close(fd)
    found = formats.sniff(head)
    if found is not None and found.is_bundle(out):
        return
    if formats.is_environment(head):
        raise FileExistsError(
            f"'{out}' is environment {out.stem!r} (a warmenv environment database), not a "
            f"bundle; it was left as it is: {_ELSEWHERE}"
        )
    raise FileExistsError(
        f"'{out}' exists and is not a warmenv bundle; it was left as it is: {_ELSEWHERE}"
    )


_ELSEWHERE = "choose another path for the bundle"
