"""How to install one of warmenv's extras, said so that it works here.

warmenv is not published on PyPI, so `pip install 'warmenv[http]'` would
fetch nothing (or someone else's package). The hint is built from warmenv's
own distribution metadata instead: installed from a local directory (PEP
610's `direct_url.json` with a `file://` URL, as `pip install -e .` writes
it), the hint installs the extra from that directory; installed any other
way, it names the extra's own requirements (`pip install 'httpx>=0.27'`),
which any index serves; not installed at all (a clone on `sys.path`), it
installs the extra from that clone. Pins stay as `pyproject.toml` writes them (torch's
exact one: a bare `torch` can pull gigabytes of CUDA).
"""

from __future__ import annotations

import json
import re
import shlex
from importlib import metadata
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

__all__ = ["hint_from", "install_hint"]

_DISTRIBUTION: Final = "warmenv"
_MAX_DIRECT_URL: Final = 1 << 16
"""More than a PEP 610 record ever holds: a longer one is not read."""
_EXTRA_MARKER: Final = re.compile(r"""^\s*extra\s*==\s*["']([^"']+)["']\s*$""")


def install_hint(extra: str) -> str:
    """The command that installs warmenv's extra `extra` wherever warmenv came from."""
    try:
        distribution: metadata.Distribution | None = metadata.distribution(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        distribution = None
    return hint_from(distribution, extra)


def hint_from(distribution: metadata.Distribution | None, extra: str) -> str:
    """The hint for `extra` given warmenv's metadata (`None`: warmenv is not installed)."""
    if distribution is not None:
        local = _local_directory(distribution)
        if local is not None:
            directory, editable = local
            flag = "-e " if editable else ""
            return f"pip install {flag}{shlex.quote(f'{directory}[{extra}]')}"
        requirements = _requirements_of(distribution, extra)
        if requirements:
            return "pip install " + " ".join(shlex.quote(r) for r in requirements)
    clone = _clone_here()
    where = shlex.quote(f"{clone}[{extra}]") if clone else f"'<your warmenv clone>[{extra}]'"
    return f"pip install -e {where}"


def _clone_here() -> str | None:
    """The clone this warmenv is imported from, when it runs from one without being installed."""
    root = Path(__file__).resolve().parent.parent.parent  # <clone>/src/warmenv/_install.py
    return str(root) if (root / "pyproject.toml").is_file() else None


def _local_directory(distribution: metadata.Distribution) -> tuple[str, bool] | None:
    """The directory warmenv was installed from and whether editably, if it was a local one."""
    try:
        text = distribution.read_text("direct_url.json")
    except OSError:
        return None
    if text is None or len(text) > _MAX_DIRECT_URL:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(url := record.get("url"), str):
        return None
    parts = urlsplit(url)
    if parts.scheme != "file" or not parts.path:
        return None
    dir_info = record.get("dir_info")
    editable = isinstance(dir_info, dict) and dir_info.get("editable") is True
    return unquote(parts.path), editable


def _requirements_of(distribution: metadata.Distribution, extra: str) -> list[str]:
    """The requirements the extra adds, as `Requires-Dist` states them (markers dropped)."""
    found = []
    for line in distribution.requires or ():
        requirement, _, marker = line.partition(";")
        match = _EXTRA_MARKER.match(marker)
        if match is not None and match.group(1) == extra:
            found.append(requirement.strip())
    return found
