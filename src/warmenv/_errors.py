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


def require_number(value: object, rule: str, *, integral: bool = False) -> float:
    """`value` if it is a number (an `int`, or also a `float` unless `integral`), else
    `TypeError`: the `rule` ("share must be a number in (0, 1]") and what it got.

    The one rule of warmenv's numeric arguments (`ttl=`, `share=`, `batch_size=`):
    an argument of the wrong type is `TypeError` (here), one of the right type but
    out of range is `ValueError` (the caller's check), as `version=` has it. A
    `bool` is an `int` to Python, but `batch_size=True` is a mistake, not 1.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integral and not isinstance(value, int))
    ):
        raise TypeError(f"{rule}, got {type(value).__name__} {value!r}")
    return value
