"""The core every compiler cache shares: a directory tree captured into a namespace and restored.

A tool's cache directory becomes one namespace of the environment,
`caches.<tool>/<facts>/<part>`: each regular file is one entry, its key the
file's path relative to the cache directory (POSIX, UTF-8), its value the
file's bytes. The key never holds the machine's absolute path, so a tree
captured at `/home/ci/.cache/jax` restores to `/srv/app/cache` on another
machine; the version segment holds the `Facts` that decide whether the
files can hit (the tool's version, CPU, Python, ...), so files captured
under other facts are another namespace and never restored here. They are
reported as skipped, each with its reasons. From there a namespace travels
like any other: exported into a bundle, imported, served by the shared tier.

The API (used by `directory.py` and by each tool's module):

- `CacheTree(tool, facts, part="files", index=(), exclude=(), include=())`:
  which namespace a tree lives in, which files are indexes naming others
  (written last on restore: a compiler that finds the index finds its
  children), which files are never captured and, if given, the only ones
  that are (fnmatch patterns on the file's name).
- `await capture(env, tree, source) -> CaptureReport`: store every regular
  file under `source` (symlinks and special files are left out, named, and
  so is a file or directory another user owns or can write: restored, it
  would be trusted as this machine's own; `_paths.swappable`, the rule a
  restore applies to its target);
  a file whose bytes changed since the last capture replaces its entry.
- `await restore(env, tree, target) -> RestoreReport`: write the
  namespace's files under `target`, never overwriting a file already there
  (this machine's own wins), every file whole or not at all, under the
  rules in `_paths.py` for hostile input (a bundle is code: see
  docs/caches.md). Namespaces of the same tool and part under other facts
  are listed in `report.skipped` with why they cannot hit here. Under
  `require_signature` (the configuration's, or `trust=`), only files
  captured here or imported from a bundle whose signature by a trusted key
  was checked at import are written; the rest are refused, named.
- `await restore_trees(env, target, [(tree, directory), ...])`: several
  trees under one target (each in a directory of it, `""` the target
  itself) in one pass, in order, with the fixed costs (the target's
  checks, the trust, the namespaces, the worker-thread hops) paid once.
- `await record_hits(env, tree, served, misses)`: count a tool's own hits,
  per entry it served (`{relative path: hits}`), as hits of those entries
  in the environment's statistics (`warmenv stats`, per namespace, origin
  and bundle), and its own misses as the namespace's, through an ordinary
  `Store` over the namespace.
- `captured_trees(namespaces)` (in `warmenv._facts`, a floor below
  `bundle`, so that preflight reads it without this package) reads (namespace, entries)
  pairs, an environment's or a bundle's, as `TreeCheck` values: per
  captured tree, whether it can hit on this machine and why not.

Neither blocks the event loop or holds a large cache in memory whole: a
capture reads files on worker threads in batches (`batch_bytes`); a restore
reads the rows and writes the files in one function on the environment's
SQLite thread, one hop per `batch_bytes` (one for a small cache), each
value written as it is read.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final, final

import anyio
import anyio.to_thread
import attrs

from warmenv._facts import PREFIX, Facts, captured_trees
from warmenv._fs import expand_home
from warmenv._text import plural
from warmenv.bundle.signing import TrustLike, resolve_trust
from warmenv.caches._paths import (
    DIRECTORY_FLAGS,
    TEMPORARY_PREFIX,
    Writer,
    open_tree,
    read_files,
    relative_parts,
    swappable,
)
from warmenv.environment import Environment
from warmenv.persistence import (
    BytesCodec,
    CacheMode,
    Failed,
    Namespace,
    Origin,
    Storage,
)
from warmenv.persistence.sqlite import schema, statistics
from warmenv.persistence.sqlite.database import SqliteDatabase
from warmenv.persistence.storage import EntryInfo

__all__ = [
    "CacheTree",
    "CaptureReport",
    "LeftOut",
    "RestoreReport",
    "Skipped",
    "capture",
    "record_hits",
    "restore",
    "restore_trees",
]

DEFAULT_BATCH_BYTES: Final = 16 * 1024 * 1024
MAX_FILE_BYTES: Final = 512 * 1024 * 1024
_TOOL = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\Z")


@final
@attrs.frozen
class CacheTree:
    """Where one tool's cache directory lives in an environment, and how it is restored."""

    tool: str
    """The tool's name (`jax`); the namespace's name is `caches.<tool>`."""
    facts: Facts
    """What decides a hit; the namespace's version segment."""
    part: str = "files"
    """The namespace's path: a tool may keep several trees (`files`, `kernels`)."""
    index: tuple[str, ...] = ()
    """Patterns of file names that name other files: restored after every other file."""
    exclude: tuple[str, ...] = ()
    """Patterns of file names never captured (locks, logs, the tool's own temporaries)."""
    include: tuple[str, ...] = ()
    """Patterns of the only file names captured (none: all not excluded); directories all walked."""
    cost: Callable[[bytes], float | None] | None = attrs.field(default=None, eq=False)
    """What the tool records, in a captured file, that computing it took (seconds), or None:
    stored as the entry's `cost`, so a hit on it saves that in the statistics."""
    rewrite: Callable[[Writer, tuple[str, ...], bytes], bytes | str] | None = attrs.field(
        default=None, eq=False
    )
    """What an index file becomes on restore, or None (as captured): given the writer
    (its target; `Writer.mode_at` says what is at a path it names) and the
    index's path under the target, its bytes, or why it is refused. Triton's
    indexes name their files by absolute path on this machine."""

    def __attrs_post_init__(self) -> None:
        if not _TOOL.match(self.tool):
            raise ValueError(
                f"tool name {self.tool!r} must be 1-64 lower-case letters, digits, '_' or '-'"
            )
        if not self.part or self.part.startswith("/") or "//" in self.part:
            raise ValueError(f"part {self.part!r} must be a relative path such as 'files'")

    @property
    def namespace(self) -> Namespace:
        return Namespace(PREFIX + self.tool, self.part, version=self.facts.segment)

    def is_index(self, parts: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatchcase(parts[-1], pattern) for pattern in self.index)

    def is_included(self, name: str) -> bool:
        return not self.include or any(
            fnmatch.fnmatchcase(name, pattern) for pattern in self.include
        )

    def is_excluded(self, name: str) -> bool:
        return name.startswith(TEMPORARY_PREFIX) or any(
            fnmatch.fnmatchcase(name, pattern) for pattern in self.exclude
        )


@attrs.frozen
class LeftOut:
    """A file not captured, or an entry not restored, and why."""

    path: str
    reason: str


# How many refused entries a report's `str()` spells out; the rest are counted.
REFUSED_SHOWN: Final = 10


def refused_lines(refused: tuple[LeftOut, ...]) -> list[str]:
    """A report's lines for what it refused: the first `REFUSED_SHOWN`, then how many more."""
    lines = [f"- refused {r.path!r}: {r.reason}" for r in refused[:REFUSED_SHOWN]]
    if len(refused) > REFUSED_SHOWN:
        lines.append(f"- and {len(refused) - REFUSED_SHOWN:,} more refused")
    return lines


@attrs.frozen
class Skipped:
    """A namespace of the same tree captured under other facts: it cannot hit here."""

    namespace: str
    entries: int
    reasons: tuple[str, ...]


@attrs.frozen
class CaptureReport:
    """What `capture` stored from one directory."""

    namespace: str
    source: Path
    files: int
    """Regular files found (those left out not counted)."""
    stored: int
    """New entries."""
    replaced: int
    """Entries whose file changed since the last capture."""
    unchanged: int
    failed: int
    """Files the storage could not take (full disk, read-only environment)."""
    bytes: int
    left_out: tuple[LeftOut, ...]
    elapsed: float

    def __str__(self) -> str:
        return (
            f"captured {plural(self.files, 'file')} ({plural(self.bytes, 'byte')}) from "
            f"'{self.source}' into "
            f"{self.namespace}: {self.stored} new, {self.replaced} changed, "
            f"{self.unchanged} unchanged"
            + (f", {self.failed} failed" if self.failed else "")
            + (f", {len(self.left_out)} left out" if self.left_out else "")
        )


@attrs.frozen
class RestoreReport:
    """What `restore` wrote into one directory, and what it would not."""

    namespace: str
    target: Path
    written: int
    kept: int
    """Entries whose file was already there (left as it was)."""
    bytes: int
    """Bytes written."""
    refused: tuple[LeftOut, ...]
    """Entries not written: an unsafe path, a symlink in the way, a case-folding twin."""
    skipped: tuple[Skipped, ...]
    """Namespaces of this tree captured under other facts."""
    elapsed: float

    def __str__(self) -> str:
        lines = [
            f"restored {plural(self.written, 'file')} ({plural(self.bytes, 'byte')}) from "
            f"{self.namespace} into "
            f"'{self.target}'"
            + (f", {self.kept} already there" if self.kept else "")
            + (f", {len(self.refused)} refused" if self.refused else "")
        ]
        lines += refused_lines(self.refused)
        for skipped in self.skipped:
            lines.append(
                f"- skipped {skipped.namespace} ({plural(skipped.entries, 'entry', 'entries')}): "
                + "; ".join(skipped.reasons)
            )
        return "\n".join(lines)


async def record_hits(
    env: Environment, tree: CacheTree, served: Mapping[str, int], misses: int = 0
) -> int:
    """Count a tool's hits per entry (`served`, by relative path) and its `misses` in `env`.

    Each hit is a lookup of that entry through a `Store`, so it is counted as
    every store's hits are (by origin, and for the bundle it came from); an
    entry the environment does not hold is not counted. `misses`, lookups
    the tool made in its cache and did not find (by its own counter, which
    names no entry), are counted as the store counts a lookup that found
    nothing, as misses of the tree's namespace. Returns the hits counted.
    """
    counted = 0
    store = await env.store(tree.namespace, BytesCodec(), CacheMode.LAZY)
    try:
        for _ in range(misses):
            store.held.missed()
        for relative, hits in served.items():
            for _ in range(hits):
                if await store.get(relative.encode()) is None:
                    break
                counted += 1
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()
    return counted


# --- capture -------------------------------------------------------------------------


async def capture(
    env: Environment,
    tree: CacheTree,
    source: str | Path,
    *,
    part: str = "",
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> CaptureReport:
    """Store every regular file under `source` in `tree`'s namespace of `env`.

    `part`: the subdirectory of `source` the tree is (torch's `fxgraph`), never
    followed if it is a symlink; `source` itself is the caller's path, followed."""
    started = time.monotonic()
    root = expand_home(source, "the cache directory")
    source = root / part if part else root
    storage = env.storage(tree.namespace)
    files, left_out = await anyio.to_thread.run_sync(_listing, root, part, tree)
    counts = _CaptureCounts()
    batch: list[tuple[str, int]] = []
    size = 0
    for relative, length in files:
        batch.append((relative, length))
        size += length
        if size >= batch_bytes:
            await _store_batch(storage, tree, (root, part), batch, counts, left_out)
            batch, size = [], 0
    if batch:
        await _store_batch(storage, tree, (root, part), batch, counts, left_out)
    return CaptureReport(
        namespace=str(tree.namespace),
        source=source,
        files=counts.files,
        stored=counts.stored,
        replaced=counts.replaced,
        unchanged=counts.unchanged,
        failed=counts.failed,
        bytes=counts.bytes,
        left_out=tuple(left_out),
        elapsed=time.monotonic() - started,
    )


@attrs.define
class _CaptureCounts:
    files: int = 0
    stored: int = 0
    replaced: int = 0
    unchanged: int = 0
    failed: int = 0
    bytes: int = 0


_SYMLINK: Final = "a symlink (only regular files are captured)"


def _listing(root: Path, part: str, tree: CacheTree) -> tuple[list[tuple[str, int]], list[LeftOut]]:
    """Every regular file of the tree (relative path, size), and what was left out.

    Walked through directory descriptors opened without following a symlink, so
    nothing outside the tree is read; a directory or file another user owns or can
    write is left out, named (`swappable`): captured, it would be restored as this
    machine's own."""
    files: list[tuple[str, int]] = []
    left_out: list[LeftOut] = []
    try:
        top = open_tree(root, part)
    except OSError:  # ELOOP, ENOTDIR: `part` is a symlink or no directory
        return files, [LeftOut(part, _SYMLINK)]
    if top is None:
        return files, left_out
    pending = [("", top)]
    while pending:
        relative, fd = pending.pop()
        try:
            why = swappable(os.fstat(fd))
            if why is not None:
                left_out.append(LeftOut(relative or part or ".", f"a directory that {why}"))
                continue
            _list_directory(fd, relative, tree, files, left_out, pending)
        finally:
            os.close(fd)
    files.sort()
    return files, left_out


def _list_directory(
    fd: int,
    relative: str,
    tree: CacheTree,
    files: list[tuple[str, int]],
    left_out: list[LeftOut],
    pending: list[tuple[str, int]],
) -> None:
    with os.scandir(fd) as entries:
        for entry in entries:
            path = f"{relative}/{entry.name}" if relative else entry.name
            if tree.is_excluded(entry.name):
                continue
            if not entry.is_dir(follow_symlinks=False) and not tree.is_included(entry.name):
                continue
            if entry.is_symlink():
                left_out.append(LeftOut(path, _SYMLINK))
            elif entry.is_dir(follow_symlinks=False):
                try:
                    pending.append((path, os.open(entry.name, DIRECTORY_FLAGS, dir_fd=fd)))
                except OSError:  # replaced since the listing (by a symlink?)
                    left_out.append(LeftOut(path, "changed while it was read"))
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                why = relative_parts(path.encode("utf-8", "surrogateescape"))
                if isinstance(why, str):
                    left_out.append(LeftOut(path, why))
                elif (owner := swappable(st)) is not None:
                    left_out.append(LeftOut(path, f"a file that {owner}"))
                elif st.st_size > MAX_FILE_BYTES:
                    left_out.append(LeftOut(path, f"larger than {MAX_FILE_BYTES:,} bytes"))
                else:
                    files.append((path, st.st_size))
            else:
                left_out.append(LeftOut(path, "not a regular file"))


async def _store_batch(
    storage: Storage,
    tree: CacheTree,
    tree_at: tuple[Path, str],
    batch: list[tuple[str, int]],
    counts: _CaptureCounts,
    left_out: list[LeftOut],
) -> None:
    read = await anyio.to_thread.run_sync(read_files, tree_at, batch)
    items: dict[bytes, bytes] = {}
    for relative, data in read:
        if isinstance(data, str):
            left_out.append(LeftOut(relative, data))
        else:
            items[relative.encode()] = data
    existing = await storage.get_many(items)
    new = [(key, value) for key, value in items.items() if key not in existing]
    counts.files += len(items)
    counts.bytes += sum(len(value) for value in items.values())
    by_cost: dict[float | None, list[tuple[bytes, bytes]]] = {}
    for key, value in new:
        by_cost.setdefault(None if tree.cost is None else tree.cost(value), []).append((key, value))
    for cost, items_of_cost in by_cost.items():
        summary = await storage.insert_many(items_of_cost, cost=cost)
        counts.stored += summary.stored
        counts.failed += summary.failed
        counts.unchanged += summary.conflict  # another writer stored it meanwhile
    for key, value in items.items():
        if key not in existing:
            continue
        if existing[key] == value:
            counts.unchanged += 1
        elif isinstance(await storage.replace(key, value), Failed):
            counts.failed += 1
        else:
            counts.replaced += 1


# --- restore -------------------------------------------------------------------------


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

    One hop: the configuration's trust, the target's checks, the rows and
    the files are read and written in one function on the environment's
    SQLite thread, a batch of `batch_bytes` at a time (one hop for a small
    cache; each hop costs more than writing a small file, most of all on a
    loaded machine). Meanwhile the environment's other calls wait, at most
    a batch. An environment in memory reads its rows on the caller's thread
    (`_sqlite._memory`), so there the files are written on a worker thread of
    their own, never on the event loop's.
    """
    started = time.monotonic()
    into = expand_home(target, "the cache directory")
    jobs = [_Job(tree, _prefix(directory)) for tree, directory in trees]
    if env.remote is not None:  # values fetched from Redis reach the local rows first
        await env.remote.backfill.settle()
    restoring = _Restoring(env.database, into, jobs, trust, batch_bytes)
    finished = False
    try:
        while True:  # at least once: the target is checked (and made) with no tree too
            if env.in_memory:
                if restoring.writer is None:
                    await anyio.to_thread.run_sync(restoring.prepare)
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
    return tuple(
        RestoreReport(
            namespace=str(job.tree.namespace),
            target=into.joinpath(*job.prefix),
            written=job.counts.written,
            kept=job.counts.kept,
            bytes=job.counts.bytes,
            refused=tuple(job.counts.refused),
            skipped=_skipped(job.tree, restoring.held),
            elapsed=elapsed,
        )
        for job in jobs
    )


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

log = logging.getLogger("warmenv.caches")


@attrs.define
class _Restoring:
    """One `restore_trees`, hop by hop: where its reading stands, and its writer.

    Driven from one thread at a time (the environment's SQLite thread, or a
    worker thread and the caller's for an environment in memory), in order.
    """

    database: SqliteDatabase
    target: Path
    jobs: list[_Job]
    trust: TrustLike
    batch_bytes: int
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
        return self.at == len(self.jobs)

    def step(self, conn: sqlite3.Connection) -> None:
        """A hop on the SQLite thread: read the next `batch_bytes` and write them as they
        are read, one entry in memory at a time (the first hop prepares too)."""
        try:
            if self.writer is None:
                self.prepare()
            with contextlib.closing(self.read(conn)) as entries:
                self.write(entries)
        except BaseException:
            self.close()
            raise

    def read_all(self, conn: sqlite3.Connection) -> list[_Entry]:
        """The next `batch_bytes` of entries, held (an environment in memory's hop)."""
        return list(self.read(conn))

    def prepare(self) -> None:
        """The trust (the configuration's, a file) and the target's checks."""
        checked = resolve_trust(self.trust)
        if checked.require_signature:
            self.keys = {str(key) for key in checked.keys}
        self.writer = Writer(self.target)

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
        for tool in dict.fromkeys(job.tree.tool for job in self.jobs):
            try:
                summaries = statistics.namespaces(conn, under=PREFIX + tool)
            except sqlite3.Error as exc:
                log.warning("listing namespaces of %s failed: %s", self.database.path, exc)
                continue
            self.held += [(summary.namespace, summary.entries) for summary in summaries]

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
    twin = writer.claim(job.prefix + parts)
    if twin is not None:
        job.counts.refused.append(LeftOut(key.decode("utf-8", "backslashreplace"), twin))
    elif job.tree.is_index(parts):
        job.deferred.append((parts, value))
    else:
        _write_one(writer, job, parts, value)


def _write_index(writer: Writer, job: _Job, parts: tuple[str, ...], value: bytes) -> None:
    rewrite = job.tree.rewrite
    if rewrite is not None:
        rewritten = rewrite(writer, job.prefix + parts, value)
        if isinstance(rewritten, str):
            job.counts.refused.append(LeftOut("/".join(parts), rewritten))
            return
        value = rewritten
    _write_one(writer, job, parts, value)


def _write_one(writer: Writer, job: _Job, parts: tuple[str, ...], value: bytes) -> None:
    outcome = writer.write(job.prefix + parts, value)
    if isinstance(outcome, str):
        job.counts.refused.append(LeftOut("/".join(parts), outcome))
    elif outcome:
        job.counts.written += 1
        job.counts.bytes += len(value)
    else:
        job.counts.kept += 1
