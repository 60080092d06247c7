"""warmenv: keep expensive start-up results warm, and ship them between machines.

Public names only; each lives in the module named after its concept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# First of warmenv's modules: it guards a Ctrl-C while the `warmenv` command loads.
from warmenv import _interrupt  # noqa: F401
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

if TYPE_CHECKING:
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


def __getattr__(name: str) -> object:
    # `RemoteSettings` is the shared tier's: its room (`warmenv.remote`, coredis behind
    # it) is imported at its first use, not by every `import warmenv`.
    if name == "RemoteSettings":
        from warmenv.remote import RemoteSettings

        globals()[name] = RemoteSettings  # once: the next lookup finds it
        return RemoteSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, `RemoteSettings` imported yet or not, and the submodules so far."""
    return sorted(set(globals()) | set(__all__))


del annotations, TYPE_CHECKING  # not public names (dir(), completion)
