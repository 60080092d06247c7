"""Where `warmenv run` keeps the hooks it gives its command: a directory no other user can touch.

The command, and whatever it leaves running after `warmenv run` ends (a
process started with `&`, nohup or setsid), imports from the directories
`warmenv run` puts first on its `PYTHONPATH` for as long as it lives, as
the user `warmenv run` ran as. So such a directory is never deleted under
it and is never one another user could create, replace or write (a
predictable name in `/tmp` would be theirs to recreate once removed): it
lies under this user's warmenv directory (`warmenv.config.user_root()`),
whose ancestors are checked as a restore checks its target
(`_paths.check_ancestors`), in a directory per warmenv version, named by a
digest of its contents, so that every run of the same hooks reuses it. It is
written under a temporary name and renamed into place whole; one found
there with other contents, other files, or open to other users is
replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from warmenv._version import __version__
from warmenv.caches._paths import TEMPORARY_PREFIX, UnsafeTargetError, check_ancestors
from warmenv.caches._paths import check_directory as check_private
from warmenv.config import user_root

__all__ = ["private_directory"]

_HOME: Final = ".run-hooks"
_CACHED: Final = "__pycache__"  # the bytecode Python writes beside an imported module
_OPEN: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_ATTEMPTS: Final = 3


def private_directory(files: Mapping[str, str]) -> Path:
    """A directory of this user's holding exactly `files` (relative path: text), made once.

    `UnsafeTargetError` if a directory above it is another user's or
    others can write it (the fix is in the message).
    """
    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:24]
    home = user_root() / _HOME / __version__
    final = home / digest
    check_ancestors(final)
    home.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(home, _OPEN | os.O_DIRECTORY)
    try:
        check_private(fd, home)
    finally:
        os.close(fd)
    for _ in range(_ATTEMPTS):
        if _holds(final, files):
            return final
        _install(home, final, files)
    if _holds(final, files):
        return final
    raise UnsafeTargetError(f"'{final}' keeps changing under warmenv run; remove it and rerun")


def _install(home: Path, final: Path, files: Mapping[str, str]) -> None:
    staging = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, suffix=".tmp", dir=home))
    try:
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            path.chmod(0o644)
        staging.chmod(0o755)
        try:
            os.rename(staging, final)
        except OSError:  # one is there: keep it if it is right (another run's), else replace it
            if _holds(final, files):
                return
            old = home / f"{TEMPORARY_PREFIX}{secrets.token_hex(8)}.old.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.rename(final, old)
                shutil.rmtree(old, ignore_errors=True)
            with contextlib.suppress(OSError):  # lost to another run: checked again
                os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _holds(directory: Path, files: Mapping[str, str]) -> bool:
    """Whether `directory` is exactly `files`, every part of it this user's and closed to others."""
    found: dict[str, str] = {}
    try:
        for where, subdirectories, names in os.walk(directory, onerror=_raise):
            subdirectories[:] = [d for d in subdirectories if d != _CACHED]
            if any(os.path.islink(os.path.join(where, d)) for d in subdirectories):
                return False  # os.walk would not look into it
            _read(Path(where), None)
            for name in names:
                path = Path(where) / name
                found[path.relative_to(directory).as_posix()] = _read(path, "")
    except (OSError, UnicodeDecodeError, UnsafeTargetError):
        return False
    return found == dict(files)


def _read(path: Path, text: str | None) -> str:
    """The text of the file at `path` (a directory: `text` is None), if it is private."""
    fd = os.open(path, _OPEN if text is not None else _OPEN | os.O_DIRECTORY)
    try:
        check_private(fd, path)
        if text is None:
            return ""
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeTargetError(f"'{path}' is not a file")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read().decode("utf-8")
    finally:
        os.close(fd)


def _raise(error: OSError) -> None:
    raise error
