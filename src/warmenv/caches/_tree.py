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

Both functions run file work on worker threads and keep memory bounded by
batches (`batch_bytes`), so a large cache never blocks the event loop or
sits in memory whole.
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, final

import anyio
import anyio.to_thread
import attrs

from warmenv._facts import PREFIX, Facts, captured_trees
from warmenv._fs import expand_home
from warmenv._text import plural
from warmenv.bundle.signing import Trust, TrustLike, resolve_trust
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
from warmenv.persistence import BytesCodec, CacheMode, Failed, Namespace, Origin, Storage

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
    namespaces read once, and the files written in as few worker-thread
    hops as `batch_bytes` allows (one for a small cache): on a loaded
    machine each hop costs more than writing a small file.
    """
    started = time.monotonic()
    into = expand_home(target, "the cache directory")
    prefixes = [_prefix(directory) for _, directory in trees]
    checked, writer = await anyio.to_thread.run_sync(_prepare, trust, into)
    try:
        return await _restore_into(
            env, into, trees, prefixes, writer, checked, batch_bytes, started
        )
    finally:
        if writer.is_open:  # it failed or was cancelled before the last step
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(writer.close)


def _prefix(directory: str) -> tuple[str, ...]:
    if not directory:
        return ()
    parts = relative_parts(directory.encode())
    if isinstance(parts, str):
        raise ValueError(f"a tree's directory {directory!r} is refused: {parts}")
    return parts


def _prepare(trust: TrustLike, target: Path) -> tuple[Trust, Writer]:
    return resolve_trust(trust), Writer(target)


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


# A step of the writing, in order: a batch of a tree's entries, or (None) its indexes.
_Step = tuple[_Job, list[tuple[bytes, bytes]] | None]


async def _restore_into(
    env: Environment,
    target: Path,
    trees: Sequence[tuple[CacheTree, str]],
    prefixes: list[tuple[str, ...]],
    writer: Writer,
    checked: Trust,
    batch_bytes: int,
    started: float,
) -> tuple[RestoreReport, ...]:
    signed: set[str] | None = None  # the digests of bundles whose code may be written
    if checked.require_signature:
        keys = {str(key) for key in checked.keys}
        signed = {d for d, key in (await env.bundle_signers()).items() if key in keys}
    # Checked against the facts this restore was asked for, never recomputed: reading
    # a tool's version from its metadata costs milliseconds a fact, which made a
    # restore of a few small files several times slower than copying them.
    held = [(s.namespace, s.entries) for s in await env.namespaces()]
    jobs = [_Job(tree, prefix) for (tree, _), prefix in zip(trees, prefixes, strict=True)]
    steps: list[_Step] = []
    size = 0
    for job in jobs:
        storage = env.storage(job.tree.namespace)
        entries = storage.scan() if signed is None else _signed_only(storage, signed, job.counts)
        async for batch in _batches(entries, batch_bytes):
            steps.append((job, batch))
            size += sum(len(key) + len(value) for key, value in batch)
            if size >= batch_bytes:
                await anyio.to_thread.run_sync(_write_steps, writer, steps)
                steps, size = [], 0
        steps.append((job, None))
    await anyio.to_thread.run_sync(_write_steps_and_close, writer, steps)
    elapsed = time.monotonic() - started
    return tuple(
        RestoreReport(
            namespace=str(job.tree.namespace),
            target=target.joinpath(*job.prefix),
            written=job.counts.written,
            kept=job.counts.kept,
            bytes=job.counts.bytes,
            refused=tuple(job.counts.refused),
            skipped=_skipped(job.tree, held),
            elapsed=elapsed,
        )
        for job in jobs
    )


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


async def _signed_only(
    storage: Storage, signed: set[str], counts: _RestoreCounts
) -> AsyncIterator[tuple[bytes, bytes]]:
    """The entries captured here or imported from a bundle of `signed`; the others
    are counted as refused. Each value is judged by the provenance read with it, in
    the same query: read apart, an import between the two reads would have an
    unsigned value written under a signed one's provenance."""
    async for key, value, info in storage.scan_with_info():
        if info.origin is Origin.LOCAL or (
            info.origin is Origin.IMPORTED
            and info.bundle is not None
            and info.bundle.digest in signed
        ):
            yield key, value
        else:
            counts.refused.append(LeftOut(key.decode("utf-8", "backslashreplace"), _UNSIGNED))


def _same_tree(full: str, namespace: Namespace) -> bool:
    other = Namespace.raw(full)
    return (other.name, other.path) == (namespace.name, namespace.path)


async def _batches(
    entries: AsyncIterator[tuple[bytes, bytes]], batch_bytes: int
) -> AsyncIterator[list[tuple[bytes, bytes]]]:
    batch: list[tuple[bytes, bytes]] = []
    size = 0
    async for key, value in entries:
        batch.append((key, value))
        size += len(key) + len(value)
        if size >= batch_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _write_steps(writer: Writer, steps: list[_Step]) -> None:
    """Write each step in order: a batch's files (its indexes kept back), or a tree's indexes."""
    for job, batch in steps:
        if batch is not None:
            _place(writer, job, batch)
            continue
        for parts, value in job.deferred:
            _write_one(writer, job, parts, value)
        job.deferred.clear()


def _write_steps_and_close(writer: Writer, steps: list[_Step]) -> None:
    try:
        _write_steps(writer, steps)
    finally:
        writer.close()


def _place(writer: Writer, job: _Job, batch: list[tuple[bytes, bytes]]) -> None:
    """Write a batch's files; keep its index files back, to be written after every other."""
    for key, value in batch:
        parts = relative_parts(key)
        shown = key.decode("utf-8", "backslashreplace")
        if isinstance(parts, str):
            job.counts.refused.append(LeftOut(shown, parts))
            continue
        twin = writer.claim(job.prefix + parts)
        if twin is not None:
            job.counts.refused.append(LeftOut(shown, twin))
        elif job.tree.is_index(parts):
            job.deferred.append((parts, value))
        else:
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
