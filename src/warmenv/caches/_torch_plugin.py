"""torch's side of `warmenv run --cache torch`: the command's hits, counted as `use()` counts them.

`import torch` loads this module itself (the `torch.backends` entry point
that `warmenv run` declares for its command only, `caches/_children.py`)
and calls `autoload()`. Under `warmenv run` that notes the kernels the
restore left in Inductor's cache directory (`TORCHINDUCTOR_CACHE_DIR`,
which `warmenv run` sets), reads Inductor's hit line for each graph, and
at exit reports Inductor's own counters with the entries that served this
process (`served_here`); elsewhere it does nothing. It registers no device
backend. torch skips it, with every other extension, under
`TORCH_DEVICE_BACKEND_AUTOLOAD=0`.
"""

from __future__ import annotations

import atexit
import logging
import os
from pathlib import Path

from warmenv.caches import torch as _torch
from warmenv.caches._children import COUNTS_VARIABLE, write_counts

__all__ = ["autoload"]

log = logging.getLogger("warmenv.caches")


def autoload() -> None:
    """torch's extension entry: count this process's hits for `warmenv run` (never raises)."""
    directory = os.environ.get(_torch.CACHE_DIR_VARIABLE)
    if not os.environ.get(COUNTS_VARIABLE) or not directory:
        return
    try:
        cache_dir = Path(os.path.abspath(directory))
        present = _torch.kernels_in(cache_dir)  # there before this process compiled
        _torch.listen()
    except Exception:  # torch turns an extension's exception into a failed `import torch`
        log.exception("counting torch.compile's cache hits for warmenv run failed")
        return
    atexit.register(_write_counts, cache_dir, present)


def _write_counts(cache_dir: Path, present: frozenset[str]) -> None:
    hits, misses, _ = _torch.hits()
    write_counts("torch", hits, misses, _torch.served_here(cache_dir, present))
