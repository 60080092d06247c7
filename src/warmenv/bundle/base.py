"""What every bundle reader offers, and the errors a bundle can raise.

A bundle is untrusted input: a file from another machine, a download, a
container layer. Readers validate it completely when it is opened, and
whatever is wrong with it surfaces as one of the `BundleError` subclasses
below (or `OSError` for a file that cannot be read at all), never as a
crash from deep inside a parser.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar, final

from warmenv._errors import WarmenvError
from warmenv.bundle.manifest import BundleManifest
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.storage import NamespaceSummary

__all__ = [
    "Bundle",
    "BundleOpener",
    "ClosesOnExit",
    "BundleError",
    "BundleTooLargeError",
    "CorruptBundleError",
    "InvalidManifestError",
    "NotABundleError",
    "UnsupportedSchemaError",
]


class BundleError(WarmenvError):
    """Something is wrong with a bundle; nothing was imported from it."""


class NotABundleError(BundleError):
    """The file is neither a SQLite bundle nor a flat bundle."""


class InvalidManifestError(BundleError):
    """The manifest does not parse, or a field holds the wrong thing."""


class UnsupportedSchemaError(BundleError):
    """The manifest's schema (or the flat format version) is newer than this warmenv."""


class CorruptBundleError(BundleError):
    """The bundle's structure is damaged or its content does not match its digest."""


class BundleTooLargeError(BundleError):
    """The entries do not fit the format (a flat bundle's data is limited to 4 GiB)."""


class Bundle(Protocol):
    """A read-only set of entries with a manifest; an async context manager."""

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


class ClosesOnExit:
    """`async with bundle:` closes the bundle on exit (a bundle reader's mixin)."""

    __slots__ = ()

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


B = TypeVar("B", bound=ClosesOnExit)


@final
class BundleOpener(Generic[B]):
    """What every `open` returns: opens (and validates) on entry, closes on exit."""

    __slots__ = ("_bundle", "_open")

    def __init__(self, open: Callable[[], Awaitable[B]]) -> None:
        self._open = open
        self._bundle: B | None = None

    async def __aenter__(self) -> B:
        self._bundle = await self._open()
        return self._bundle

    async def __aexit__(self, *exc: object) -> None:
        if self._bundle is not None:
            await self._bundle.aclose()
