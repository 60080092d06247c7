"""JAX's side of `warmenv run --cache jax`: the command's hits, counted by JAX's own events.

JAX loads this module itself, as a plug-in (the `jax_plugins` entry point
that `warmenv run` declares for its command only, `caches/_children.py`),
when it starts its backends, before its first compile, and calls
`initialize()`. Under `warmenv run` that starts counting, as `use()` does
(JAX's monitoring events and its hit line per entry), and registers the
report of the counts at exit; elsewhere it does nothing. It registers no
backend.
"""

from __future__ import annotations

import atexit
import logging
import os

from warmenv.caches import jax as _jax
from warmenv.caches._children import COUNTS_VARIABLE, write_counts

__all__ = ["initialize"]

log = logging.getLogger("warmenv.caches")


def initialize() -> None:
    """JAX's plug-in entry: count this process's hits for `warmenv run` (never raises)."""
    if not os.environ.get(COUNTS_VARIABLE):
        return
    try:
        _jax.listen()
    except Exception:  # a hook must never break the command's JAX
        log.exception("counting JAX's cache hits for warmenv run failed")
        return
    atexit.register(_write_counts)


def _write_counts() -> None:
    hits, misses, _ = _jax.hits()
    write_counts("jax", hits, misses, {"files": _jax.served()}, uncached=_jax.uncached())
