"""warmenv: keep expensive start-up results warm, and ship them between machines.

Public names only; each lives in the module named after its concept.
"""

from __future__ import annotations

__version__ = "0.1.0"

from warmenv._errors import WarmenvError
from warmenv.config import Config, ConfigError, load_config

__all__ = [
    "Config",
    "ConfigError",
    "WarmenvError",
    "__version__",
    "load_config",
]
