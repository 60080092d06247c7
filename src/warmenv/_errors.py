"""The root of warmenv's exceptions.

Every error warmenv raises on purpose derives from `WarmenvError`, so an
application can tell "warmenv refused this" from a bug with one `except`.
"""

from __future__ import annotations


class WarmenvError(Exception):
    """Base class of every error warmenv raises on purpose."""


class WarmenvWarning(UserWarning):
    """Something degraded but kept working (an environment fell back to memory, say)."""


class ClosedError(WarmenvError, RuntimeError):
    """An environment, storage or bundle was used after it was closed."""


class RemoteError(WarmenvError):
    """The remote setting cannot be used (a malformed URL, or the `redis` extra missing).

    Here rather than beside the Redis tier, because the configuration raises
    it too (a bad `WARMENV_REMOTE`) and imports nothing of the tier.
    """
