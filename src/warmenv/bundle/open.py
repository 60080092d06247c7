"""Opening a bundle of either format, chosen by its first bytes.

Only a regular file (or a symlink to one) is opened: a FIFO, a device, a
socket or a directory raises `NotABundleError` at once. `open_private`
opens a private copy instead, for an import (see `warmenv.bundle._files`),
and `open_snapshot` does the same for the commands (`warmenv inspect`,
`verify`, `check`, `import`): a flat bundle opened in place is a mapping, and
reading a mapping of a file that someone truncates kills the process
(SIGBUS); the copy costs one sequential read and write of the file.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import anyio.to_thread

from warmenv.bundle import _files
from warmenv.bundle._kinds import cut_short
from warmenv.bundle.base import BundleOpener, Header
from warmenv.bundle.errors import CorruptBundleError
from warmenv.bundle.flat.bundle import FlatBundle
from warmenv.bundle.formats import AnyFormat, identify
from warmenv.bundle.sqlite.bundle import SqliteBundle

__all__ = ["open_bundle", "open_snapshot", "read_names"]

_HEAD_FIRST = 64 << 10  # the first bytes a header is looked for in (then 4x, to its limit)


def open_bundle(path: str | Path) -> BundleOpener[FlatBundle | SqliteBundle]:
    """`async with open_bundle(path) as bundle:` for a bundle of either format."""
    return BundleOpener(partial(open_any, Path(path)))


def open_snapshot(
    path: str | Path, *, near: Path | None = None, verified: bool = True
) -> BundleOpener[FlatBundle | SqliteBundle]:
    """`async with open_snapshot(path) as bundle:` opens a private copy of the bundle at
    `path`, beside the directory `near` (default: in the temporary directory); it is
    removed on exit, and an import of it copies nothing more. `verified`: the caller
    verifies the digest before reading entries (that pass checks every row, so the open
    does not); pass False to have the open check them."""
    return BundleOpener(partial(open_private, Path(path), near, verified=verified))


def _format_of(fd: int, label: str, downloaded: bool = False) -> AnyFormat:
    """The format of the open file `fd` (`formats.identify`), on a worker thread."""
    head = _files.read_head(fd)
    return identify(head, os.fstat(fd).st_size, label, downloaded=downloaded)


async def open_any(path: Path) -> FlatBundle | SqliteBundle:
    """Open and validate `path`; the caller closes it."""
    fd = await anyio.to_thread.run_sync(_files.open_regular, path)
    try:
        format = await anyio.to_thread.run_sync(_format_of, fd, str(path))
    finally:
        os.close(fd)
    return await format.open(path)


async def read_names(path: Path) -> Header | None:
    """The manifest and namespace names of the bundle at `path`, read where it lies.

    Nothing is copied: a flat bundle's header is read from its first bytes
    (never mapped, so a file truncated meanwhile cannot kill the process);
    a SQLite bundle, whose names are in its entries, is opened read-only.
    `None` for a flat header too large to read ahead (the caller reads the
    names from the import's private copy instead).
    """
    fd = await anyio.to_thread.run_sync(_files.open_regular, path)
    try:
        format = await anyio.to_thread.run_sync(_format_of, fd, str(path))
        if format.names_in_front:
            want = _HEAD_FIRST
            while True:
                data = await anyio.to_thread.run_sync(os.pread, fd, want, 0)
                parsed = format.header(data, str(path))
                if parsed is not None:
                    return parsed
                if len(data) < want:
                    raise CorruptBundleError(
                        cut_short(str(path), format.kind, len(data), "its header goes on")
                    )
                if want >= format.header_limit:
                    return None
                want = min(want * 4, format.header_limit)
    finally:
        os.close(fd)
    bundle = await format.open(path)
    try:
        return Header(bundle.manifest, tuple(s.namespace for s in await bundle.namespaces()))
    finally:
        await bundle.aclose()


async def open_private(
    path: Path, near: Path | None, *, verified: bool = False
) -> FlatBundle | SqliteBundle:
    """A private copy of the bundle at `path`, opened and validated; the caller closes it.

    The file is read once, through the descriptor that was checked, into a
    directory beside `near` (or the temporary directory); nothing reads the
    path, or maps the original file, after that.
    """
    fd = await anyio.to_thread.run_sync(_files.open_regular, path)
    try:
        format = await anyio.to_thread.run_sync(_format_of, fd, str(path))
        return await format.open_private_copy(fd, near, str(path), verified=verified)
    finally:
        os.close(fd)


async def open_private_file(
    path: Path, label: str, *, downloaded: bool = False
) -> FlatBundle | SqliteBundle:
    """Open a bundle file that already lies in a private directory (a download); the
    bundle owns the file. `downloaded`: `label` is the URL whose body it is."""
    fd = await anyio.to_thread.run_sync(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        format = await anyio.to_thread.run_sync(_format_of, fd, label, downloaded)
    finally:
        os.close(fd)
    return await format.open_private_file(path, label)
