"""warmenv: keep expensive start-up results warm, and ship them between machines.

Public names only; each lives in the module named after its concept.
"""

from __future__ import annotations

from warmenv._errors import ClosedError, WarmenvError, WarmenvWarning
from warmenv._version import __version__
from warmenv.config import Config, ConfigError, load_config
from warmenv.environment import (
    Environment,
    EnvironmentLockedError,
    NotAnEnvironmentError,
    activate,
    active,
    open_environment,
    set_root,
)
from warmenv.persistence import (
    MISSING,
    BytesCodec,
    CacheMode,
    Codec,
    Conflict,
    Failed,
    Insertion,
    InsertSummary,
    JsonCodec,
    MemoryStorage,
    Missing,
    Namespace,
    NamespaceSummary,
    Origin,
    Purged,
    Storage,
    Store,
    Stored,
)
from warmenv.remote import RemoteSettings

__all__ = [
    "MISSING",
    "BytesCodec",
    "CacheMode",
    "ClosedError",
    "Codec",
    "Config",
    "ConfigError",
    "Conflict",
    "Environment",
    "EnvironmentLockedError",
    "Failed",
    "InsertSummary",
    "Insertion",
    "JsonCodec",
    "MemoryStorage",
    "Missing",
    "Namespace",
    "NamespaceSummary",
    "NotAnEnvironmentError",
    "Origin",
    "Purged",
    "RemoteSettings",
    "Storage",
    "Store",
    "Stored",
    "WarmenvError",
    "WarmenvWarning",
    "__version__",
    "activate",
    "active",
    "load_config",
    "open_environment",
    "set_root",
]

del annotations  # the `from __future__` name: not a public one (dir(), completion)
