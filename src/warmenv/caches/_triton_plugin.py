"""Triton's side of `warmenv run --cache triton`: the command's hits, as Triton looks them up.

Triton loads this module itself, by the name `warmenv run` gives its
command in `TRITON_CACHE_MANAGER`, when it first looks a kernel up;
nothing in warmenv imports it otherwise (it imports Triton). Its
`CountingCacheManager` is Triton's own `FileCacheManager`, reading the
directory `warmenv run` restored, that notes each kernel's lookup: Triton's
compile asks the cache manager for the kernel's index once, and its
compilation listener's `cache_hit` is whether it was found, so these are
Triton's hits and misses (the listener itself is read by `compile` before
the manager is loaded, too late for its first kernel). Each kernel found
counts its index and the files it names, as the live form counts them;
under `warmenv run` (`COUNTS_VARIABLE` set) all are reported at exit.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from triton.runtime.cache import FileCacheManager

from warmenv.caches import triton as _triton
from warmenv.caches._children import COUNTS_VARIABLE, write_counts

__all__ = ["CountingCacheManager"]

_lock = threading.Lock()
_counts = {"hits": 0, "misses": 0}
_served: dict[str, dict[str, int]] = {"groups": {}, "files": {}}
_COUNTING = bool(os.environ.get(COUNTS_VARIABLE))


class CountingCacheManager(FileCacheManager):  # type: ignore[misc]  # Triton is untyped
    """Triton's file cache manager, noting each kernel lookup (under `warmenv run`)."""

    def get_group(self, filename: str) -> Any:
        found = super().get_group(filename)
        if _COUNTING:
            with _lock:
                _counts["misses" if found is None else "hits"] += 1
                if found is not None:
                    _note("groups", f"{self.key}/{_triton.GROUP_PREFIX}{filename}")
                    for name in found:
                        _note("files", f"{self.key}/{name}")
        return found


def _note(part: str, key: str) -> None:
    _served[part][key] = _served[part].get(key, 0) + 1


def _write_counts() -> None:
    with _lock:
        write_counts("triton", _counts["hits"], _counts["misses"], _served)


if _COUNTING:
    atexit.register(_write_counts)
