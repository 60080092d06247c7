"""Bundles: pre-warmed entries packaged under a name, imported to skip a cold start.

A bundle is only ever used to fill the local storage: import copies its
entries into an environment (origin IMPORTED), after which the file can be
deleted. There is no read path in which a bundle participates, so no cache
hit ever depends on a file staying installed.
"""

from __future__ import annotations

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

del annotations  # the `from __future__` name: not a public one (dir(), completion)
