"""Compiler caches carried in environments: capture a tool's cache here, restore it there.

The cold starts users pay are mostly their compilers' (JAX/XLA, Numba,
Triton, torch.compile), and copying a compiler's cache directory to another
machine silently misses more often than not: each tool hashes something of
the machine that made the entry (a path, a setting, the CPU) into its keys.
This package captures a tool's cache into namespaces of an environment,
keyed path-independently, with everything that decides a hit in the
namespace's version segment (`Facts`), and restores it so that it hits,
fixing each tool's trap for the user. One module per tool
(`warmenv.caches.jax`, `.numba`, `.triton`, `.torch`) and a generic one for
any tool that caches in a directory (`warmenv.caches.directory`), all on
the shared core re-exported here.

Importing this package, or any module in it, imports no compiler: a tool's
package is imported only when its `use()` is called. The one exception is a
tool's plug-in module (`_<tool>_plugin.py`, e.g. Numba's cache locator),
which subclasses the tool's own classes and is loaded by the tool itself,
by the name warmenv gives it in the tool's settings.
"""

from __future__ import annotations

from warmenv._facts import Facts, TreeCheck, captured_trees
from warmenv.caches._paths import UnsafeTargetError
from warmenv.caches._restore import restore
from warmenv.caches._tree import (
    CacheTree,
    CaptureReport,
    LeftOut,
    RestoreReport,
    Skipped,
    capture,
)

__all__ = [
    "CacheTree",
    "CaptureReport",
    "Facts",
    "LeftOut",
    "RestoreReport",
    "Skipped",
    "TreeCheck",
    "UnsafeTargetError",
    "capture",
    "captured_trees",
    "restore",
]

del annotations  # the `from __future__` name: not a public one (dir(), completion)
