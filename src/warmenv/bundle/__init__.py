"""Bundles: pre-warmed entries packaged under a name, imported to skip a cold start.

A bundle is only ever used to fill the local storage: import copies its
entries into an environment (origin IMPORTED), after which the file can be
deleted. There is no read path in which a bundle participates, so no cache
hit ever depends on a file staying installed.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmenv._keys import KeyFileError, PublicKey
    from warmenv.bundle.base import Bundle
    from warmenv.bundle.download import DownloadError, DownloadOptions
    from warmenv.bundle.errors import (
        BundleError,
        BundleNotFoundError,
        BundleTooLargeError,
        CorruptBundleError,
        InvalidManifestError,
        InvalidSourceError,
        NotABundleError,
        SignatureError,
        StaleBundleError,
        UnsupportedSchemaError,
    )
    from warmenv.bundle.events import (
        BundleEvent,
        BundleFinished,
        BundleProgress,
        BundleStarted,
        Downloading,
        Event,
        ExportEvent,
        ExportReport,
        Finished,
        ImportEvent,
        ImportReport,
        NotFinishedError,
        Progress,
        Started,
        Verifying,
    )
    from warmenv.bundle.exporting import (
        BundleFormat,
        ExportProgress,
        export_bundle,
        exporting,
    )
    from warmenv.bundle.flat.bundle import FlatBundle
    from warmenv.bundle.importing import ImportProgress, import_bundle, importing
    from warmenv.bundle.manifest import BundleManifest, EnvironmentInfo, Signature
    from warmenv.bundle.open import open_bundle
    from warmenv.bundle.options import ExportOptions, ImportOptions
    from warmenv.bundle.preflight import Preflight, preflight
    from warmenv.bundle.signing import SigningKey, SigningUnavailableError, Trust, generate_key
    from warmenv.bundle.sqlite.bundle import SqliteBundle
    from warmenv.bundle.warmup import WarmUp, WarmUpState, warm_up

__all__ = [
    "Bundle",
    "BundleError",
    "BundleEvent",
    "BundleFinished",
    "BundleFormat",
    "BundleManifest",
    "BundleNotFoundError",
    "BundleProgress",
    "BundleStarted",
    "BundleTooLargeError",
    "CorruptBundleError",
    "DownloadError",
    "DownloadOptions",
    "Downloading",
    "EnvironmentInfo",
    "Event",
    "ExportEvent",
    "ExportOptions",
    "ExportProgress",
    "ExportReport",
    "Finished",
    "FlatBundle",
    "ImportEvent",
    "ImportOptions",
    "ImportProgress",
    "ImportReport",
    "InvalidManifestError",
    "InvalidSourceError",
    "KeyFileError",
    "NotABundleError",
    "NotFinishedError",
    "Preflight",
    "Progress",
    "PublicKey",
    "Signature",
    "SignatureError",
    "SigningKey",
    "SigningUnavailableError",
    "SqliteBundle",
    "StaleBundleError",
    "Started",
    "Trust",
    "UnsupportedSchemaError",
    "Verifying",
    "WarmUp",
    "WarmUpState",
    "export_bundle",
    "exporting",
    "generate_key",
    "import_bundle",
    "importing",
    "open_bundle",
    "preflight",
    "warm_up",
]

_HOMES = {
    "Bundle": "warmenv.bundle.base",
    "BundleError": "warmenv.bundle.errors",
    "BundleEvent": "warmenv.bundle.events",
    "BundleFinished": "warmenv.bundle.events",
    "BundleFormat": "warmenv.bundle.exporting",
    "BundleManifest": "warmenv.bundle.manifest",
    "BundleNotFoundError": "warmenv.bundle.errors",
    "BundleProgress": "warmenv.bundle.events",
    "BundleStarted": "warmenv.bundle.events",
    "BundleTooLargeError": "warmenv.bundle.errors",
    "CorruptBundleError": "warmenv.bundle.errors",
    "DownloadError": "warmenv.bundle.download",
    "DownloadOptions": "warmenv.bundle.download",
    "Downloading": "warmenv.bundle.events",
    "EnvironmentInfo": "warmenv.bundle.manifest",
    "Event": "warmenv.bundle.events",
    "ExportEvent": "warmenv.bundle.events",
    "ExportOptions": "warmenv.bundle.options",
    "ExportProgress": "warmenv.bundle.exporting",
    "ExportReport": "warmenv.bundle.events",
    "Finished": "warmenv.bundle.events",
    "FlatBundle": "warmenv.bundle.flat.bundle",
    "ImportEvent": "warmenv.bundle.events",
    "ImportOptions": "warmenv.bundle.options",
    "ImportProgress": "warmenv.bundle.importing",
    "ImportReport": "warmenv.bundle.events",
    "InvalidManifestError": "warmenv.bundle.errors",
    "InvalidSourceError": "warmenv.bundle.errors",
    "KeyFileError": "warmenv._keys",
    "NotABundleError": "warmenv.bundle.errors",
    "NotFinishedError": "warmenv.bundle.events",
    "Preflight": "warmenv.bundle.preflight",
    "Progress": "warmenv.bundle.events",
    "PublicKey": "warmenv._keys",
    "Signature": "warmenv.bundle.manifest",
    "SignatureError": "warmenv.bundle.errors",
    "SigningKey": "warmenv.bundle.signing",
    "SigningUnavailableError": "warmenv.bundle.signing",
    "SqliteBundle": "warmenv.bundle.sqlite.bundle",
    "StaleBundleError": "warmenv.bundle.errors",
    "Started": "warmenv.bundle.events",
    "Trust": "warmenv.bundle.signing",
    "UnsupportedSchemaError": "warmenv.bundle.errors",
    "Verifying": "warmenv.bundle.events",
    "WarmUp": "warmenv.bundle.warmup",
    "WarmUpState": "warmenv.bundle.warmup",
    "export_bundle": "warmenv.bundle.exporting",
    "exporting": "warmenv.bundle.exporting",
    "generate_key": "warmenv.bundle.signing",
    "import_bundle": "warmenv.bundle.importing",
    "importing": "warmenv.bundle.importing",
    "open_bundle": "warmenv.bundle.open",
    "preflight": "warmenv.bundle.preflight",
    "warm_up": "warmenv.bundle.warmup",
}
"""Where each public name lives. Each is imported at its first use (`__getattr__`), so a
process that needs one room of the package (`warmenv.caches` restoring a compiler's cache
reads `signing`) does not import the others (downloads, the formats, import and export)."""


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    """The public names, imported yet or not, and the submodules imported so far."""
    return sorted((set(globals()) - {"importlib", "sys", "types", "TYPE_CHECKING"}) | set(__all__))


class _Package(types.ModuleType):
    """This package, keeping `importing`, `exporting` and `preflight` the functions.

    Importing a submodule binds it as an attribute of its package, and three
    functions share their module's name: once `warmenv.bundle.importing` (the
    module) is imported, the attribute would be the module. It stays the
    function, as it was when this package imported every name at once.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ == _HOMES.get(name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


del annotations  # the `from __future__` name: not a public one (dir(), completion)
