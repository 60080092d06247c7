"""Opening a bundle of either format, chosen by its first bytes."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio.to_thread

from warmenv.bundle.base import BundleOpener, NotABundleError
from warmenv.bundle.flat import FLAT_MAGIC, FlatBundle, map_file
from warmenv.bundle.sqlite import SQLITE_MAGIC, SqliteBundle, open_sqlite_bundle, read_head

__all__ = ["open_bundle"]


def open_bundle(path: str | Path) -> BundleOpener[FlatBundle | SqliteBundle]:
    """`async with open_bundle(path) as bundle:` for a bundle of either format."""
    return BundleOpener(partial(open_any, Path(path)))


async def open_any(path: Path) -> FlatBundle | SqliteBundle:
    """Open and validate `path`; the caller closes it."""
    head = await anyio.to_thread.run_sync(read_head, path)
    if head.startswith(FLAT_MAGIC):
        return await anyio.to_thread.run_sync(map_file, path)
    if head == SQLITE_MAGIC:
        return await open_sqlite_bundle(path)
    raise NotABundleError(
        f"{path} is not a warmenv bundle (it starts with neither the SQLite nor the flat magic)"
    )
