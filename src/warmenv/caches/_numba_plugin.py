"""Numba's side of warmenv.caches.numba: the path-independent cache locator (imports Numba).

Numba loads this module itself, by the name given in
`NUMBA_CACHE_LOCATOR_CLASSES`, when it first caches a function; nothing in
warmenv imports it otherwise, so importing warmenv never imports Numba.

Numba's own locator for `NUMBA_CACHE_DIR` files a function's cache under
`<parent>_<sha1(absolute source directory)>`: the same code checked out at
another path looks in another directory and misses. `Locator` files it
under the function's module name instead (`mypackage.kernels`; a script's
functions, whose module is `__main__`, under `__main__.<parent>`), which
is the same wherever the code lives. Numba's index still records a digest
of the source file's content, so an entry is used only for the very source
it was compiled from; two modules of one name share a directory safely
(each rewrites an index whose digest is not its own).
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from numba.core import config
from numba.core.caching import UserProvidedCacheLocator

from warmenv.caches import numba as _numba
from warmenv.caches._children import COUNTS_VARIABLE, write_counts

__all__ = ["Locator"]


def _write_counts() -> None:
    counted = _numba.tally()  # one walk over the process's objects, not two
    write_counts("numba", counted.hits, counted.misses, {"files": dict(counted.served)})


if os.environ.get(COUNTS_VARIABLE):  # under `warmenv run`: report Numba's own counts at exit
    atexit.register(_write_counts)


class Locator(UserProvidedCacheLocator):  # type: ignore[misc]  # Numba is untyped
    """Numba's `NUMBA_CACHE_DIR` locator with a subdirectory that is the same on every machine."""

    def __init__(self, py_func: Any, py_file: str) -> None:
        super().__init__(py_func, py_file)
        subdirectory = _numba.subdirectory(py_func, py_file)
        self._warmenv_cache_path = os.path.join(config.CACHE_DIR, subdirectory)

    def get_cache_path(self) -> str:
        return self._warmenv_cache_path
