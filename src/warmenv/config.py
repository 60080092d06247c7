"""Where environments live and which one is the default.

Settings come from the nearest `warmenv.toml` (top-level keys) or
`pyproject.toml` (`[tool.warmenv]`) walking up from the working directory,
then from the variables `WARMENV_ROOT`, `WARMENV_ENVIRONMENT`,
`WARMENV_REMOTE`, `WARMENV_TRUSTED_KEYS` and `WARMENV_REQUIRE_SIGNATURE`,
which win so that a deployment can redirect an application (or tighten its
policy) without editing its files.
A missing file is the normal case; a file that is there but wrong is an error
naming the file and the key, because a silently ignored setting is how a
cache ends up somewhere nobody looks.

The settings name the root, the remote and the trust, so only this user's
(or root's) are obeyed: a file found walking up that another user owns or
may write, or that lies where another user could swap it
(`_fs.why_redirectable`), is skipped with one warning naming it, and the
walk stops there, as git's `safe.directory` does, rather than going on to a
parent's settings that the directory below was meant to override.
"""

from __future__ import annotations

import copy
import os
import pwd
import re
import stat
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import platformdirs

from warmenv._errors import RemoteError, WarmenvError, warn
from warmenv._fs import (
    NoSuchHomeError,
    close_unless_regular,
    expand_home,
    read_bounded,
    why_redirectable,
)
from warmenv._keys import KEY_PREFIX, KeyFileError, PublicKey, read_key_file
from warmenv._text import clean
from warmenv._url import check_redis_url, redact
from warmenv.stream import StreamPolicy

__all__ = ["Config", "ConfigError", "activate", "active", "load_config", "set_root"]

DEFAULT_ENVIRONMENT = "default"
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_NAME_RULE = "use letters, digits, '.', '_' and '-' (and not '.' or '..')"
_KEYS = (
    "root",
    "environment",
    "stream_policy",
    "max_bytes",
    "remote",
    "trusted_keys",
    "require_signature",
    "lock_timeout",
)
DEFAULT_LOCK_TIMEOUT = 30.0


class ConfigError(WarmenvError):
    """A configuration file or variable holds something warmenv cannot use."""


class _RemoteConfigError(ConfigError, RemoteError):
    """A configured remote URL that names no Redis server.

    Both kinds: a configuration error (naming the file and key, or the
    variable), and the `RemoteError` that `open_environment` raised for a
    bad `WARMENV_REMOTE` before the file could name a remote too.
    """


def _redacted(url: str | None) -> str:
    return repr(None if url is None else redact(url))


@attrs.frozen
class Config:
    """Resolved settings: where environments live and which is the default."""

    root: Path
    environment: str = DEFAULT_ENVIRONMENT
    stream_policy: StreamPolicy = StreamPolicy.PER_THREAD
    max_bytes: int | None = None
    """The size bound `open_environment` applies by default (keys plus values), or None."""
    remote: str | None = attrs.field(default=None, repr=_redacted)
    """The fleet's shared tier `open_environment` uses by default (a `redis://` or
    `rediss://` URL, its password never shown in the repr), or None."""
    trusted_keys: tuple[PublicKey, ...] = ()
    """The keys trusted to sign the bundles imported here (`warmenv.bundle.signing`)."""
    require_signature: bool = False
    """Whether an import refuses a bundle not signed by one of `trusted_keys`."""
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    """Seconds `open_environment` (and every write) waits for another process's lock."""


def is_valid_name(name: object) -> bool:
    """Whether `name` may name an environment (`check_name` says why not)."""
    return isinstance(name, str) and _why_not_a_name(name) is None


def check_name(name: object) -> str:
    """`name` if it may name an environment, else `ValueError` saying what may
    (`TypeError` for one that is not a `str` at all: `open_environment(123)`).

    The name is shown as the command line shows text from outside
    (`warmenv._text.clean`: a byte that was not UTF-8 as `\\xff`), so the
    library and the command say the same thing.
    """
    if not isinstance(name, str):
        raise TypeError(f"an environment name is a str, got {type(name).__name__} {name!r}")
    why = _why_not_a_name(name)
    if why is not None:
        raise ValueError(f"invalid environment name '{clean(name)}': {why}")
    return name


BUNDLE_SUFFIX = ".bundle"
"""How the docs and `warmenv demo` name bundle files; never an environment's name."""
ENVIRONMENT_SUFFIX = ".db"
"""An environment's file is `<root>/<name>.db`; a name never ends in it (`x.db` would be
`x.db.db`)."""


def file_suffix(name: str) -> str | None:
    """`.bundle` or `.db` where `name`, of the rule's characters, ends in one (it names a
    file, not an environment: `_why_not_a_name`); else `None`.

    Only such a name is handed back in a hint as a command to paste (the CLI's): the
    rule's characters are safe in a shell, where `$(...)` or `;` would run.
    """
    if _NAME.fullmatch(name) is None or name in (".", ".."):
        return None
    return next((s for s in (BUNDLE_SUFFIX, ENVIRONMENT_SUFFIX) if name.endswith(s)), None)


def _why_not_a_name(name: str) -> str | None:
    """Why `name` names no environment, with the fix; `None` if it does.

    The one rule for every name (`open_environment`, `--env`, the
    configuration): `[A-Za-z0-9._-]+`, not `.` or `..`, and nothing that reads
    as a file: a path (the root says where environments live, the name which
    one), a bundle's name (`--env keys.bundle` made an environment called
    that, where an import of the bundle was meant) or an environment's file
    (`--env x.db` made `x.db.db`). Said in the library's terms: the command
    line adds its command to run (`cli._environments.check_env_option`).
    """
    if "/" in name or "\\" in name:
        return (
            "a name, not a path: an environment lives at <root>/<name>.db, so give the "
            "directory as the root (--root, WARMENV_ROOT or set_root) and the name alone"
        )
    if _NAME.fullmatch(name) is None or name in (".", ".."):
        return _NAME_RULE
    suffix = file_suffix(name)
    if suffix == BUNDLE_SUFFIX:
        return (
            f"it names a bundle file ({BUNDLE_SUFFIX}), which is imported into an "
            "environment (warmenv.bundle.import_bundle), not opened as one"
        )
    if suffix == ENVIRONMENT_SUFFIX:
        stem = name.removesuffix(ENVIRONMENT_SUFFIX)
        meant = f": give {stem!r}" if stem and _why_not_a_name(stem) is None else ""
        return (
            f"it names an environment's file ({ENVIRONMENT_SUFFIX}); the name is without "
            f"the suffix{meant}"
        )
    return None


def user_root() -> Path:
    """The default root: the user cache directory for warmenv."""
    return Path(platformdirs.user_cache_dir("warmenv", appauthor=False))


def load_config(start: Path | None = None) -> Config:
    """Resolve the configuration seen from `start` (default: the working directory)."""
    here = Path.cwd() if start is None else Path(start)
    here = here.resolve()
    found = _find_settings(here)
    settings: Mapping[str, Any] = {}
    where = "defaults"
    base = here
    if found is not None:
        file, settings = found
        where, base = str(file), file.parent
        unknown = sorted(set(settings) - set(_KEYS))
        if unknown:
            raise ConfigError(
                f"{file}: unknown key {unknown[0]!r} in the warmenv settings; "
                f"the keys are {', '.join(_KEYS)}"
            )

    root = _root(settings.get("root", "user"), where, "root", base, here)
    environment = _environment(settings.get("environment", DEFAULT_ENVIRONMENT), where)
    stream_policy = _stream_policy(settings.get("stream_policy", "per_thread"), where)
    max_bytes = _max_bytes(settings.get("max_bytes"), where)
    remote = _remote(settings.get("remote"), f"{where}: key 'remote'")
    trusted_keys = _trusted_keys(
        settings.get("trusted_keys", []), f"{where}: key 'trusted_keys'", base
    )
    require_signature = _flag(settings.get("require_signature", False), where)
    lock_timeout = _lock_timeout(
        settings.get("lock_timeout", DEFAULT_LOCK_TIMEOUT), f"{where}: key 'lock_timeout'"
    )

    if (env_root := os.environ.get("WARMENV_ROOT")) is not None:
        root = _root(env_root, "the environment variable WARMENV_ROOT", None, Path.cwd(), here)
    if (env_name := os.environ.get("WARMENV_ENVIRONMENT")) is not None:
        environment = _environment(env_name, "the environment variable WARMENV_ENVIRONMENT")
    if (env_remote := os.environ.get("WARMENV_REMOTE")) is not None:
        # Set but empty turns off a remote the file names, as `remote=""` does in code.
        remote = _remote(env_remote, "the environment variable WARMENV_REMOTE")
    if (env_keys := os.environ.get("WARMENV_TRUSTED_KEYS")) is not None:
        # Replaces the file's list (set but empty: no key), as every variable wins.
        entries = [entry.strip() for entry in env_keys.split(",") if entry.strip()]
        trusted_keys = _trusted_keys(
            entries, "the environment variable WARMENV_TRUSTED_KEYS", Path.cwd()
        )
    if (env_require := os.environ.get("WARMENV_REQUIRE_SIGNATURE", "")).strip():
        # Set but empty is not set (a template's unset variable): never a downgrade to false.
        require_signature = _flag_variable(env_require)
    if (env_lock := os.environ.get("WARMENV_LOCK_TIMEOUT")) is not None:
        lock_timeout = _lock_timeout(env_lock, "the environment variable WARMENV_LOCK_TIMEOUT")
    return Config(
        lock_timeout=lock_timeout,
        root=root,
        environment=environment,
        stream_policy=stream_policy,
        max_bytes=max_bytes,
        remote=remote,
        trusted_keys=trusted_keys,
        require_signature=require_signature,
    )


def _find_settings(start: Path) -> tuple[Path, Mapping[str, Any]] | None:
    """The nearest settings file at or above `start`, and its warmenv table.

    A directory this process may not search (a working directory under
    another user's home, kept across `sudo -u`) holds no file it could read:
    it is passed over, as one without settings, rather than failing every open.
    A file that is not ours to obey (`_why_not_ours`) ends the walk, unread,
    with one warning: its bytes are another user's, and the parent's settings
    were not meant for this directory.
    """
    for directory in (start, *start.parents):
        for name in ("warmenv.toml", "pyproject.toml"):
            candidate = directory / name
            try:
                st = os.stat(candidate)
            except OSError:  # missing, or in a directory not ours to search
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if (reason := _why_not_ours(candidate, st)) is not None:
                warn(
                    f"{candidate} (owner {_user(st.st_uid)}) is not used as warmenv "
                    f"settings: {reason}; the walk up stops there (defaults and WARMENV_* "
                    "variables apply)"
                )
                return None
            if name == "warmenv.toml":
                whole = _table_of(candidate, _whole)
                return candidate, {} if whole is None else whole
            section = _table_of(candidate, _tool_warmenv)
            if section is not None:
                return candidate, section
    return None


def _why_not_ours(file: Path, st: os.stat_result | None = None) -> str | None:
    """Why another user could decide what `file` says, one clause; None if only this
    user or root could: its owner is one of them, neither its group nor anyone else may
    write it, and no step of its path can be redirected by another user
    (`why_redirectable`: a symlink of theirs, a directory open to them). `st`: the
    status of the file as opened (checked again there, so a swap in between is seen)."""
    if st is None:
        try:
            st = os.stat(file)
        except OSError:  # gone, or not ours to look at: the read says why
            return None
    if st.st_uid not in (os.geteuid(), 0):
        return (
            "it belongs to another user, who would choose this process's root, remote and "
            "trusted keys; if it is yours, `chown` it"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"other users may write it (mode {stat.filemode(st.st_mode)}); run `chmod go-w {file}`"
        )
    return why_redirectable(file)


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _whole(document: dict[str, Any], file: Path) -> dict[str, Any]:
    return document


def _tool_warmenv(document: dict[str, Any], file: Path) -> dict[str, Any] | None:
    table = document.get("tool", {})
    section = table.get("warmenv") if isinstance(table, dict) else None
    if section is not None and not isinstance(section, dict):
        raise ConfigError(f"{file}: [tool.warmenv] must be a table")
    return section


# The warmenv table of each settings file read, by the file's identity when read: a
# restore reads the configuration (its trust) as `open_environment` did a moment
# before, and parsing a project's pyproject.toml again took a millisecond, most
# of a small restore. A file whose identity changed is read again; one changed
# less than `_SETTLED_NS` before it was read is never kept, since a rewrite in the
# same tick of the file system's clock, at the same size, would keep its identity.
_SETTLED_NS = 2_000_000_000
_tables: dict[Path, tuple[tuple[int, ...], dict[str, Any] | None]] = {}
_tables_lock = threading.Lock()


def _table_of(
    file: Path, pick: Callable[[dict[str, Any], Path], dict[str, Any] | None]
) -> dict[str, Any] | None:
    """`pick(document)` of the TOML `file`, a copy of the one kept if the file is unchanged."""
    try:
        st = os.stat(file)
    except OSError:
        st = None
    with _tables_lock:
        kept = _tables.get(file)
    if st is not None and kept is not None and kept[0] == _identity(st):
        return copy.deepcopy(kept[1])
    document, st = _read_toml(file)
    table = pick(document, file)
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > _SETTLED_NS:
        with _tables_lock:
            _tables[file] = (_identity(st), copy.deepcopy(table))
    return table


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_BOMS = (b"\xff\xfe", b"\xfe\xff")
MAX_SETTINGS_BYTES = 4 << 20
"""The most of a settings file read: one is found by walking up from the working directory,
so it may be anyone's (a shared /tmp), and a pyproject.toml is tens of kilobytes."""


def _read_toml(file: Path) -> tuple[dict[str, Any], os.stat_result]:
    """The document, and the status of the file it was read from."""
    try:
        # Never waited on: a FIFO put at the name since it was found is refused.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if (kind := close_unless_regular(fd)) is not None:
            raise ConfigError(f"{file}: {kind}, not a settings file; remove it")
        try:
            st = os.fstat(fd)
            if (reason := _why_not_ours(file, st)) is not None:  # swapped since found
                raise ConfigError(f"{file}: not used as warmenv settings: {reason}")
            read = read_bounded(fd, MAX_SETTINGS_BYTES, file)
        finally:
            os.close(fd)
        if read.over is not None:
            raise ConfigError(f"{read.over}: not a settings file; fix or remove it")
        return tomllib.loads(read.data.decode("utf-8")), st
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML ({exc}); fix or remove the file") from exc
    except UnicodeDecodeError as exc:
        bom = " (it starts with a UTF-16 byte-order mark)" if exc.object[:2] in _BOMS else ""
        byte = exc.object[exc.start : exc.start + 1]
        raise ConfigError(
            f"{file}: not UTF-8 text{bom}: byte {exc.start} is {byte!r}; TOML is UTF-8: save "
            "the file as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot be read ({exc.strerror})") from exc


def _root(value: object, where: str, key: str | None, base: Path, start: Path) -> Path:
    label = f"{where}: key {key!r}" if key else where
    if not isinstance(value, str) or not value:
        raise ConfigError(f'{label} must be "user", "project" or a path, got {value!r}')
    if value == "user":
        return user_root()
    if value == "project":
        for directory in (start, *start.parents):
            if os.path.isfile(marker := directory / "pyproject.toml"):
                if (reason := _why_not_ours(marker)) is not None:
                    raise ConfigError(
                        f'{label} is "project" but the nearest pyproject.toml, {marker}, is '
                        f"not yours to place the root by: {reason}"
                    )
                return directory / ".warmenv"
        raise ConfigError(
            f'{label} is "project" but no pyproject.toml exists above {start}; use a path instead'
        )
    try:
        path = expand_home(value)
    except NoSuchHomeError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    return path if path.is_absolute() else (base / path).resolve()


def _environment(value: object, where: str) -> str:
    why = _why_not_a_name(value) if isinstance(value, str) else _NAME_RULE
    if why is not None:
        label = where if where.startswith("the environment") else f"{where}: key 'environment'"
        raise ConfigError(f"{label}: {value!r} is not an environment name; {why}")
    assert isinstance(value, str)
    return value


def _stream_policy(value: object, where: str) -> StreamPolicy:
    try:
        return StreamPolicy(value)
    except ValueError:
        choices = ", ".join(repr(p.value) for p in StreamPolicy)
        raise ConfigError(
            f"{where}: key 'stream_policy' must be one of {choices}, got {value!r}"
        ) from None


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})


def parse_size(text: str) -> int | None:
    """Bytes from `"500000"`, `"512MiB"`, `"2 GB"` (case ignored); None if it is not a size."""
    match = _SIZE.fullmatch(text)
    if match is None:
        return None
    return int(float(match[1]) * _UNITS[(match[2] or "").lower()])


def _max_bytes(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and (parsed := parse_size(value)) is not None:
        return parsed
    raise ConfigError(
        f"{where}: key 'max_bytes' must be a size in bytes (an int >= 0, or a string such as "
        f'"512MiB" or "2GB"), got {value!r}'
    )


def _is_seconds(value: object) -> bool:
    """Whether `value` is a duration in seconds: a finite number >= 0 (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e308


def _lock_timeout(value: object, label: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if _is_seconds(value):
        assert isinstance(value, int | float)
        return float(value)
    raise ConfigError(f"{label} must be seconds (a number >= 0, such as 30 or 0.5), got {value!r}")


def _remote(value: object, label: str) -> str | None:
    """The URL of the configured shared tier; `None` (absent or `""`) for none."""
    if value is None or value == "":
        return None
    try:
        return check_redis_url(value, label)
    except RemoteError as exc:  # the message already names the setting, password hidden
        raise _RemoteConfigError(str(exc)) from None


def _trusted_keys(value: object, where: str, base: Path) -> tuple[PublicKey, ...]:
    """The keys `trusted_keys` names: each entry a key (`ed25519:...`) or a file of them
    (a path, relative to `base`: the settings file's directory, or the working one)."""
    if not isinstance(value, list) or not all(isinstance(entry, str) for entry in value):
        raise ConfigError(
            f"{where} must be a list of public keys ('{KEY_PREFIX}...') or key files, got {value!r}"
        )
    keys: list[PublicKey] = []
    for entry in value:
        if entry.startswith(KEY_PREFIX):
            try:
                keys.append(PublicKey.parse(entry))
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            continue
        try:
            path = (base / expand_home(entry)).resolve()
            if (reason := _why_not_ours(path)) is not None:  # they would choose whom we trust
                raise ConfigError(f"{where}: the key file {path} is not trusted: {reason}")
            keys.extend(read_key_file(path))
        except (KeyFileError, NoSuchHomeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return tuple(dict.fromkeys(keys))


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: key 'require_signature' must be true or false, got {value!r}")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag_variable(value: str) -> bool:
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ConfigError(
        f"the environment variable WARMENV_REQUIRE_SIGNATURE must be 1 or 0 (true or "
        f"false), got {clean(value)!r}"
    )


def check_max_bytes(max_bytes: object) -> int | None:
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"max_bytes must be an int >= 0 (bytes) or None, got {max_bytes!r}")
    return max_bytes


def check_older_than(older_than: object) -> float | None:
    if older_than is None:
        return None
    if isinstance(older_than, timedelta):
        older_than = older_than.total_seconds()
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or older_than < 0:
        raise ValueError(f"older_than must be seconds >= 0 or a timedelta, got {older_than!r}")
    return float(older_than)


def check_lock_timeout(lock_timeout: object) -> float | None:
    if lock_timeout is not None and not _is_seconds(lock_timeout):
        raise ValueError(f"lock_timeout must be seconds >= 0 (finite), got {lock_timeout!r}")
    return None if lock_timeout is None else float(lock_timeout)  # type: ignore[arg-type]


# --- the process-wide default (what `open_environment()` opens) ----------------

_defaults_lock = threading.Lock()
_active_name: str | None = None
_active_root: Path | None = None


def activate(name: str) -> None:
    """Make `name` the environment `open_environment()` opens by default."""
    global _active_name
    with _defaults_lock:
        _active_name = check_name(name)


def set_root(path: str | Path) -> None:
    """Make `path` the directory `open_environment()` looks in by default."""
    global _active_root
    with _defaults_lock:
        _active_root = expand_home(path, "set_root's path")


def active() -> tuple[str, Path]:
    """The default `(name, root)`: set by `activate`/`set_root`, else configured."""
    with _defaults_lock:
        name, root = _active_name, _active_root
    if name is None or root is None:
        config = load_config()
        name = config.environment if name is None else name
        root = config.root if root is None else root
    return name, root
