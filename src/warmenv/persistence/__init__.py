"""Where warmed results live: namespaces, storage backends and typed stores."""

from __future__ import annotations

from warmenv.persistence.codec import BytesCodec, Codec, JsonCodec
from warmenv.persistence.memory import MemoryStorage
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.sqlite.storage import SqliteStorage
from warmenv.persistence.storage import (
    Conflict,
    Failed,
    Insertion,
    InsertSummary,
    NamespaceSummary,
    Origin,
    Purged,
    Storage,
    Stored,
)
from warmenv.persistence.store import MISSING, CacheMode, Missing, Store

__all__ = [
    "MISSING",
    "BytesCodec",
    "CacheMode",
    "Codec",
    "Conflict",
    "Failed",
    "InsertSummary",
    "Insertion",
    "JsonCodec",
    "MemoryStorage",
    "Missing",
    "Namespace",
    "NamespaceSummary",
    "Origin",
    "Purged",
    "SqliteStorage",
    "Storage",
    "Store",
    "Stored",
]

del annotations  # the `from __future__` name: not a public one (dir(), completion)
