"""Where an environment's compiler caches live when the user names no directory.

A cache directory is captured whole into the environment a run or `use()`
names, so a directory that two environments share carries one's compiled
files into the other: earlier versions gave every environment of a root
`<root>/caches/<tool>`, and a run in environment `b` that compiled nothing
captured what a run in `a` had left there (a bundle exported from `b` then
carried `a`'s files, and a run in `b` reported cache hits `b` never held).

So each environment has its own: `<root>/<name>.caches/<tool>`, beside its
database file `<root>/<name>.db` (an environment opened by file, `<dir>/<file>`,
has `<dir>/<file without .db>.caches`). A name is one path component by
`config.check_name`'s rule, and the `.caches` suffix keeps it clear of the
old shared `<root>/caches/`, which is left as it was (an environment named
`jax` would otherwise have had its directory inside the old `caches/jax`).
This module is the one home of that rule: the CLI's `run`, each tool's
`default_cache_dir` and Triton's live directory ask it.

A directory the user names (`cache_dir=`, `--cache-dir`, the tool's own
variable) is theirs to share; only the default is kept apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeAlias

from warmenv.environment import environment_file

if TYPE_CHECKING:
    from warmenv.blocking import BlockingEnvironment

__all__ = [
    "SUFFIX",
    "EnvironmentChoice",
    "default_cache_dir",
    "environment_caches",
    "not_an_environment",
    "tool_cache_dir",
]

EnvironmentChoice: TypeAlias = "BlockingEnvironment | str | None"
"""An open blocking environment (its file is used), an environment's name, or the default."""

SUFFIX: Final = ".caches"
_DATABASE_SUFFIX: Final = ".db"


def environment_caches(database: Path) -> Path:
    """The directory holding the default cache directories of the environment whose
    database file is `database`: `<dir>/<name>.caches` for `<dir>/<name>.db`."""
    return database.parent / f"{database.name.removesuffix(_DATABASE_SUFFIX)}{SUFFIX}"


def tool_cache_dir(database: Path, tool: str) -> Path:
    """`tool`'s default cache directory in the environment whose database file is `database`."""
    return environment_caches(database) / tool


def default_cache_dir(tool: str, env: EnvironmentChoice, root: str | Path | None) -> Path:
    """`tool`'s default cache directory in `env` (a name, an open `warmenv.blocking`
    environment, or `None`: the configured one) under `root` (for a name or `None`)."""
    return tool_cache_dir(_database(env, root), tool)


def _database(env: EnvironmentChoice, root: str | Path | None) -> Path:
    if env is None or isinstance(env, str):
        return environment_file(env, root=root)
    # Imported here: a process given an environment's name never needs the blocking face.
    from warmenv.blocking import BlockingEnvironment

    if isinstance(env, BlockingEnvironment):
        return env.path  # its file decides, in memory or not: the path it was asked to use
    raise not_an_environment(env)


def not_an_environment(env: object) -> TypeError:
    """The error for an `env` argument that chooses no environment."""
    return TypeError(
        f"env must be an environment's name, an open warmenv.blocking environment or None, "
        f"not {type(env).__name__}"
    )
