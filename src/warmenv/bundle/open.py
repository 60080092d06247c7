"""Opening a bundle of either format, chosen by its first bytes."""

from __future__ import annotations

from pathlib import Path
from typing import final

import anyio.to_thread

from warmenv.bundle.base import Bundle, NotABundleError
from warmenv.bundle.flat import FLAT_MAGIC, map_file
from warmenv.bundle.sqlite import SQLITE_MAGIC, open_sqlite_bundle, read_head

__all__ = ["open_bundle"]


def open_bundle(path: str | Path) -> _BundleOpener:
    """`async with open_bundle(path) as bundle:` for a bundle of either format."""
    return _BundleOpener(Path(path))


async def open_any(path: Path) -> Bundle:
    """Open and validate `path`; the caller closes it."""
    head = await anyio.to_thread.run_sync(read_head, path)
    if head.startswith(FLAT_MAGIC):
        return await anyio.to_thread.run_sync(map_file, path)
    if head == SQLITE_MAGIC:
        return await open_sqlite_bundle(path)
    raise NotABundleError(
        f"{path} is not a warmenv bundle (it starts with neither the SQLite nor the flat magic)"
    )


@final
class _BundleOpener:
    __slots__ = ("_bundle", "_path")

    def __init__(self, path: Path) -> None:
        self._path = path
        self._bundle: Bundle | None = None

    async def __aenter__(self) -> Bundle:
        self._bundle = await open_any(self._path)
        return self._bundle

    async def __aexit__(self, *exc: object) -> None:
        if self._bundle is not None:
            await self._bundle.aclose()
