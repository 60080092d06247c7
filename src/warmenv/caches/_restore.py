"""Restoring a captured tree: its files written under a target, by the rules of `_paths`.

`restore(env, tree, target)` and `restore_trees(env, target, [(tree, directory), ...])`
(the API is described in `_tree`'s docstring, beside the tree it restores).
The design is one function per hop on the environment's SQLite thread that
reads the rows and writes the files: a hop costs more than writing a small
file, most of all on a loaded machine, and a page of rows fetched whole
costs fresh memory (page faults) that a row read at a time reuses. Every
safety rule is the `Writer`'s (`_paths`): relative paths only, directories
by descriptor without following a symlink, a temporary name renamed into
place, indexes after their tree's files, targets others could write refused.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread
import attrs

from warmenv._facts import PREFIX, captured_trees
from warmenv._fs import expand_home
from warmenv.bundle.signing import TrustLike, resolve_trust
from warmenv.caches._paths import Writer, relative_parts
from warmenv.caches._tree import (
    DEFAULT_BATCH_BYTES,
    CacheTree,
    LeftOut,
    RestoreReport,
    Skipped,
)
from warmenv.environment import Environment
from warmenv.persistence import Namespace, Origin
from warmenv.persistence.sqlite import schema, statistics
from warmenv.persistence.sqlite.database import SqliteDatabase
from warmenv.persistence.storage import EntryInfo

__all__ = ["restore", "restore_trees"]

log = logging.getLogger("warmenv.caches")


async def restore(
    env: Environment,
    tree: CacheTree,
    target: str | Path,
    *,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    trust: TrustLike = None,
) -> RestoreReport:
    """Write `tree`'s captured files under `target` (see the module's docstring).

    `trust` (`warmenv.bundle.signing`; `None`: the configuration's): when it
    requires a signature, a file is written only if it was captured here
    (origin LOCAL) or imported from a bundle whose signature by one of its
    keys was checked when it was imported; every other one (unsigned, signed
    by another key, from the shared tier) is in `report.refused`.
    """
    (report,) = await restore_trees(env, target, [(tree, "")], batch_bytes=batch_bytes, trust=trust)
    return report


async def restore_made(
    env: Environment, make: Callable[[], CacheTree], target: str | Path
) -> RestoreReport:
    """`restore` of the tree `make()` gives, made on the worker thread that checks the
    target (a tool's tree is named by this machine's facts, read from files: never on
    the event loop's thread nor SQLite's)."""
    into = expand_home(target, "the cache directory")
    done = await restore_planned(env, lambda: (into, [(make(), "")]))
    (report,) = done.reports
    return report


async def restore_trees(
    env: Environment,
    target: str | Path,
    trees: Sequence[tuple[CacheTree, str]],
    *,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    trust: TrustLike = None,
) -> tuple[RestoreReport, ...]:
    """`restore` of several trees under one target in one pass, a report per tree.

    Each `(tree, directory)` is written under `target/directory` (`""`: the
    target itself), in the order given: every file of a tree (its indexes
    last) before any of the next, as if restored one after the other. One
    pass means the fixed costs are paid once, not per tree: the target and
    its ancestors checked once (a tree's directory is then a directory in
    the target, never a symlink followed), the trust and the environment's
    namespaces read once.

    Two hops: the configuration's trust and the target's checks on a worker
    thread (files: one that hangs, a FIFO or a dead NFS mount, stops this
    restore only), then the rows and the files read and written in one
    function on the environment's SQLite thread, a batch of `batch_bytes` at
    a time (one hop for a small cache; each hop costs more than writing a
    small file, most of all on a loaded machine). Meanwhile the
    environment's other calls wait, at most a batch. An environment in
    memory reads its rows on the caller's thread (`_sqlite._memory`), so
    there the files are written on a worker thread of their own, never on
    the event loop's.
    """
    into = expand_home(target, "the cache directory")
    for _, directory in trees:
        _prefix(directory)  # refused before anything is done
    restored = await restore_planned(
        env, lambda: (into, trees), batch_bytes=batch_bytes, trust=trust
    )
    return restored.reports


Plan = Callable[[], tuple[Path, Sequence[tuple[CacheTree, str]]]]
"""What a restore writes, worked out on a worker thread before the pass: the target
(absolute or as the caller named it) and the trees, as `restore_trees` takes them."""


@attrs.frozen
class Restored:
    """What `restore_planned` did: a report per tree, and what the tools' namespaces hold."""

    trees: tuple[CacheTree, ...]
    reports: tuple[RestoreReport, ...]
    held: Mapping[str, int]
    """Every namespace of the trees' tools (`caches.<tool>/...`, under any facts), with its
    entries when the pass began: read anyway for `skipped`."""


async def restore_planned(
    env: Environment,
    plan: Plan,
    *,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    trust: TrustLike = None,
) -> Restored:
    """`restore_trees` of the target and trees `plan()` gives, called on the worker
    thread that checks the target, before the pass: a tool whose trees are named by
    this machine's facts reads them there, in the hop it needs anyway. Never on the
    environment's SQLite thread: a fact is read from files (a metadata file, every
    directory on `sys.path`), and a file that hangs (a dead NFS mount) would stop every
    call of the environment, not this restore alone."""
    started = time.monotonic()
    if env.remote is not None:  # values fetched from Redis reach the local rows first
        await env.remote.backfill.settle()
    restoring = _Restoring(env.database, plan, trust, batch_bytes)
    finished = False
    try:
        await anyio.to_thread.run_sync(restoring.prepare)
        while True:  # at least once: the target is checked (and made) with no tree too
            if env.in_memory:
                entries = await env.database.run(restoring.read_all)
                await anyio.to_thread.run_sync(restoring.write, entries)
            else:
                await env.database.run(restoring.step)
            if restoring.done:
                break
        finished = True
    finally:
        if not finished:  # failed or cancelled: the descriptors, after any hop in flight
            with anyio.CancelScope(shield=True):
                if env.in_memory:
                    await anyio.to_thread.run_sync(restoring.close)
                else:
                    await env.database.run(restoring.close_on)
    elapsed = time.monotonic() - started
    assert restoring.target is not None
    reports = tuple(
        RestoreReport(
            namespace=str(job.tree.namespace),
            target=restoring.target.joinpath(*job.prefix),
            written=job.counts.written,
            kept=job.counts.kept,
            bytes=job.counts.bytes,
            refused=tuple(job.counts.refused),
            skipped=_skipped(job.tree, restoring.held),
            elapsed=elapsed,
        )
        for job in restoring.jobs
    )
    return Restored(tuple(job.tree for job in restoring.jobs), reports, dict(restoring.held))


def _prefix(directory: str) -> tuple[str, ...]:
    if not directory:
        return ()
    parts = relative_parts(directory.encode())
    if isinstance(parts, str):
        raise ValueError(f"a tree's directory {directory!r} is refused: {parts}")
    return parts


@attrs.define
class _RestoreCounts:
    written: int = 0
    kept: int = 0
    bytes: int = 0
    refused: list[LeftOut] = attrs.Factory(list)


@attrs.define
class _Job:
    """One tree of a restore: where its files go and what became of them."""

    tree: CacheTree
    prefix: tuple[str, ...]
    counts: _RestoreCounts = attrs.Factory(_RestoreCounts)
    deferred: list[tuple[tuple[str, ...], bytes]] = attrs.Factory(list)


# An entry to write, in order: a tree's file, or (key None) the sign that its last
# file was read, so its indexes come now.
_Entry = tuple[_Job, bytes | None, bytes]


@attrs.define
class _Restoring:
    """One `restore_trees`, hop by hop: where its reading stands, and its writer.

    Driven from one thread at a time (the environment's SQLite thread, or a
    worker thread and the caller's for an environment in memory), in order.
    """

    database: SqliteDatabase
    plan: Plan
    trust: TrustLike
    batch_bytes: int
    target: Path | None = None
    jobs: list[_Job] = attrs.Factory(list)
    writer: Writer | None = None
    signed: set[str] | None = None
    """The digests of the bundles whose files may be written (`require_signature`), or None."""
    held: list[tuple[str, int]] = attrs.Factory(list)
    """The namespaces of the trees' tools, with their entries: what `skipped` is made of."""
    at: int = 0
    """The job being read."""
    after: bytes | None = None
    """The key its reading continues after."""
    keys: set[str] | None = attrs.field(default=None, init=False)
    """The trusted keys, when a signature is required."""
    began: bool = attrs.field(default=False, init=False)

    @property
    def done(self) -> bool:
        return self.writer is not None and self.at == len(self.jobs)

    def step(self, conn: sqlite3.Connection) -> None:
        """A hop on the SQLite thread: read the next `batch_bytes` and write them as they
        are read, one entry in memory at a time (`prepare` has run)."""
        try:
            with _small_cache(conn), contextlib.closing(self.read(conn)) as entries:
                self.write(entries)
        except BaseException:
            self.close()
            raise

    def read_all(self, conn: sqlite3.Connection) -> list[_Entry]:
        """The next `batch_bytes` of entries, held (an environment in memory's hop)."""
        return list(self.read(conn))

    def prepare(self) -> None:
        """The plan (the target and the trees), the trust (the configuration's, a file) and
        the target's checks: files, each of which may hang, so on a worker thread."""
        target, trees = self.plan()
        self.jobs = [_Job(tree, _prefix(directory)) for tree, directory in trees]
        self.target = target
        checked = resolve_trust(self.trust)
        if checked.require_signature:
            self.keys = {str(key) for key in checked.keys}
        self.writer = Writer(target)

    def read(self, conn: sqlite3.Connection) -> Generator[_Entry, None, None]:
        """The next entries, in order, up to `batch_bytes`; the first hop reads the signers
        and the namespaces too. Close it: its statement is open until then."""
        if not self.began:
            self.began = True
            self._read_first(conn)
        size = 0
        while not self.done:
            job = self.jobs[self.at]
            storage = self.database.storage(str(job.tree.namespace))
            if self.signed is None:
                rows = storage.entries_on(conn, self.after)
            else:
                rows = self._signed_only(storage.entries_with_info_on(conn, self.after), job)
            with contextlib.closing(rows):
                try:
                    for key, value in rows:
                        self.after = key
                        yield job, key, value
                        size += len(key) + len(value)
                        if size >= self.batch_bytes:
                            return
                except sqlite3.Error as exc:
                    log.warning("reading %s failed, restored in part: %s", storage.describe(), exc)
            yield job, None, b""
            self.at += 1
            self.after = None

    def _read_first(self, conn: sqlite3.Connection) -> None:
        if self.keys is not None:
            try:
                signers = schema.bundle_signers(conn)
            except sqlite3.Error as exc:
                log.warning("reading the bundle signers of %s failed: %s", self.database.path, exc)
                signers = {}
            self.signed = {d for d, key in signers.items() if key in self.keys}
        # Checked against the facts this restore was asked for, never recomputed: reading
        # a tool's version from its metadata costs milliseconds a fact, which made a
        # restore of a few small files several times slower than copying them.
        # Their entries are counted from the primary key's index alone: the sizes
        # `statistics.namespaces` adds would read every row's record first.
        for tool in dict.fromkeys(job.tree.tool for job in self.jobs):
            try:
                self.held += statistics.entry_counts(conn, under=PREFIX + tool)
            except sqlite3.Error as exc:
                log.warning("listing namespaces of %s failed: %s", self.database.path, exc)

    def _signed_only(
        self, rows: Generator[tuple[bytes, bytes, EntryInfo], None, None], job: _Job
    ) -> Generator[tuple[bytes, bytes], None, None]:
        """The entries captured here or imported from a bundle of `signed`; the others
        are counted as refused. Each value is judged by the provenance read with it, in
        the same query: read apart, an import between the two reads would have an
        unsigned value written under a signed one's provenance."""
        assert self.signed is not None
        with contextlib.closing(rows):
            for key, value, info in rows:
                if info.origin is Origin.LOCAL or (
                    info.origin is Origin.IMPORTED
                    and info.bundle is not None
                    and info.bundle.digest in self.signed
                ):
                    yield key, value
                else:
                    refused = LeftOut(key.decode("utf-8", "backslashreplace"), _UNSIGNED)
                    job.counts.refused.append(refused)

    def write(self, entries: Iterable[_Entry]) -> None:
        """Write the entries in order, each tree's indexes after its last file; close the
        writer after the last tree."""
        assert self.writer is not None
        for job, key, value in entries:
            if key is None:
                for parts, deferred in job.deferred:
                    _write_index(self.writer, job, parts, deferred)
                job.deferred.clear()
            else:
                _place(self.writer, job, key, value)
        if self.done:
            self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def close_on(self, conn: sqlite3.Connection) -> None:
        self.close()


_READ_CACHE_KIB: Final = 64


@contextlib.contextmanager
def _small_cache(conn: sqlite3.Connection) -> Iterator[None]:
    """The connection's page cache held to `_READ_CACHE_KIB` while a hop reads its rows.

    A restore reads each page once, so a larger cache keeps nothing it will
    use again; but every page it fills is new memory (a fresh process's
    SQLite thread grows its heap a page at a time: a system call and a page
    fault each), which was a third of reading Triton's 4 MB of kernels. The
    size before is set back after the hop; a smaller cache only drops pages.
    """
    before = conn.execute("PRAGMA cache_size").fetchone()[0]
    conn.execute(f"PRAGMA cache_size = -{_READ_CACHE_KIB}")
    try:
        yield
    finally:
        conn.execute(f"PRAGMA cache_size = {int(before)}")


def _skipped(tree: CacheTree, held: list[tuple[str, int]]) -> tuple[Skipped, ...]:
    """The namespaces of `tree`'s tool and part captured under other facts, with why."""
    namespace = tree.namespace
    others = [
        (full, entries)
        for full, entries in held
        if full != str(namespace) and _same_tree(full, namespace)
    ]
    return tuple(
        Skipped(check.namespace, check.entries, check.reasons or ("captured under other facts",))
        for check in captured_trees(others, here=tree.facts)
    )


_UNSIGNED = (
    "not from a bundle signed by a trusted key (require_signature): import it from a "
    "signed bundle, or capture it here"
)


def _same_tree(full: str, namespace: Namespace) -> bool:
    other = Namespace.raw(full)
    return (other.name, other.path) == (namespace.name, namespace.path)


def _place(writer: Writer, job: _Job, key: bytes, value: bytes) -> None:
    """Write an entry's file, or keep it back if it is an index, to be written after every
    other of its tree."""
    parts = relative_parts(key)
    if isinstance(parts, str):
        job.counts.refused.append(LeftOut(key.decode("utf-8", "backslashreplace"), parts))
        return
    placed = job.prefix + parts
    twin = writer.claim(placed)
    if twin is not None:
        job.counts.refused.append(LeftOut(key.decode("utf-8", "backslashreplace"), twin))
    elif job.tree.index and job.tree.is_index(parts):
        job.deferred.append((parts, value))
    else:
        _count(job, parts, value, writer.write(placed, value))


def _write_index(writer: Writer, job: _Job, parts: tuple[str, ...], value: bytes) -> None:
    rewrite = job.tree.rewrite
    if rewrite is not None:
        rewritten = rewrite(writer, job.prefix + parts, value)
        if isinstance(rewritten, str):
            job.counts.refused.append(LeftOut("/".join(parts), rewritten))
            return
        value = rewritten
    _count(job, parts, value, writer.write(job.prefix + parts, value))


def _count(job: _Job, parts: tuple[str, ...], value: bytes, outcome: bool | str) -> None:
    """What became of a file `Writer.write` was given, in its tree's report."""
    if isinstance(outcome, str):
        job.counts.refused.append(LeftOut("/".join(parts), outcome))
    elif outcome:
        job.counts.written += 1
        job.counts.bytes += len(value)
    else:
        job.counts.kept += 1
