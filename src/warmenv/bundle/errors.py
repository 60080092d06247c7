"""The errors a bundle can raise, in a module of their own.

Every module of the bundle package raises these, so they live apart from
the readers and the manifest: nothing has to import a reader to raise one,
and no two modules import each other for them.
"""

from __future__ import annotations

from warmenv._errors import WarmenvError

__all__ = [
    "BundleError",
    "BundleNotFoundError",
    "BundleTooLargeError",
    "CorruptBundleError",
    "InvalidManifestError",
    "InvalidSourceError",
    "NotABundleError",
    "StaleBundleError",
    "SignatureError",
    "UnsupportedSchemaError",
]


class BundleError(WarmenvError):
    """Something is wrong with a bundle; nothing was imported from it."""


class NotABundleError(BundleError):
    """The file is not a bundle at all: not a regular file, or of neither format."""


class BundleNotFoundError(BundleError, FileNotFoundError):
    """No file is at the bundle's path (a `FileNotFoundError` too, as it was before)."""


class InvalidManifestError(BundleError):
    """The manifest does not parse, or a field holds the wrong thing."""


class UnsupportedSchemaError(BundleError):
    """The manifest's schema (or the flat format version) is newer than this warmenv."""


class CorruptBundleError(BundleError):
    """A bundle is damaged, its content does not match its digest, or it changed mid-import."""


class BundleTooLargeError(BundleError):
    """The entries do not fit the format (a flat bundle's data is limited to 4 GiB)."""


class InvalidSourceError(BundleError):
    """An export source is not an environment, an environment database or a root."""


class StaleBundleError(BundleError):
    """The bundle holds no namespace of the application's version: none of it could hit.

    Raised by an import given `version=` before the bundle's body is
    downloaded (where its header can be read by range) and before anything
    is written.
    """


class SignatureError(BundleError):
    """A bundle's signature was checked and refused: unsigned where a signature is
    required, signed by a key nobody trusts, or a signature that does not hold."""
