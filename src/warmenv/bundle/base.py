"""What every bundle reader offers, and what the readers share.

A bundle is untrusted input: a file from another machine, a download, a
container layer. Readers validate it completely when it is opened, and
whatever is wrong with it surfaces as one of the `BundleError` subclasses
below (or `OSError` for a file that cannot be read at all), never as a
crash from deep inside a parser.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Generic, Protocol, Self, TypeVar, final, runtime_checkable

import anyio.to_thread
import attrs

from warmenv._faces import AsyncWith
from warmenv._keys import PublicKey
from warmenv.bundle._kinds import cut_short
from warmenv.bundle.errors import CorruptBundleError
from warmenv.bundle.events import Verifying
from warmenv.bundle.manifest import BundleManifest, Digest
from warmenv.bundle.signing import TrustLike, check_signature, resolve_trust
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.storage import NamespaceSummary

__all__ = [
    "Bundle",
    "BundleFormat",
    "BundleReader",
    "BundleOpener",
    "ClosesOnExit",
    "DigestProgress",
    "FORMAT_VERSIONS",
    "CarriedRow",
    "FileFormat",
    "Header",
    "PackedRow",
    "StagingCopier",
    "StagingWriter",
]

CarriedRow = tuple[str, bytes, bytes, float | None, float | None]
"""(namespace, key, value, written_at, cost): an entry export writes, and what it carries."""
PackedRow = tuple[str, bytes, bytes, bytes]
"""(namespace, key, value, carried bytes): the same entry as the digest takes it
(the 16 bytes of `carried.pack`, or none in format 1)."""

DigestProgress = Callable[[Verifying], None]
"""Called with how far a digest is, between its steps, on the caller's event loop."""


def check_namespace_names(names: Iterable[str], source: str) -> None:
    """`CorruptBundleError` unless every name is a namespace an environment could hold."""
    for name in names:
        try:
            Namespace.raw(name)
        except ValueError as exc:
            raise CorruptBundleError(f"{source}: namespace {name!r} is not valid ({exc})") from None


def check_listed(manifest: BundleManifest, names: Iterable[str], source: str) -> None:
    """`CorruptBundleError` unless the namespaces `manifest` lists (if it lists them) are
    exactly `names`, those the bundle holds: an import may refuse a bundle by its list
    before reading its body, so every reader of the body checks that the list told the
    truth. (A list can only make an import refuse: what is imported is read from the
    body, whose digest and, if signed, signature the import checks.)"""
    if manifest.namespaces is None:
        return
    listed, held = list(manifest.namespaces), sorted(set(names))
    if sorted(set(listed)) != held or len(listed) != len(held):
        missing = sorted(set(held) - set(listed))
        extra = sorted(set(listed) - set(held))
        said = (
            f"lacks {missing[0]!r}, which it holds"
            if missing
            else f"names {extra[0]!r}, which it does not hold"
            if extra
            else "names a namespace twice"
        )
        raise CorruptBundleError(f"{source}: its manifest's list of namespaces {said}")


@attrs.frozen
class Header:
    """What a bundle says in its first bytes, read before its body (by range for a URL)."""

    manifest: BundleManifest
    namespaces: tuple[str, ...] | None
    """Its namespaces' names, or None: not told up front (a SQLite bundle whose manifest
    lists none; its names are in its entries)."""

    @classmethod
    def told(cls, manifest: BundleManifest, names: Iterable[str] | None, label: str) -> Header:
        """The header of the bundle `label`, each name it tells checked as every reader
        checks a bundle's names (`check_namespace_names`): the list decides whether a
        body is fetched (is the bundle stale?), so a name no namespace can be is a
        `CorruptBundleError` naming the bundle, before the list is used."""
        if names is None:
            return cls(manifest, None)
        told = tuple(names)
        check_namespace_names(told, label)
        return cls(manifest, told)


class BundleFormat(enum.StrEnum):
    """The two bundle formats; `BundleFormat("flat")` works."""

    SQLITE = "sqlite"
    FLAT = "flat"


FORMAT_VERSIONS = (1, 2)
"""The versions of both formats warmenv reads and writes: 1, 0.1's (entries alone),
and 2, what export writes by default (each entry carries its written_at and cost)."""


@runtime_checkable  # so that an argument that is none is refused at the call (import)
class Bundle(Protocol):
    """A read-only set of entries with a manifest; an async context manager.

    Subclass `BundleReader` to get `verify`, `private_copy` and `entry_file`
    with their usual meaning.
    """

    @property
    def format(self) -> BundleFormat:
        """The bundle's format."""
        ...

    @property
    def format_version(self) -> int:
        """The version of its format: 2 when entries carry their written_at and cost, else 1."""
        ...

    @property
    def entry_file(self) -> Path | None:
        """A SQLite file of the environment schema an environment may copy in bulk."""
        ...

    async def compute_digest(self, progress: DigestProgress | None = None) -> str:
        """The content digest of what the bundle holds (compare with the manifest's).

        `progress` is called with a `Verifying` event as the digest goes
        (bytes of keys and values hashed, of the whole).
        """
        ...

    async def verify(
        self, progress: DigestProgress | None = None, *, trust: TrustLike = None
    ) -> PublicKey | None:
        """`CorruptBundleError` unless the content matches the manifest's digest, and
        `SignatureError` unless its signature passes `trust` (keys, a `Trust`, or `None`:
        the configuration's; see `warmenv.bundle.signing`). Returns the trusted key that
        signed it, or `None` (unsigned, or no signature checked)."""
        ...

    def verifying(self) -> AsyncIterator[Verifying]:
        """`verify`, as events: `Verifying` steps, then `CorruptBundleError` at the end
        unless the content matches (an import yields these in its own stream)."""
        ...

    async def private_copy(self, near: Path | None) -> Bundle | None:
        """A copy no other process can change, opened, for an import; `None` if this is one."""
        ...

    @property
    def manifest(self) -> BundleManifest:
        """What the bundle says about itself (validated when it was opened)."""
        ...

    async def get(self, namespace: Namespace | str, key: bytes) -> bytes | None:
        """The value of one entry, or `None`."""
        ...

    def scan(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every entry of one namespace in key order, `batch_size` at a time."""
        ...

    def scan_with_provenance(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[CarryingEntry]:
        """As `scan`, each entry as `(key, value, written_at, cost)`: what it carries
        (bundle format 2), each None where unknown or not believed."""
        ...

    async def namespaces(self) -> list[NamespaceSummary]:
        """Every namespace the bundle holds, with entries and bytes."""
        ...

    def describe(self) -> str:
        """The format, the file and the bundle's name, for messages."""
        ...

    async def aclose(self) -> None:
        """Close the file; the bundle is unusable after."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class ClosesOnExit(AsyncWith):
    """`async with bundle:` closes the bundle on exit (a bundle reader's mixin)."""

    __slots__ = ()
    _async_form = "bundle"

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class BundleReader(ClosesOnExit):
    """What the readers share: verification against the manifest, and the defaults."""

    __slots__ = ()
    format: ClassVar[BundleFormat]

    @property
    def manifest(self) -> BundleManifest:
        raise NotImplementedError

    @property
    def format_version(self) -> int:
        return 1

    def describe(self) -> str:
        raise NotImplementedError

    async def namespaces(self) -> list[NamespaceSummary]:
        raise NotImplementedError

    def scan(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    async def scan_with_provenance(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[CarryingEntry]:
        """Without anything carried (a bundle of format 1): both unknown."""
        async for key, value in self.scan(namespace, batch_size):
            yield key, value, None, None

    @property
    def entry_file(self) -> Path | None:
        return None

    async def _digest_steps(self) -> AsyncGenerator[int | str, None]:
        """The digest as it goes: bytes of keys and values done (ints, from 0 up), then
        the digest (a str). The readers override it; this streams every namespace."""
        digest = Digest()
        done = 0
        yield done
        for summary in await self.namespaces():
            raw = summary.namespace.encode("utf-8")
            async for key, value in self.scan(summary.namespace):
                digest.update(raw, key, value)
                done += len(key) + len(value)
            yield done
        yield digest.value()

    async def _digest(self, result: Callable[[str], None]) -> AsyncGenerator[Verifying, None]:
        """`_digest_steps` as events; the digest goes to `result` at the end."""
        total = sum(summary.bytes for summary in await self.namespaces())
        async with aclosing(self._digest_steps()) as steps:
            async for step in steps:
                if isinstance(step, str):
                    result(step)
                else:
                    yield Verifying(step, total)

    async def compute_digest(self, progress: DigestProgress | None = None) -> str:
        result: list[str] = []
        async with aclosing(self._digest(result.append)) as events:
            async for event in events:
                if progress is not None:
                    progress(event)
        return result[0]

    async def verify(
        self, progress: DigestProgress | None = None, *, trust: TrustLike = None
    ) -> PublicKey | None:
        checked = await anyio.to_thread.run_sync(resolve_trust, trust)
        signer = check_signature(self.manifest, checked, self.describe())
        async for event in self.verifying():
            if progress is not None:
                progress(event)
        return signer

    async def verifying(self) -> AsyncGenerator[Verifying, None]:
        result: list[str] = []
        async with aclosing(self._digest(result.append)) as events:
            async for event in events:
                yield event
        expected, actual = self.manifest.digest, result[0]
        if actual != expected:
            raise CorruptBundleError(
                f"{self.describe()}: its content does not match its digest (manifest says "
                f"{expected}, content hashes to {actual})"
            )

    async def private_copy(self, near: Path | None) -> Bundle | None:
        return None


B = TypeVar("B", bound=ClosesOnExit)
B_co = TypeVar("B_co", bound=ClosesOnExit, covariant=True)


class FileFormat(abc.ABC, Generic[B_co]):
    """A bundle format as files: how a file of it is recognised and opened.

    One instance per format, listed once in `warmenv.bundle.formats`, which
    is the only place that tells the formats apart by a file's first bytes;
    what differs by format is a method here, never a test of the format's name.
    """

    __slots__ = ()
    format: ClassVar[BundleFormat]
    magic: ClassVar[bytes]
    """The bytes a file of the format starts with."""
    header_in_front: ClassVar[bool] = False
    """Whether the manifest comes first (readable by a range request)."""
    names_in_front: ClassVar[bool] = False
    """Whether the namespace names always come first too (so a file need never be
    opened whole for them); a SQLite manifest lists them only since format 2."""
    header_limit: ClassVar[int] = 0
    """The most bytes from the file's start that `header` is given before a reader gives
    up reading ahead (and reads the whole file instead)."""

    def matches(self, head: bytes) -> bool:
        """Whether a file starting with `head` is of this format (by its magic)."""
        return head.startswith(self.magic)

    @abc.abstractmethod
    async def open(self, path: Path) -> B_co:
        """Open and validate the file at `path` in place; the caller closes it."""

    @abc.abstractmethod
    async def open_private_copy(
        self, fd: int, near: Path | None, label: str, *, verified: bool
    ) -> B_co:
        """Copy the open file `fd` into a private directory beside `near` and open the copy
        (`verified`: the caller checks the digest before reading entries)."""

    @abc.abstractmethod
    async def open_private_file(self, path: Path, label: str) -> B_co:
        """Open a file that already lies in a private directory (a download); the bundle
        owns it, and it is removed if the open fails."""

    kind: ClassVar[str]
    """What a file of the format is called where it is cut short ("a SQLite file")."""

    def declared_size(self, head: bytes) -> int | None:
        """The bytes a file starting with `head` (`_files.HEAD_SIZE` of them, or all it
        holds) needs, where its first bytes say: a file shorter was cut short."""
        return None

    def check_whole(self, head: bytes, size: int, label: str) -> None:
        """`CorruptBundleError` if the file `label`, of `size` bytes and starting with
        `head`, is shorter than its first bytes say (`declared_size`): cut short."""
        declared = self.declared_size(head)
        if declared is not None and size < declared:
            needs = f"the file needs {declared:,} bytes"
            raise CorruptBundleError(cut_short(label, self.kind, size, needs))

    def header(self, data: bytes, label: str) -> Header | None:
        """The manifest (and namespace names, where told up front) from the first bytes
        of a file (`data`), or `None` if they are not all there (only where
        `header_in_front`)."""
        return None

    def is_bundle(self, path: Path) -> bool:
        """Whether the file at `path`, which starts with the magic, is a bundle of this
        format: export replaces only those (another file of the same first bytes is left
        alone), and refuses them as sources (a bundle is imported, not exported)."""
        return True

    @abc.abstractmethod
    def writer(
        self,
        path: Path,
        manifest: BundleManifest,
        totals: dict[str, tuple[int, int]],
        *,
        format_version: int,
        expected_bytes: int,
    ) -> StagingWriter:
        """A bundle of this format being written to the staging file `path` (it exists,
        empty), for entries of the namespaces and sizes `totals` (entries, bytes)."""

    def copier(
        self,
        new_staging: Callable[[], Path],
        source: Path,
        prefixes: list[str] | None,
        *,
        format_version: int,
        expected_bytes: int,
    ) -> StagingCopier | None:
        """A bundle of this format filled from the one environment `source` by the format
        itself, in a staging file it asks `new_staging` for; `None` where the format has
        no such copy (export then reads the source's rows and hands them to `writer`)."""
        return None


class StagingWriter(Protocol):
    """A bundle being written to its staging file, for export."""

    def add(self, rows: list[CarriedRow], packed: list[PackedRow]) -> None:
        """Append a batch of entries in key order (`packed`: the same with their carried
        bytes packed, which a format may write instead)."""
        ...

    def finish(self, manifest: BundleManifest) -> None:
        """Write the manifest (with its digest), sync and close: the file is complete."""
        ...

    def close(self) -> None:
        """Close it unfinished (the caller removes the file)."""
        ...


class StagingCopier(StagingWriter, Protocol):
    """A bundle that copies its entries from one environment itself (`FileFormat.copier`)."""

    totals: dict[str, tuple[int, int]]
    """Entries and bytes per namespace that the copy will hold."""
    skipped: int
    """Rows of the source left out (wrong types, namespaces no reader accepts)."""

    def copy_step(self, limit: int) -> list[CarriedRow]:
        """Copy the next `limit` entries; the rows as written (empty: done)."""
        ...

    def reserve(self, manifest: BundleManifest) -> None:
        """Write `manifest` (its digest and signature placeholders of their final lengths)
        ahead of the entries, where `finish` fills it in."""
        ...


@final
class BundleOpener(AsyncWith, Generic[B]):
    """What every `open` returns: opens (and validates) on entry, closes on exit."""

    __slots__ = ("_bundle", "_open")
    _async_form = "open_bundle(path) as bundle"

    def __init__(self, open: Callable[[], Awaitable[B]]) -> None:
        self._open = open
        self._bundle: B | None = None

    async def __aenter__(self) -> B:
        self._bundle = await self._open()
        return self._bundle

    async def __aexit__(self, *exc: object) -> None:
        if self._bundle is not None:
            await self._bundle.aclose()
