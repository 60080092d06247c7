"""The SQLite bundle: the environment schema in one file, with its manifest.

It is the native format: importing it into a SQLite environment is a copy
inside SQLite (persistence's bulk copy), never a trip through Python. It is
written in journal mode DELETE so it reads from a read-only directory (a
container layer, site-packages, a Nix store) without needing to create a
shared-memory file next to it. Rows whose key or value is not a BLOB are
malformed and make the whole bundle corrupt; nothing is ever coerced. Format
2 (what export writes; meta `schema_version` 2) adds each entry's
`written_at` and `cost` columns, REAL or NULL; format 1 (0.1's four columns)
is still read. The SQL lives beside it (`file`, `staging`, `schema`); this
module speaks bundles.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar, final

import anyio
import anyio.lowlevel
import anyio.to_thread

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
    InvalidManifestError,
    NotABundleError,
    UnsupportedSchemaError,
)
from warmenv.bundle.manifest import BundleManifest
from warmenv.bundle.sqlite.file import BundleFile
from warmenv.bundle.sqlite.head import HEADER_LIMIT, declared_size, read_header
from warmenv.bundle.sqlite.schema import has_manifest
from warmenv.bundle.sqlite.staging import StagingFile
from warmenv.persistence.carried import CarryingEntry
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.storage import NamespaceSummary, check_batch_size, check_key

__all__ = ["SQLITE", "SQLITE_MAGIC", "SqliteBundle", "SqliteFormat"]

T = TypeVar("T")
R = TypeVar("R", bound=tuple[Any, ...])  # a row: the key first

SQLITE_MAGIC = b"SQLite format 3\x00"


@final
class SqliteBundle(BundleReader, Bundle):
    """A SQLite bundle opened read-only and validated."""

    __slots__ = ("_fd", "_file", "_label", "_manifest", "_private")
    format: ClassVar[BundleFormat] = BundleFormat.SQLITE

    def __init__(
        self,
        file: BundleFile,
        manifest: BundleManifest,
        fd: int | None,
        label: str,
        private: bool,
    ) -> None:
        self._file = file
        self._manifest = manifest
        self._fd = fd
        self._label = label
        self._private = private

    @classmethod
    def open(cls, path: str | Path) -> BundleOpener[SqliteBundle]:
        """`async with SqliteBundle.open(path) as bundle:` opens and validates it."""
        return BundleOpener(partial(open_sqlite_bundle, Path(path)))

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def manifest(self) -> BundleManifest:
        return self._manifest

    @property
    def entry_file(self) -> Path | None:
        # Only a private copy may be read again by path: nobody else can swap it.
        # (A bundle's text is UTF-8, as an environment's: SQLite copies between them.)
        return self._file.path if self._private else None

    def describe(self) -> str:
        return f"SQLite bundle {self._label} ('{brief(self._manifest.name)}')"

    async def namespaces(self) -> list[NamespaceSummary]:
        await anyio.lowlevel.checkpoint()
        return list(self._file.namespaces)

    async def get(self, namespace: Namespace | str, key: bytes) -> bytes | None:
        check_key(key)
        return await self._file.get(str(namespace), key)

    def scan(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        return self._pages(self._file.page, namespace, batch_size)

    def scan_with_provenance(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[CarryingEntry]:
        return self._pages(self._file.page_carrying, namespace, batch_size)

    async def _pages(
        self,
        page: Callable[[str, bytes | None, int], Awaitable[list[R]]],
        namespace: Namespace | str,
        batch_size: int,
    ) -> AsyncIterator[R]:
        """Every row of `namespace`, read a page of `batch_size` at a time, in key order."""
        check_batch_size(batch_size)
        after: bytes | None = None
        while True:
            rows = await page(str(namespace), after, batch_size)
            for row in rows:
                yield row
            if len(rows) < batch_size:
                return
            after = rows[-1][0]

    @property
    def format_version(self) -> int:
        """1 (entries alone) or 2 (each entry carries its written_at and cost)."""
        return self._file.format or 1

    def _digest_steps(self) -> AsyncGenerator[int | str, None]:
        return self._file.hash_entries()

    async def private_copy(self, near: Path | None) -> SqliteBundle | None:
        if self._private or self._fd is None:
            return None
        return await self.from_private_copy(self._fd, near, self._label)

    @classmethod
    async def from_private_copy(
        cls, fd: int, near: Path | None, label: str, *, verified: bool = False
    ) -> SqliteBundle:
        """Copy the open file `fd` to a private directory and open the copy.

        `verified`: the caller verifies the digest before reading entries, and
        that pass checks every row's types, so the open skips its own scan.
        """
        copy = await anyio.to_thread.run_sync(_files.copy_to_private, fd, near, "bundle.sqlite")
        return await cls.from_private_file(copy, label, verified=verified)

    @classmethod
    async def from_private_file(
        cls, path: Path, label: str, *, verified: bool = False
    ) -> SqliteBundle:
        """Open a file in a private directory (a copy, a download); the bundle owns it,
        and it is removed if the open fails."""
        try:
            return await _open_checked(path, None, label, private=True, check_rows=not verified)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_files.remove_private, path)
            raise

    async def aclose(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        with anyio.CancelScope(shield=True):
            await self._file.close()
            if self._private:
                await anyio.to_thread.run_sync(_files.remove_private, self._file.path)


async def open_sqlite_bundle(path: Path) -> SqliteBundle:
    """Open and validate; every failure is a `BundleError` (or `OSError` if unreadable)."""
    fd = await anyio.to_thread.run_sync(_files.open_regular, path)
    try:
        head = await anyio.to_thread.run_sync(_files.read_head, fd)
        size = os.fstat(fd).st_size
        if not SQLITE.matches(head):
            magics = {SQLITE.kind: SQLITE_MAGIC}
            raise NotABundleError(not_a_bundle(str(path), head, size, magics))
        SQLITE.check_whole(head, size, str(path))
        return await _open_checked(path, fd, str(path), private=False)
    except BaseException:
        os.close(fd)
        raise


async def _open_checked(
    path: Path, fd: int | None, label: str, *, private: bool, check_rows: bool = True
) -> SqliteBundle:
    file = await BundleFile.open(path, label, check_rows=check_rows)
    try:
        manifest_text = file.manifest
        if manifest_text is None:
            raise NotABundleError(
                f"{label} is a SQLite database of warmenv's schema without a manifest "
                "(an environment, not a bundle); export it to make a bundle"
            )
        if file.format is None:
            raise NotABundleError(
                f"{label} has a manifest over an environment's entries table, which no "
                "warmenv bundle has; export the environment to make a bundle"
            )
        if not isinstance(manifest_text, str):
            raise InvalidManifestError(f"{label}: its manifest is not text")
        check_namespace_names((s.namespace for s in file.namespaces), label)
        try:
            manifest = BundleManifest.from_json(manifest_text)
        except (InvalidManifestError, UnsupportedSchemaError) as exc:
            raise type(exc)(f"{label}: {exc}") from None
        check_listed(manifest, (s.namespace for s in file.namespaces), label)
    except BaseException:
        await file.close()
        raise
    return SqliteBundle(file, manifest, fd, label, private)


@final
class SqliteFormat(FileFormat[SqliteBundle]):
    """The SQLite bundle as files: a SQLite database (its magic) holding a manifest."""

    __slots__ = ()
    format: ClassVar[BundleFormat] = BundleFormat.SQLITE
    magic: ClassVar[bytes] = SQLITE_MAGIC
    header_in_front: ClassVar[bool] = True  # the manifest, since export writes it first
    header_limit: ClassVar[int] = HEADER_LIMIT

    kind: ClassVar[str] = "SQLite file"

    def declared_size(self, head: bytes) -> int | None:
        return declared_size(head)

    def header(self, data: bytes, label: str) -> Header | None:
        return read_header(data, label)

    async def open(self, path: Path) -> SqliteBundle:
        return await open_sqlite_bundle(path)

    async def open_private_copy(
        self, fd: int, near: Path | None, label: str, *, verified: bool
    ) -> SqliteBundle:
        return await SqliteBundle.from_private_copy(fd, near, label, verified=verified)

    async def open_private_file(self, path: Path, label: str) -> SqliteBundle:
        return await SqliteBundle.from_private_file(path, label)

    def is_bundle(self, path: Path) -> bool:
        # Any SQLite database starts with the magic: only one with a manifest is a bundle.
        return has_manifest(path)

    def writer(
        self,
        path: Path,
        manifest: BundleManifest,
        totals: dict[str, tuple[int, int]],
        *,
        format_version: int,
        expected_bytes: int,
    ) -> StagingFile:
        staging = StagingFile(path, expected_bytes=expected_bytes, format_version=format_version)
        try:
            staging.reserve(manifest)
            staging.begin()
        except BaseException:
            staging.close()
            raise
        return staging

    def copier(
        self,
        new_staging: Callable[[], Path],
        source: Path,
        prefixes: list[str] | None,
        *,
        format_version: int,
        expected_bytes: int,
    ) -> StagingFile:
        # One source is copied inside SQLite (ATTACH, INSERT ... SELECT by batches); the
        # digest is then taken from the rows as written, read back while still cached.
        staging = StagingFile(
            new_staging(), expected_bytes=expected_bytes, format_version=format_version
        )
        try:
            staging.attach_source(source, prefixes)
        except BaseException:
            staging.close()
            raise
        return staging


SQLITE = SqliteFormat()
