"""The root of warmenv's exceptions.

Every error warmenv raises on purpose derives from `WarmenvError`, so an
application can tell "warmenv refused this" from a bug with one `except`.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from contextvars import ContextVar
from pathlib import Path
from types import FrameType
from typing import Any


class WarmenvError(Exception):
    """Base class of every error warmenv raises on purpose."""


class WarmenvWarning(UserWarning):
    """Something degraded but kept working (an environment fell back to memory, say)."""


_OURS = (str(Path(__file__).parent), contextlib.__file__)

Where = tuple[str, int, dict[str, Any]]
"""A line of the caller's code: its file, its number and its module's globals."""

CALLER: ContextVar[Where | None] = ContextVar("warmenv_caller", default=None)
"""The line a blocking call came from, for what runs on warmenv.blocking's loop thread
(set by its crossing: no frame of the caller's is on that thread's stack)."""


def caller(frame: FrameType | None) -> Where | None:
    """The first line out from `frame` that is neither warmenv's nor contextlib's
    (whose `async with` machinery sits between a user's block and ours)."""
    while frame is not None and frame.f_code.co_filename.startswith(_OURS):
        frame = frame.f_back
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals


def warn(message: str) -> None:
    """Emit `message` as a `WarmenvWarning` attributed to the caller's line, never ours.

    The one home of the rule, so no warning needs a hand-counted `stacklevel`,
    which breaks with every added wrapper and cannot reach across threads.
    """
    where = CALLER.get() or caller(inspect.currentframe())
    if where is None:  # called from no code of anyone's (a loop's callback): ours
        warnings.warn(message, WarmenvWarning, stacklevel=2)
        return
    filename, lineno, module_globals = where
    warnings.warn_explicit(
        message,
        WarmenvWarning,
        filename,
        lineno,
        module=module_globals.get("__name__", "<string>"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )


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
