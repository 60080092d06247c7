"""The flat bundle's reader: one blob read in place, validated once at open.

Everything is validated once, at open: every length is checked against the
bytes that remain before anything is allocated for it, every offset against
the data section, the index order entry by entry. After that a lookup reads
with no further checks, over the keys kept at open (a copy of one key in
every `stride`, the fences). The stride is the smallest power of two that
keeps the fences under a budget of keys and of bytes (`_MAX_FENCES`,
`_MAX_FENCE_BYTES`): a bundle of up to that many keys keeps every key, and
from a namespace's first get on, a dict of its keys to their index entries,
so that a lookup is one hash lookup (a binary search of 100,000 keys made 17
comparisons, a fifth of a get's instructions; the dict costs about 85 bytes
a key, bounded by the same budget, and only a bundle read by key builds one).
A larger bundle keeps its memory bounded as the file grows: a binary search
over the fences, in C, then within the stride's block. Long keys at fence
positions double the stride again while they are read.
The keys and values claimed must fit the data section: ranges that overlap
would make a file of a few MiB claim (and every pass copy) hundreds.
What an entry carries needs no check at open: a value out of range is read
as unknown (`carried.unpack`), and the digest covers the bytes as they are.
Format 2 is what export writes by default; format 1 (no carried bytes) is
still read, and written on request for readers that know no other (warmenv
0.1).

`FlatFormat` is the format's entry in the registry (`warmenv.bundle.formats`):
opening a file in place or as a private copy, reading the header of a
download's first range, and handing export its writer
(`warmenv.bundle.flat.staging`). The layout both read is
`warmenv.bundle.flat.layout`.
"""

from __future__ import annotations

import array
import bisect
import mmap
import os
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from functools import partial
from pathlib import Path
from typing import ClassVar, TypeVar, final

import anyio
import anyio.to_thread
from anyio.lowlevel import checkpoint, checkpoint_if_cancelled

from warmenv._text import brief
from warmenv.bundle import _files
from warmenv.bundle._kinds import not_a_bundle
from warmenv.bundle.base import (
    Bundle,
    BundleFormat,
    BundleOpener,
    BundleReader,
    FileFormat,
    Header,
    check_listed,
    check_namespace_names,
)
from warmenv.bundle.errors import (
    CorruptBundleError,
    InvalidManifestError,
    NotABundleError,
    UnsupportedSchemaError,
)
from warmenv.bundle.flat._reader import KIND as _KIND
from warmenv.bundle.flat._reader import Reader, cut
from warmenv.bundle.flat.layout import (
    CARRIED_SIZE,
    FLAT_MAGIC,
    check_format_version,
    data_end,
)
from warmenv.bundle.flat.staging import FlatStaging
from warmenv.bundle.manifest import (
    BackgroundDigest,
    BundleManifest,
    check_manifest_size,
)
from warmenv.persistence import carried
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.storage import NamespaceSummary, check_batch_size, check_key

__all__ = ["FLAT", "FlatBundle", "FlatFormat", "map_file", "map_private"]

T = TypeVar("T")

# The fence keys kept at open, at most: with every key kept (a stride of 1) a
# lookup is one bisect in C; beyond these bounds one key in 2, 4, 8... is kept.
_MAX_FENCES = 1 << 17
_MAX_FENCE_BYTES = 8 << 20
_CANCEL_EVERY = 32  # lookups between checks for cancellation
_FORGET_EVERY = 4096  # entries between releases of mapped pages already read
_DIGEST_BATCH = 1024  # entries hashed at a time (a few such batches wait at most)
_DIGEST_SLICE = 8 << 20  # bytes of keys and values hashed per step of progress


@final
class _Copying:
    """Bytes sliced out of a buffer whose own slices are not bytes (a bytearray, a view)."""

    __slots__ = ("_view",)

    def __init__(self, view: memoryview) -> None:
        self._view = view

    def __getitem__(self, where: slice) -> bytes:
        return bytes(self._view[where])


@final
class FlatBundle(BundleReader, Bundle):
    """A flat bundle held in memory or mapped from a file, validated at open.

    A mapping of a file that another process truncates faults (SIGBUS) when
    read past the new end, so an import never reads this mapping: it maps a
    private copy instead (`private_copy`), which nobody else can change.
    """

    format: ClassVar[BundleFormat] = BundleFormat.FLAT
    __slots__ = (
        "_base",
        "_carried_at",
        "_closer",
        "_count",
        "_data",
        "_fd",
        "_gets_left",
        "_index_at",
        "_keyed",
        "_lookup",
        "_manifest",
        "_names",
        "_namespaces",
        "_ranges",
        "_source",
        "_stride",
        "_summaries",
        "_version",
        "_view",
        "_words",
    )
    _words: memoryview | array.array[int]

    def __init__(
        self,
        blob: bytes | bytearray | mmap.mmap | memoryview,
        source: str,
        closer: Callable[[], None] | None = None,
        fd: int | None = None,
    ) -> None:
        self._source = source
        self._closer = closer
        self._fd = fd  # the file as opened, for a private copy; None: nothing to copy
        self._gets_left = _CANCEL_EVERY  # lookups before get checks for cancellation
        self._words = array.array("I")  # the index, once parsed (a view of the blob)
        self._view = memoryview(blob).cast("B")
        # What every read slices: bytes or an mmap yield bytes in one step, and
        # anything else is read through the memoryview and copied per slice.
        self._data: bytes | mmap.mmap | _Copying = (
            blob if isinstance(blob, bytes | mmap.mmap) else _Copying(self._view)
        )
        try:
            self._parse(self._view)
        except BaseException:
            self._fd = None  # a bundle that failed to open leaves its file to the caller
            self._release()
            raise

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> FlatBundle:
        """A bundle over `data`, read in place (no copy of the entries)."""
        return cls(data, "flat bundle in memory")

    @classmethod
    def open(cls, path: str | Path) -> BundleOpener[FlatBundle]:
        """`async with FlatBundle.open(path) as bundle:` maps the file and validates it."""
        return BundleOpener(partial(anyio.to_thread.run_sync, map_file, Path(path)))

    async def private_copy(self, near: Path | None) -> FlatBundle | None:
        fd = self._fd
        if fd is None:  # in memory, or already a private copy
            return None
        return await anyio.to_thread.run_sync(_map_private_copy, fd, near, self._source)

    @property
    def manifest(self) -> BundleManifest:
        return self._manifest

    @property
    def format_version(self) -> int:
        """1 (entries alone) or 2 (each entry carries its written_at and cost)."""
        return self._version

    def describe(self) -> str:
        return f"flat bundle {self._source} ('{brief(self._manifest.name)}')"

    async def namespaces(self) -> list[NamespaceSummary]:
        await checkpoint()
        return list(self._summaries)

    async def get(self, namespace: Namespace | str, key: bytes) -> bytes | None:
        # A lookup never waits, so it never yields to the event loop, and it
        # checks for cancellation once in _CANCEL_EVERY calls: anyio's check
        # costs about as much as the lookup itself. A loop of lookups in a
        # cancelled scope still ends within that many calls.
        # Within the fence budget a get calls nothing of ours (the value's read
        # is `_read` written out): each Python call costs about as much as a
        # hash lookup (callgrind). Every offset and length read here was
        # bounded by the data section at open (`_check_index`).
        if type(key) is not bytes:
            check_key(key)
        left = self._gets_left - 1  # counted down: small ints are never allocated
        if left:
            self._gets_left = left
        else:
            self._gets_left = _CANCEL_EVERY
            await checkpoint_if_cancelled()
        # `str(namespace)`, without calling Namespace.__str__ (from C) for a Namespace.
        name = namespace.full if type(namespace) is Namespace else str(namespace)
        keyed = self._keyed.get(name)
        at = self._search(name, key) if keyed is None else keyed.get(key, -1)
        if at < 0:
            return None
        words = self._words  # `at`: the value's offset, then its length
        v_off = self._base + words[at]
        return self._data[v_off : v_off + words[at + 1]]

    def _search(self, name: str, key: bytes) -> int:
        """Where `key`'s value offset is in `_words` (its length follows), or -1.

        Every key kept (a stride of 1): the namespace's keys are put in a dict to
        their values' offsets here, at its first get, for `get` to look up from
        then on (an import, which reads no key, never builds one). Else the
        bisect over the namespace's fences, then the binary search of the
        fence's block.
        """
        found = self._lookup.get(name)
        if found is None:
            return -1
        start, end, fences = found
        if self._stride == 1:
            values_at = range(start * 5 + 3, end * 5 + 3, 5)
            keyed = self._keyed[name] = dict(zip(fences, values_at, strict=True))
            return keyed.get(key, -1)
        block = bisect.bisect_right(fences, key) - 1
        if block < 0:
            return -1
        stride = self._stride
        lo = start + block * stride
        hi = min(lo + stride, end)
        words = self._words
        read = self._read
        while lo < hi:
            mid = (lo + hi) >> 1
            at = mid * 5
            k_off = words[at + 1]
            probe = read(k_off, k_off + words[at + 2])
            if probe < key:
                lo = mid + 1
            elif probe == key:
                return at + 3
            else:
                hi = mid
        return -1

    def _read(self, start: int, end: int) -> bytes:
        """The bytes of the data section from `start` to `end` (bounded at open)."""
        base = self._base
        return self._data[base + start : base + end]

    def scan(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        return self._scan(namespace, batch_size, self._entry)

    def scan_with_provenance(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[CarryingEntry]:
        return self._scan(namespace, batch_size, self._believed_entry)

    async def _scan(
        self, namespace: Namespace | str, batch_size: int, entry: Callable[[int], T]
    ) -> AsyncIterator[T]:
        check_batch_size(batch_size)
        ns_id = self._namespaces.get(str(namespace))
        if ns_id is None:
            return
        start, end = self._ranges[ns_id]
        marks = self._first_marks()
        for position in range(start, end):
            if (position - start) % batch_size == 0:
                self._forget_before(position, marks)
                await checkpoint()
            yield entry(position)

    def _believed_entry(self, position: int) -> CarryingEntry:
        """Key, value, and what the entry carries as believed (unknown in format 1)."""
        key, value = self._entry(position)
        at = self._carried_at
        if at is None:
            return key, value, None, None
        offset = at + 16 * position
        return key, value, *carried.unpack(self._view[offset : offset + 16])

    async def _digest_steps(self) -> AsyncGenerator[int | str, None]:
        # A slice at a time on a worker thread: the caller sees progress between them.
        steps = self._digest_slices()
        try:
            while True:
                step = await anyio.to_thread.run_sync(_next_step, steps)
                yield step
                if isinstance(step, str):
                    return
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(steps.close)

    def _digest_slices(self) -> Generator[int, None, str]:
        """Hash the entries in order, yielding the bytes of keys and values done so far
        every `_DIGEST_SLICE` bytes or so (from 0 to all of them); returns the digest."""
        digest = BackgroundDigest(self._version)
        marks = self._first_marks()
        add = digest.add if self._carried_at is None else digest.add_carrying
        entry = self._entry if self._carried_at is None else self._carrying_entry
        words = self._words
        done = reported = 0
        try:
            yield done
            for ns_id, name in enumerate(self._names):
                start, end = self._ranges[ns_id]
                for batch in range(start, end, _DIGEST_BATCH):
                    self._forget_before(batch, marks)
                    stop = min(batch + _DIGEST_BATCH, end)
                    add((name, *entry(position)) for position in range(batch, stop))
                    # Key and value lengths are the 3rd and 5th word of each index entry.
                    done += sum(words[batch * 5 + 2 : stop * 5 : 5])
                    done += sum(words[batch * 5 + 4 : stop * 5 : 5])
                    if done - reported >= _DIGEST_SLICE:
                        reported = done
                        yield done
            if done != reported:
                yield done
            return digest.value()
        finally:
            digest.close()

    def _carrying_entry(self, position: int) -> tuple[bytes, bytes, bytes]:
        """Key, value and the 16 carried bytes as stored (format 2)."""
        at = self._carried_at
        assert at is not None
        key, value = self._entry(position)
        return key, value, self._data[at + 16 * position : at + 16 * position + 16]

    def _first_marks(self) -> list[int]:
        at = self._carried_at
        return [self._index_at, self._base if at is None else at, self._base]

    def _forget_before(self, position: int, marks: list[int]) -> None:
        """Let the kernel drop the mapped pages a sequential pass has left behind.

        Pages of a mapped file count as the process's memory once read, so a
        pass over a 1 GiB bundle would otherwise end with all of it resident.
        Dropped pages are read again from the page cache if they are needed.
        `marks` is the pass's own record of how far it has released.
        """
        blob = self._data
        if not isinstance(blob, mmap.mmap) or position >= self._count:
            return
        index_upto = self._index_at + position * 20
        carried_at = self._base if self._carried_at is None else self._carried_at
        carried_upto = carried_at + position * CARRIED_SIZE[self._version]
        # Clamped: validation calls this before it has checked the offset.
        data_upto = min(self._base + self._words[position * 5 + 1], len(blob))
        regions = (
            (self._index_at, index_upto),
            (carried_at, carried_upto),
            (self._base, data_upto),
        )
        for region, (start, upto) in enumerate(regions):
            begin = max(start, marks[region])
            begin -= begin % mmap.PAGESIZE
            upto -= upto % mmap.PAGESIZE
            if upto > begin:
                blob.madvise(mmap.MADV_DONTNEED, begin, upto - begin)
                marks[region] = upto

    def _entry(self, position: int) -> tuple[bytes, bytes]:
        at = position * 5
        words, read = self._words, self._read
        k_off, v_off = words[at + 1], words[at + 3]
        return read(k_off, k_off + words[at + 2]), read(v_off, v_off + words[at + 4])

    async def aclose(self) -> None:
        self._release()

    def _release(self) -> None:
        closer, self._closer = self._closer, None
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        words = self._words
        if isinstance(words, memoryview):
            words.release()
        self._view.release()
        self._data = _Copying(self._view)  # as released: a read raises ValueError
        if closer is not None:
            closer()

    def _parse(self, data: memoryview) -> None:
        reader = Reader(data, self._source)
        if not FLAT.matches(bytes(data[: len(FLAT_MAGIC)])):
            head = bytes(data[: _files.HEAD_SIZE])
            magics = {_KIND: FLAT_MAGIC}
            raise NotABundleError(not_a_bundle(self._source, head, len(data), magics))
        reader.take(len(FLAT_MAGIC), "the magic")
        version = reader.u32("the format version")
        check_format_version(version, self._source)
        self._version = version
        manifest_len = reader.u32("the manifest length")
        check_manifest_size(manifest_len, self._source)  # before reading it, by its length
        manifest_bytes = bytes(reader.take(manifest_len, "the manifest"))
        try:
            self._manifest = BundleManifest.from_json(manifest_bytes)
        except (InvalidManifestError, UnsupportedSchemaError) as exc:
            raise type(exc)(f"{self._source}: {exc}") from None

        ns_count = reader.u32("the namespace count")
        if ns_count * 4 > len(data) - reader.pos:
            raise cut(
                self._source,
                len(data),
                f"its header lists {ns_count:,} namespaces, more than the file holds",
            )
        names: list[str] = []
        previous = b""
        for i in range(ns_count):
            raw = bytes(reader.take(reader.u32(f"namespace {i} length"), f"namespace {i}"))
            if i and raw <= previous:
                raise CorruptBundleError(f"{self._source}: namespace table not sorted at {i}")
            try:
                names.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise CorruptBundleError(f"{self._source}: namespace {i} is not UTF-8") from None
            previous = raw
        check_namespace_names(names, self._source)
        check_listed(self._manifest, names, self._source)
        entry_count = reader.u32("the entry count")
        entry_size = 20 + CARRIED_SIZE[version]
        if entry_count * entry_size > len(data) - reader.pos:
            raise cut(
                self._source,
                len(data),
                f"its header lists {entry_count:,} entries, more than the file holds",
            )
        index_at = reader.pos
        self._carried_at = index_at + entry_count * 20 if version >= 2 else None
        self._base = index_at + entry_count * entry_size
        self._index_at = index_at
        self._count = entry_count
        self._names = names
        self._namespaces = {name: i for i, name in enumerate(names)}
        index_end = index_at + entry_count * 20
        if sys.byteorder == "little":
            self._words = data[index_at:index_end].cast("I")
        else:  # pragma: no cover - big-endian hosts read a converted copy of the index
            words = array.array("I", data[index_at:index_end])
            words.byteswap()
            self._words = words
        self._check_index(len(data) - self._base)

    def _check_index(self, size: int) -> None:
        names = self._names
        ranges: list[list[int]] = [[0, 0] for _ in names]
        fences: list[list[bytes]] = [[] for _ in names]
        counts = [0] * len(names)
        sizes = [0] * len(names)
        previous_ns = -1
        previous_key = b""
        words = self._words
        key_bytes = sum(words[2::5])
        claimed = key_bytes + sum(words[4::5])
        if claimed > size and (end := data_end(words)) > size:
            # The usual cause by far: a copy or download that stopped early.
            raise cut(
                self._source, self._base + size, f"its entries reach byte {self._base + end:,}"
            )
        if claimed > size:
            # A writer lays each key and value down once, so they fit the data section;
            # ranges that overlap would let a small file claim (and make every pass
            # over it copy) many times its size.
            raise CorruptBundleError(
                f"{self._source}: the entries claim {claimed:,} bytes of keys and values, "
                f"the data section holds {size:,} (their ranges overlap)"
            )
        stride = _stride(len(words) // 5, key_bytes)
        fence_bytes, fence_limit = 0, _MAX_FENCE_BYTES
        marks = self._first_marks()
        for position in range(len(words) // 5):
            if position % _FORGET_EVERY == 0:
                self._forget_before(position, marks)
            at = position * 5
            ns_id, k_off, k_len, v_off, v_len = words[at : at + 5]
            if ns_id >= len(names):
                raise CorruptBundleError(
                    f"{self._source}: entry {position} names namespace {ns_id} of {len(names)}"
                )
            if k_off + k_len > size or v_off + v_len > size:
                raise CorruptBundleError(
                    f"{self._source}: entry {position} points past the end of the data"
                )
            key = self._read(k_off, k_off + k_len)
            if ns_id < previous_ns or (ns_id == previous_ns and key <= previous_key):
                raise CorruptBundleError(
                    f"{self._source}: index not sorted (or a key repeats) at entry {position}"
                )
            if ns_id != previous_ns:
                ranges[ns_id][0] = position
            ranges[ns_id][1] = position + 1
            if (position - ranges[ns_id][0]) % stride == 0:
                fences[ns_id].append(key)
                fence_bytes += k_len
                if fence_bytes > fence_limit:
                    # The stride bounds the keys' bytes on average; long keys placed at
                    # fence positions would still exceed the budget, so keep fewer. What
                    # no stride can shed (each namespace's first key) may double before
                    # the next try, so the tries stay few.
                    stride, fence_bytes = _thin(fences, stride)
                    over = fence_bytes > _MAX_FENCE_BYTES
                    fence_limit = 2 * fence_bytes if over else _MAX_FENCE_BYTES
            counts[ns_id] += 1
            sizes[ns_id] += k_len + v_len
            previous_ns, previous_key = ns_id, key
        self._stride = stride
        self._ranges = [(a, b) for a, b in ranges]
        # A namespace's index range and its fence keys, for `_search`; with every key
        # kept, its keys to where their value's offset is in the words, once it is read.
        self._lookup = {name: (*self._ranges[i], fences[i]) for i, name in enumerate(names)}
        self._keyed: dict[str, dict[bytes, int]] = {}
        self._summaries = [
            NamespaceSummary(namespace=name, entries=counts[i], bytes=sizes[i])
            for i, name in enumerate(names)
            if counts[i]
        ]


def _stride(entries: int, key_bytes: int) -> int:
    """One key in how many is kept as a fence: a power of two, within both budgets."""
    stride = 1
    while entries > _MAX_FENCES * stride or key_bytes > _MAX_FENCE_BYTES * stride:
        stride *= 2
    return stride


def _thin(fences: list[list[bytes]], stride: int) -> tuple[int, int]:
    """Double the stride while the fences' bytes are over budget and a namespace has
    more than one: the new stride, and the bytes of the fences still kept."""
    while True:
        fence_bytes = sum(len(key) for keys in fences for key in keys)
        if fence_bytes <= _MAX_FENCE_BYTES or all(len(keys) <= 1 for keys in fences):
            return stride, fence_bytes
        stride *= 2
        for keys in fences:
            del keys[1::2]  # the kept ones are at multiples of the new stride


def map_file(path: Path) -> FlatBundle:
    """Map and validate the regular file `path`; the bundle keeps it open."""
    fd = _files.open_regular(path)
    try:
        return _map(fd, str(path), keep=True)
    except BaseException:
        os.close(fd)
        raise


def _map(fd: int, source: str, *, keep: bool) -> FlatBundle:
    size = os.fstat(fd).st_size
    if size == 0:
        raise NotABundleError(not_a_bundle(source, b"", 0, {_KIND: FLAT_MAGIC}))
    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        return FlatBundle(mapped, source, mapped.close, fd if keep else None)
    except BaseException:
        mapped.close()
        raise


def _map_private_copy(fd: int, near: Path | None, source: str) -> FlatBundle:
    return map_private(_files.copy_to_private(fd, near, "bundle.flat"), source)


def map_private(path: Path, source: str) -> FlatBundle:
    """Map a file in a private directory (a copy, a download); the bundle owns it.

    The file loses its name as soon as it is open: nobody can open it to
    truncate or rewrite it, and nothing is left behind however we exit.
    """
    try:
        private = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        _files.remove_private(path)
    try:
        return _map(private, source, keep=False)
    finally:
        os.close(private)


@final
class FlatFormat(FileFormat[FlatBundle]):
    """The flat bundle as files: its magic, then the header (manifest and names) up front."""

    __slots__ = ()
    format: ClassVar[BundleFormat] = BundleFormat.FLAT
    magic: ClassVar[bytes] = FLAT_MAGIC
    header_in_front: ClassVar[bool] = True
    names_in_front: ClassVar[bool] = True
    header_limit: ClassVar[int] = 16 << 20  # a larger header: read the whole file
    kind: ClassVar[str] = _KIND

    async def open(self, path: Path) -> FlatBundle:
        return await anyio.to_thread.run_sync(map_file, path)

    async def open_private_copy(
        self, fd: int, near: Path | None, label: str, *, verified: bool
    ) -> FlatBundle:
        # The copy is mapped, and every open checks the whole index: `verified` changes nothing.
        return await anyio.to_thread.run_sync(_map_private_copy, fd, near, label)

    async def open_private_file(self, path: Path, label: str) -> FlatBundle:
        return await anyio.to_thread.run_sync(map_private, path, label)

    def header(self, data: bytes, label: str) -> Header | None:
        u32 = int.from_bytes
        pos = len(FLAT_MAGIC)
        if len(data) < pos + 8:
            return None
        check_format_version(u32(data[pos : pos + 4], "little"), label)
        manifest_len = u32(data[pos + 4 : pos + 8], "little")
        check_manifest_size(manifest_len, label)  # not worth asking the server for more
        pos += 8
        if len(data) < pos + manifest_len + 4:
            return None
        try:
            manifest = BundleManifest.from_json(data[pos : pos + manifest_len])
        except (InvalidManifestError, UnsupportedSchemaError) as exc:
            raise type(exc)(f"{label}: {exc}") from None
        pos += manifest_len
        count = u32(data[pos : pos + 4], "little")
        pos += 4
        names: list[str] = []
        for i in range(count):
            if len(data) < pos + 4:
                return None
            size = u32(data[pos : pos + 4], "little")
            pos += 4
            if len(data) < pos + size:
                return None
            try:
                names.append(data[pos : pos + size].decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidManifestError(f"{label}: namespace {i} is not UTF-8") from None
            pos += size
        header = Header.told(manifest, names, label)
        check_listed(manifest, names, label)
        return header

    def writer(
        self,
        path: Path,
        manifest: BundleManifest,
        totals: dict[str, tuple[int, int]],
        *,
        format_version: int,
        expected_bytes: int,
    ) -> FlatStaging:
        return FlatStaging(path, manifest, totals, format_version=format_version)


FLAT = FlatFormat()


def _next_step(steps: Generator[int, None, str]) -> int | str:
    """The next step of a digest (bytes done), or the digest once it is done."""
    try:
        return next(steps)
    except StopIteration as done:
        return str(done.value)
