"""The root of warmenv's exceptions.

Every error warmenv raises on purpose derives from `WarmenvError`, so an
application can tell "warmenv refused this" from a bug with one `except`.
"""

from __future__ import annotations


class WarmenvError(Exception):
    """Base class of every error warmenv raises on purpose."""
