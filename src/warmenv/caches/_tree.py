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
- `await restore(env, tree, target) -> RestoreReport` (in `_restore`): write the
  namespace's files under `target`, never overwriting a file already there
  (this machine's own wins), every file whole or not at all, under the
  rules in `_paths.py` for hostile input (a bundle is code: see
  docs/caches.md). Namespaces of the same tool and part under other facts
  are listed in `report.skipped` with why they cannot hit here. Under
  `require_signature` (the configuration's, or `trust=`), only files
  captured here or imported from a bundle whose signature by a trusted key
  was checked at import are written; the rest are refused, named.
- `await restore_trees(env, target, [(tree, directory), ...])` (in `_restore`): several
  trees under one target (each in a directory of it, `""` the target
  itself) in one pass, in order, with the fixed costs (the target's
  checks, the trust, the namespaces, the worker-thread hops) paid once;
  `restore_planned(env, plan)` the same with the target and trees worked
  out by `plan()` on the worker thread that checks the target (a tool's
  facts read there, never on SQLite's thread), its result holding the
  entries of each of the tools' namespaces too; `restore_made(env, make,
  target)` one tree made there.
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

import fnmatch
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, final

import anyio
import anyio.to_thread
import attrs

from warmenv._facts import PREFIX, Facts
from warmenv._fs import expand_home
from warmenv._text import plural
from warmenv.caches._paths import (
    DIRECTORY_FLAGS,
    MAX_FILE_BYTES,
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
    Storage,
)

__all__ = [
    "CacheTree",
    "CaptureReport",
    "LeftOut",
    "RestoreReport",
    "Skipped",
    "capture",
    "record_hits",
]

DEFAULT_BATCH_BYTES: Final = 16 * 1024 * 1024
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
        # `*` (every file: Triton's indexes' own tree) without compiling it: a fresh
        # process's first `fnmatch` of a pattern compiles a regular expression, which
        # cost a Triton restore as much as its 192 keys' path rules.
        return any(
            pattern == "*" or fnmatch.fnmatchcase(parts[-1], pattern) for pattern in self.index
        )

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
