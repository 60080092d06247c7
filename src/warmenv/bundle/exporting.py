"""Export: write the entries of one or more environments into a bundle file.

Several sources merge into one sorted stream (first source wins on a
repeated namespace and key), read twice under one snapshot per source: once
for the counts and sizes (the flat format puts its index before its data,
and progress events want totals), once to write. Memory holds one batch per
source, whatever the bundle's size.

The bundle is written to a staging file beside `out`, synced, and renamed
onto `out` only when complete, so a failed, cancelled or killed export leaves
the previous bundle (or nothing) at `out`. Staging files that a killed export
left behind are removed by the next export to the same `out`.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import secrets
import sqlite3
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO, final

import anyio
import anyio.to_thread
import attrs

from warmenv.bundle.base import BundleError
from warmenv.bundle.events import Event, EventStream, ExportReport, Finished, Progress, Started
from warmenv.bundle.flat import FLAT_MAGIC, FlatWriter
from warmenv.bundle.manifest import (
    DIGEST_PLACEHOLDER,
    BackgroundDigest,
    BundleManifest,
    EnvironmentInfo,
    now_iso,
    this_machine,
)
from warmenv.bundle.sqlite import SQLITE_MAGIC, bundle_uri, read_head
from warmenv.environment import Environment
from warmenv.persistence.namespace import prefix_sql
from warmenv.persistence.sqlite import SCHEMA
from warmenv.persistence.storage import NamespaceSummary, Origin

__all__ = ["BundleFormat", "ExportProgress", "InvalidSourceError", "export_bundle", "exporting"]

_STAGING_SUFFIX = ".warmenv-staging"
_SOURCE = "warmenv_source"
_BATCH = 1024

Source = Environment | str | Path


class InvalidSourceError(BundleError):
    """An export source is not an environment, an environment database or a root."""


class BundleFormat:
    """The two bundle formats (`BundleFormat.SQLITE`, `BundleFormat.FLAT`)."""

    SQLITE = "sqlite"
    FLAT = "flat"


async def export_bundle(
    sources: Source | Sequence[Source],
    out: str | Path,
    *,
    name: str,
    format: str = BundleFormat.SQLITE,
    namespaces: list[str] | None = None,
    environments: Sequence[EnvironmentInfo] | None = None,
    version: str | None = None,
) -> ExportReport:
    """Write the entries of `sources` to the bundle `out`; see the module docstring."""
    async with exporting(
        sources,
        out,
        name=name,
        format=format,
        namespaces=namespaces,
        environments=environments,
        version=version,
    ) as progress:
        async for _ in progress:
            pass
    return progress.report


@asynccontextmanager
async def exporting(
    sources: Source | Sequence[Source],
    out: str | Path,
    *,
    name: str,
    format: str = BundleFormat.SQLITE,
    namespaces: list[str] | None = None,
    environments: Sequence[EnvironmentInfo] | None = None,
    version: str | None = None,
) -> AsyncIterator[ExportProgress]:
    """`async with exporting(...) as progress: async for event in progress:` runs the export."""
    if format not in (BundleFormat.SQLITE, BundleFormat.FLAT):
        raise ValueError(f"unknown bundle format {format!r}; use 'sqlite' or 'flat'")
    if not isinstance(name, str) or not name:
        raise ValueError("a bundle needs a non-empty name")
    from warmenv import __version__

    paths = await anyio.to_thread.run_sync(_source_paths, _as_list(sources))
    manifest = BundleManifest(
        name=name,
        version=__version__ if version is None else version,
        created=now_iso(),
        environments=tuple(environments) if environments is not None else (this_machine(),),
        digest=DIGEST_PLACEHOLDER,
    )
    progress = ExportProgress(_ExportJob(paths, Path(out), format, namespaces, manifest))
    try:
        yield progress
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
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*.db"))
            if not found:
                raise InvalidSourceError(f"{path} holds no environment (*.db) to export")
            paths.extend(found)
        elif path.is_file():
            paths.append(path)
        else:
            raise InvalidSourceError(f"{path} does not exist; name an environment, file or root")
    if not paths:
        raise InvalidSourceError("no sources given to export")
    return paths


@final
class ExportProgress(EventStream[ExportReport]):
    """The events of one export; `report` once it has finished."""

    _operation = "export"

    def __init__(self, job: _ExportJob) -> None:
        # The job opens nothing until started, so holding it from here on
        # means every file it creates can be cleaned up by aclose().
        self._job = job
        super().__init__()

    async def _run(self) -> AsyncGenerator[Event, None]:
        started_at = time.perf_counter()
        job = self._job
        await anyio.to_thread.run_sync(job.start)
        yield Started(tuple(job.totals), job.total_entries, job.total_bytes)
        while (step := await anyio.to_thread.run_sync(job.step)) is not None:
            yield Progress(step, job.done, job.total_entries, job.bytes_done, job.total_bytes)
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
        )
        self._report = report
        yield Finished(report)

    async def aclose(self) -> None:
        """Stop the export if it is still running and remove its staging file."""
        await super().aclose()
        await anyio.to_thread.run_sync(self._job.abandon)


def _open_source(path: Path) -> sqlite3.Connection:
    last: sqlite3.Error | None = None
    for immutable in (False, True):
        try:
            conn = sqlite3.connect(
                bundle_uri(path, immutable=immutable),
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute("BEGIN")  # one snapshot for both passes
            columns = [row[1] for row in conn.execute("PRAGMA table_info(entries)")]
            if columns[:3] != ["namespace", "key", "value"]:
                conn.close()
                raise InvalidSourceError(f"{path} is not a warmenv environment (no entries table)")
            return conn
        except sqlite3.Error as exc:
            last = exc
    raise InvalidSourceError(f"{path} cannot be read as a warmenv environment ({last})")


def _where(prefixes: list[str] | None) -> tuple[str, list[str]]:
    """Rows worth exporting: the right types, under the prefixes."""
    matches, params = prefix_sql(prefixes)
    types = "typeof(key) = 'blob' AND typeof(value) = 'blob' AND typeof(namespace) = 'text'"
    return f"{types} AND {matches}", params


def _merged(
    conns: list[sqlite3.Connection], columns: str, where: str, params: list[str]
) -> Iterator[tuple[str, bytes, object]]:
    """One sorted stream of (namespace, key, x) over every source, first source winning."""
    sql = f"SELECT namespace, key, {columns} FROM entries WHERE {where} ORDER BY namespace, key"

    def rows(conn: sqlite3.Connection) -> Iterator[tuple[str, bytes, object]]:
        cursor = conn.execute(sql, params)
        while batch := cursor.fetchmany(_BATCH):
            yield from batch

    if len(conns) == 1:  # one sorted source has nothing to merge or deduplicate
        yield from rows(conns[0])
        return
    previous: tuple[str, bytes] | None = None
    for row in heapq.merge(*(rows(c) for c in conns), key=lambda r: (r[0], r[1])):
        if previous is not None and (row[0], row[1]) == previous:
            continue
        previous = (row[0], row[1])
        yield row


def _totals(
    conns: list[sqlite3.Connection], where: str, params: list[str]
) -> dict[str, tuple[int, int]]:
    """Entries and bytes per namespace, as the merged stream will hold them."""
    if len(conns) == 1:
        rows = conns[0].execute(
            "SELECT namespace, count(*), coalesce(sum(length(key) + length(value)), 0) "
            f"FROM entries WHERE {where} GROUP BY namespace ORDER BY namespace",
            params,
        )
        return {namespace: (int(count), int(size)) for namespace, count, size in rows}
    totals: dict[str, tuple[int, int]] = {}
    for namespace, key, value_len in _merged(conns, "length(value)", where, params):
        entries, size = totals.get(namespace, (0, 0))
        totals[namespace] = (entries + 1, size + len(key) + int(value_len))  # type: ignore[call-overload]
    return totals


class _ExportJob:
    """The synchronous export, advanced one batch at a time from worker threads."""

    def __init__(
        self,
        sources: list[Path],
        out: Path,
        format: str,
        prefixes: list[str] | None,
        manifest: BundleManifest,
    ) -> None:
        self.out = out
        self.format = format
        self.manifest = manifest
        self.done = self.bytes_done = 0
        self.staging: Path | None = None
        self._writer: FlatWriter | None = None
        self._sqlite: sqlite3.Connection | None = None
        self._file: BinaryIO | None = None
        self.conns: list[sqlite3.Connection] = []
        self._digest = BackgroundDigest()
        # One source into the SQLite format is copied inside SQLite; the digest
        # is then taken from the rows as written, read back while still cached.
        self._copy_from: tuple[str, bytes] | None = None
        self._copied_rowid = 0
        self._sources = sources
        self.where, self.params = _where(prefixes)

    def start(self) -> None:
        """Open the sources and the staging file, and count what will be written.

        Separate from `__init__` so the caller holds the job before any file
        exists: whatever happens from here on, `abandon()` can clean it up.
        """
        _check_out(self.out)
        _remove_stale_staging(self.out)
        try:
            sources = self._sources
            if self.format == BundleFormat.SQLITE and len(sources) == 1:
                self._start_sql_copy(sources[0])
            else:
                self.conns = [_open_source(p) for p in sources]
                self.totals = _totals(self.conns, self.where, self.params)
                self._rows = _merged(self.conns, "value", self.where, self.params)
                self._start_output()
            self.total_entries = sum(e for e, _ in self.totals.values())
            self.total_bytes = sum(b for _, b in self.totals.values())
        except BaseException:
            self.abandon()
            raise

    def _new_staging(self) -> Path:
        token = f"{os.getpid()}.{secrets.token_hex(4)}"
        self.staging = self.out.with_name(f".{self.out.name}.{token}{_STAGING_SUFFIX}")
        return self.staging

    def _staging_database(self) -> sqlite3.Connection:
        staging = self._new_staging()
        conn = sqlite3.connect(
            f"{staging.resolve().as_uri()}?mode=rwc",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )
        self._sqlite = conn
        conn.execute("PRAGMA journal_mode=OFF")  # a staging file: no rollback needed
        conn.execute("PRAGMA synchronous=OFF")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        return conn

    def _start_sql_copy(self, source: Path) -> None:
        conn = self._staging_database()
        for immutable in (False, True):
            try:
                conn.execute(
                    f"ATTACH DATABASE ? AS {_SOURCE}", (bundle_uri(source, immutable=immutable),)
                )
                columns = [r[1] for r in conn.execute(f"PRAGMA {_SOURCE}.table_info(entries)")]
                break
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(f"DETACH DATABASE {_SOURCE}")
                error = exc
        else:
            raise InvalidSourceError(f"{source} cannot be read as a warmenv environment ({error})")
        if columns[:3] != ["namespace", "key", "value"]:
            raise InvalidSourceError(f"{source} is not a warmenv environment (no entries table)")
        conn.execute("BEGIN")  # one snapshot of the source for the totals and the copy
        rows = conn.execute(
            "SELECT namespace, count(*), coalesce(sum(length(key) + length(value)), 0) "
            f"FROM {_SOURCE}.entries WHERE {self.where} GROUP BY namespace ORDER BY namespace",
            self.params,
        )
        self.totals = {namespace: (int(count), int(size)) for namespace, count, size in rows}
        self._copy_from = ("", b"")

    def _start_output(self) -> None:
        if self.format == BundleFormat.FLAT:
            handle = open(self._new_staging(), "wb+")
            self._file = handle
            entries = sum(e for e, _ in self.totals.values())
            size = sum(b for _, b in self.totals.values())
            self._writer = FlatWriter(handle, self.manifest, sorted(self.totals), entries, size)
        else:
            self._staging_database().execute("BEGIN")

    def step(self) -> str | None:
        """Write one batch; the last namespace written, or `None` when all are."""
        if self._copy_from is not None:
            return self._copy_step()
        batch: list[tuple[str, bytes, bytes]] = []
        for row in self._rows:
            batch.append(row)  # type: ignore[arg-type]
            if len(batch) >= _BATCH:
                break
        if not batch:
            return None
        self._digest.add(batch)
        size = sum(len(key) + len(value) for _, key, value in batch)
        self.bytes_done += size
        if self._writer is not None:
            add = self._writer.add
            for namespace, key, value in batch:
                add(namespace, key, value)
        else:
            assert self._sqlite is not None
            self._sqlite.executemany(
                f"INSERT INTO entries (namespace, key, value, origin) "
                f"VALUES (?, ?, ?, {int(Origin.IMPORTED)})",
                batch,
            )
        self.done += len(batch)
        return batch[-1][0]

    def _copy_step(self) -> str | None:
        conn = self._sqlite
        assert conn is not None and self._copy_from is not None
        after, params = "", list[object](self.params)
        if self._copied_rowid:  # past the first batch: continue after the last row copied
            after = " AND (namespace, key) > (?, ?)"
            params += self._copy_from
        conn.execute(
            "INSERT INTO main.entries (namespace, key, value, origin) "
            f"SELECT namespace, key, value, {int(Origin.IMPORTED)} FROM {_SOURCE}.entries "
            f"WHERE {self.where}{after} ORDER BY namespace, key LIMIT {_BATCH}",
            params,
        )
        rows = conn.execute(
            "SELECT rowid, namespace, key, value FROM main.entries WHERE rowid > ? ORDER BY rowid",
            (self._copied_rowid,),
        ).fetchall()
        if not rows:
            return None
        self._digest.add((namespace, key, value) for _, namespace, key, value in rows)
        size = sum(len(key) + len(value) for _, _, key, value in rows)
        last = rows[-1]
        self._copied_rowid = last[0]
        self._copy_from = (last[1], last[2])
        self.bytes_done += size
        self.done += len(rows)
        return str(last[1])

    def commit(self) -> BundleManifest:
        """Finish the staging file, sync it and rename it onto `out`."""
        manifest = attrs.evolve(self.manifest, digest=self._digest.value())
        assert self.staging is not None
        if self._writer is not None:
            self._writer.finish(manifest.digest)
            handle = self._file
            assert handle is not None
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            self._file = None
        else:
            conn = self._sqlite
            assert conn is not None
            conn.execute(
                "INSERT INTO meta (k, v) VALUES ('schema_version', '1'), ('manifest', ?)",
                (manifest.to_json().decode("utf-8"),),
            )
            conn.execute("COMMIT")
            if self._copy_from is not None:
                conn.execute(f"DETACH DATABASE {_SOURCE}")
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.close()
            self._sqlite = None
            with open(self.staging, "rb+") as handle:
                os.fsync(handle.fileno())
        _check_out(self.out)  # something foreign may have appeared meanwhile
        os.replace(self.staging, self.out)
        self.staging = None
        _fsync_dir(self.out.parent)
        self._close_sources()
        return manifest

    def abandon(self) -> None:
        """Close everything and remove the staging file (after failure or cancellation)."""
        self._digest.close()
        if self._sqlite is not None:
            with contextlib.suppress(sqlite3.Error):
                self._sqlite.close()
            self._sqlite = None
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        if self.staging is not None:
            with contextlib.suppress(FileNotFoundError):
                self.staging.unlink()
            self.staging = None
        self._close_sources()

    def _close_sources(self) -> None:
        for conn in getattr(self, "conns", []):
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self.conns = []


def _check_out(out: Path) -> None:
    """`out` may be replaced only if it is absent or already a warmenv bundle."""
    if not out.exists() and not out.is_symlink():
        if not out.parent.is_dir():
            raise FileNotFoundError(f"{out.parent} does not exist; create it first")
        return
    if out.is_dir() or not _is_bundle_file(out):
        raise FileExistsError(f"'{out}' exists and is not a warmenv bundle; remove it first")


def _is_bundle_file(path: Path) -> bool:
    try:
        head = read_head(path)
    except OSError:
        return False
    if head.startswith(FLAT_MAGIC):
        return True
    if head != SQLITE_MAGIC:
        return False
    try:
        conn = sqlite3.connect(bundle_uri(path), uri=True)
        try:
            row = conn.execute("SELECT 1 FROM meta WHERE k = 'manifest'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return row is not None


def _remove_stale_staging(out: Path) -> None:
    for staging in out.parent.glob(f".{out.name}.*{_STAGING_SUFFIX}"):
        pid_text = staging.name[len(out.name) + 2 :].split(".", 1)[0]
        if pid_text.isdigit() and _alive(int(pid_text)):
            continue  # another export to the same place is running right now
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
