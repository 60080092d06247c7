"""The flat bundle's writer: the file export fills, entry by entry, in sorted order.

The shape (namespaces, entries, bytes) is known before the first entry, so
the header and every position are fixed up front: the index, the carried
bytes and the data go straight to their places in one file and only the
current batch is held in memory. `FlatStaging` is what
`FlatFormat.writer` hands export (`warmenv.bundle.exporting`); `FlatWriter`
writes the bytes of `warmenv.bundle.flat.layout`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, final

from warmenv.bundle.base import CarriedRow, PackedRow
from warmenv.bundle.errors import BundleTooLargeError
from warmenv.bundle.flat.layout import (
    CARRIED_SIZE,
    ENTRY,
    FLAT_MAGIC,
    FORMAT_VERSION,
    MAX_U32,
    U32,
    check_format_version,
)
from warmenv.bundle.manifest import BundleManifest

__all__ = ["FlatStaging", "FlatWriter"]


@final
class FlatStaging:
    """A flat bundle being written to a staging file, for export (`FlatFormat.writer`)."""

    __slots__ = ("_file", "_writer")

    def __init__(
        self,
        path: Path,
        manifest: BundleManifest,
        totals: dict[str, tuple[int, int]],
        *,
        format_version: int,
    ) -> None:
        self._file: BinaryIO | None = open(path, "wb+")
        try:
            self._writer = FlatWriter(
                self._file,
                manifest,
                sorted(totals),
                sum(entries for entries, _ in totals.values()),
                sum(size for _, size in totals.values()),
                format_version=format_version,
            )
        except BaseException:
            self.close()
            raise

    def add(self, rows: list[CarriedRow], packed: list[PackedRow]) -> None:
        self._writer.add_many(packed)

    def finish(self, manifest: BundleManifest) -> None:
        self._writer.finish(manifest)
        handle = self._file
        assert handle is not None, "the staging file is closed"
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        self._file = None

    def close(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()


@final
class FlatWriter:
    """Writes a flat bundle whose shape (namespaces, entries, sizes) is known up front,
    in format 2 (the default) or 1 (0.1's: version field 1, no carried records).

    The index, the carried bytes and the data go to three positions of the
    same file as entries arrive in sorted order, so nothing but the current
    batch is in memory; the digest placeholder is overwritten once the last
    entry is written.
    """

    __slots__ = (
        "_carried_at",
        "_carried_buffer",
        "_carries",
        "_data_at",
        "_data_buffer",
        "_data_pos",
        "_file",
        "_index_at",
        "_index_buffer",
        "_manifest_at",
        "_manifest_size",
        "_ns_ids",
    )

    _FLUSH_AT = 1 << 20

    def __init__(
        self,
        file: BinaryIO,
        manifest: BundleManifest,
        namespaces: list[str],
        entries: int,
        data_bytes: int,
        *,
        format_version: int = FORMAT_VERSION,
    ) -> None:
        check_format_version(format_version, "a flat bundle to write")
        carried_size = CARRIED_SIZE[format_version]
        if data_bytes > MAX_U32 or entries > MAX_U32 // (20 + carried_size):
            raise BundleTooLargeError(
                f"{entries} entries with {data_bytes} bytes of data do not fit a flat bundle "
                "(4 GiB of data at most); export to the SQLite format instead"
            )
        manifest_json = manifest.to_json()
        header = bytearray(FLAT_MAGIC)
        header += U32.pack(format_version)
        header += U32.pack(len(manifest_json))
        self._manifest_at = len(header)
        self._manifest_size = len(manifest_json)
        header += manifest_json
        header += U32.pack(len(namespaces))
        for name in namespaces:
            raw = name.encode("utf-8")
            header += U32.pack(len(raw)) + raw
        header += U32.pack(entries)
        self._file = file
        file.write(header)
        file.flush()
        self._index_at = len(header)
        self._carried_at = self._index_at + entries * 20
        self._data_at = self._carried_at + entries * carried_size
        self._carries = carried_size > 0
        self._data_pos = 0
        self._index_buffer = bytearray()
        self._carried_buffer = bytearray()
        self._data_buffer = bytearray()
        self._ns_ids = {name: i for i, name in enumerate(namespaces)}

    def add_many(self, entries: Iterable[tuple[str, bytes, bytes, bytes]]) -> None:
        """Append entries (in sorted order), each with its 16 carried bytes
        (`carried.pack`), which format 1 has no place for and leaves out."""
        index, carried, data = self._index_buffer, self._carried_buffer, self._data_buffer
        ids, pack, carries, flush_at = self._ns_ids, ENTRY.pack, self._carries, self._FLUSH_AT
        # Where the next key goes in the data section; `_flush` empties the buffers in
        # place, so this stays `_data_pos` plus what they hold.
        at = self._data_pos + len(data)
        for namespace, key, value, carrying in entries:
            key_size, value_size = len(key), len(value)
            index += pack(ids[namespace], at, key_size, at + key_size, value_size)
            if carries:
                carried += carrying
            data += key
            data += value
            at += key_size + value_size
            if len(data) >= flush_at:
                self._flush()

    def _flush(self) -> None:
        fd = self._file.fileno()
        _pwrite_all(fd, self._index_buffer, self._index_at)
        _pwrite_all(fd, self._carried_buffer, self._carried_at)
        _pwrite_all(fd, self._data_buffer, self._data_at + self._data_pos)
        self._index_at += len(self._index_buffer)
        self._carried_at += len(self._carried_buffer)
        self._data_pos += len(self._data_buffer)
        self._index_buffer.clear()
        self._carried_buffer.clear()
        self._data_buffer.clear()

    def finish(self, manifest: BundleManifest) -> None:
        """Write what is buffered and the final manifest (its digest and signature filled
        in) over the one written first, which had placeholders of the same length."""
        self._flush()
        manifest_json = manifest.to_json()
        if len(manifest_json) != self._manifest_size:
            raise ValueError("the final manifest differs in length from its placeholder")
        _pwrite_all(self._file.fileno(), manifest_json, self._manifest_at)


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
