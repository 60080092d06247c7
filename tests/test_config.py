from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from helpers import one_trial
from redis_server import RedisServer, tolerating_coredis_streams
from warmenv import Namespace, WarmenvError, open_environment
from warmenv.config import (
    MAX_SETTINGS_BYTES,
    Config,
    ConfigError,
    _find_settings,
    _read_toml,
    load_config,
    user_root,
)
from warmenv.remote import RemoteError
from warmenv.stream import StreamPolicy

PASSWORD = "s3cret-Pa55word"
_UNREADABLE_SETTINGS = (
    "settings that cannot be read: a warmenv.toml or pyproject.toml not in UTF-8, a root under "
    "an unknown user's home (file, WARMENV_ROOT, open_environment), WARMENV_CLI_BACKEND naming "
    "a loop that is not installed (child)",
    "one ConfigError (or usage error) line naming the file or variable; no traceback",
)


@pytest.fixture(autouse=True)
def _no_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARMENV_ROOT", raising=False)
    monkeypatch.delenv("WARMENV_ENVIRONMENT", raising=False)


def test_no_file_gives_the_defaults(tmp_path: Path) -> None:
    config = load_config(tmp_path)
    assert config == Config(root=user_root(), environment="default")
    assert config.stream_policy is StreamPolicy.PER_THREAD
    assert "warmenv" in str(config.root)


def test_warmenv_toml_is_found_walking_up(tmp_path: Path) -> None:
    (tmp_path / "warmenv.toml").write_text(
        'root = "cache"\nenvironment = "h100"\nstream_policy = "per_task"\n'
    )
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    config = load_config(deep)
    assert config.root == (tmp_path / "cache").resolve()
    assert config.environment == "h100"
    assert config.stream_policy is StreamPolicy.PER_TASK


def test_pyproject_tool_warmenv_is_read(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\n\n[tool.warmenv]\nenvironment = "ci"\n'
    )
    assert load_config(tmp_path).environment == "ci"


def test_a_pyproject_without_the_table_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "warmenv.toml").write_text('environment = "outer"\n')
    inner = tmp_path / "pkg"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert load_config(inner).environment == "outer"


def test_the_nearest_file_wins(tmp_path: Path) -> None:
    (tmp_path / "warmenv.toml").write_text('environment = "outer"\n')
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "warmenv.toml").write_text('environment = "inner"\n')
    assert load_config(inner).environment == "inner"


def test_project_root_is_dot_warmenv_beside_the_nearest_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.warmenv]\nroot = "project"\n')
    sub = tmp_path / "src"
    sub.mkdir()
    assert load_config(sub).root == tmp_path.resolve() / ".warmenv"


def test_a_settings_file_read_before_is_read_again_once_rewritten(tmp_path: Path) -> None:
    settings = tmp_path / "warmenv.toml"
    settings.write_text('environment = "aaaa"\n')
    settled = settings.stat().st_mtime_ns - 10_000_000_000  # old enough to be kept
    os.utime(settings, ns=(settled, settled))
    assert load_config(tmp_path).environment == "aaaa"
    assert load_config(tmp_path).environment == "aaaa"  # the kept table, as read
    settings.write_text('environment = "bbbb"\n')  # the same size, and the same times
    os.utime(settings, ns=(settled, settled))
    assert load_config(tmp_path).environment == "bbbb"


def test_a_kept_settings_table_is_never_changed_by_its_reader(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.warmenv]\ntrusted_keys = []\n")
    settled = (tmp_path / "pyproject.toml").stat().st_mtime_ns - 10_000_000_000
    os.utime(tmp_path / "pyproject.toml", ns=(settled, settled))
    found = _find_settings(tmp_path)
    assert found is not None
    found[1]["trusted_keys"].append("changed")
    again = _find_settings(tmp_path)
    assert again is not None and again[1] == {"trusted_keys": []}


def test_variables_win_over_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "warmenv.toml").write_text('root = "a"\nenvironment = "file"\n')
    monkeypatch.setenv("WARMENV_ROOT", str(tmp_path / "from-env"))
    monkeypatch.setenv("WARMENV_ENVIRONMENT", "from-env")
    config = load_config(tmp_path)
    assert config.root == tmp_path / "from-env"
    assert config.environment == "from-env"


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "warmenv.toml"
    bad.write_text("root = \n")
    with pytest.raises(ConfigError, match=re.escape(str(bad))):
        load_config(tmp_path)


def test_a_settings_file_over_the_cap_is_refused_naming_it_unread(tmp_path: Path) -> None:
    huge = tmp_path / "pyproject.toml"
    huge.write_text('[tool.warmenv]\nroot = "x"\n')
    os.truncate(huge, 1 << 30)  # sparse: anyone's file found walking up, made huge
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path)
    assert str(refused.value) == (
        f"{huge} holds {1 << 30:,} bytes, over the {MAX_SETTINGS_BYTES:,} bytes warmenv reads "
        "of it: not a settings file; fix or remove it"
    )


def test_a_fifo_put_where_a_settings_file_was_found_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    os.mkfifo(tmp_path / "warmenv.toml")
    with pytest.raises(ConfigError, match=r"warmenv\.toml: a FIFO, not a settings file"):
        _read_toml(tmp_path / "warmenv.toml")


def test_an_unknown_key_is_named(tmp_path: Path) -> None:
    (tmp_path / "warmenv.toml").write_text('rooot = "x"\n')
    with pytest.raises(ConfigError, match=r"warmenv\.toml: unknown key 'rooot'"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("root = 3\n", "root"),
        ('environment = "no spaces"\n', "environment"),
        ('environment = ".."\n', "environment"),
        ('stream_policy = "per_core"\n', "stream_policy"),
        ("remote = 6379\n", "remote"),
        ('remote = "localhost:6379"\n', "remote"),
    ],
)
def test_an_invalid_value_names_the_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    (tmp_path / "warmenv.toml").write_text(text)
    with pytest.raises(ConfigError, match=rf"warmenv\.toml: key '{key}'"):
        load_config(tmp_path)


def test_an_invalid_variable_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMENV_ENVIRONMENT", "a/b")
    with pytest.raises(ConfigError, match="WARMENV_ENVIRONMENT"):
        load_config(tmp_path)


def test_project_root_without_a_pyproject_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "warmenv.toml").write_text('root = "project"\n')
    with pytest.raises(ConfigError, match=r"no pyproject\.toml"):
        load_config(tmp_path)


def test_config_error_is_a_warmenv_error() -> None:
    assert issubclass(ConfigError, WarmenvError)


# --- remote: the fleet's shared tier ------------------------------------------------


def test_the_file_names_the_remote_and_its_repr_hides_the_password(tmp_path: Path) -> None:
    url = f"redis://:{PASSWORD}@cache.internal:6379/2"
    (tmp_path / "warmenv.toml").write_text(f'remote = "{url}"\n')
    config = load_config(tmp_path)
    assert config.remote == url
    assert PASSWORD not in repr(config)
    assert "redis://:***@cache.internal:6379/2" in repr(config)


def test_warmenv_remote_wins_over_the_file_and_set_empty_turns_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.warmenv]\nremote = "redis://file:1/0"\n')
    assert load_config(tmp_path).remote == "redis://file:1/0"
    monkeypatch.setenv("WARMENV_REMOTE", "rediss://variable:2/0")
    assert load_config(tmp_path).remote == "rediss://variable:2/0"
    monkeypatch.setenv("WARMENV_REMOTE", "")
    assert load_config(tmp_path).remote is None


def test_an_invalid_remote_names_the_file_and_key_without_the_password(tmp_path: Path) -> None:
    (tmp_path / "warmenv.toml").write_text(f'remote = "http://:{PASSWORD}@cache:80"\n')
    with pytest.raises(ConfigError, match=r"warmenv\.toml: key 'remote'") as caught:
        load_config(tmp_path)
    assert PASSWORD not in str(caught.value)
    assert "is not a Redis URL" in str(caught.value)


def test_an_invalid_warmenv_remote_is_a_config_error_and_a_remote_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMENV_REMOTE", f"redis:/:{PASSWORD}@host")
    with pytest.raises(ConfigError, match="WARMENV_REMOTE") as caught:
        load_config(tmp_path)
    assert isinstance(caught.value, RemoteError)
    assert PASSWORD not in str(caught.value)


@tolerating_coredis_streams
@pytest.mark.anyio
async def test_open_environment_uses_the_configured_remote_unless_told_otherwise(
    tmp_path: Path, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Precedence: `remote=` in code, then WARMENV_REMOTE, then the file's `remote`."""
    ns = Namespace("app", "kernels", version="1")
    (tmp_path / "warmenv.toml").write_text(f'remote = "{server.url}"\n')
    monkeypatch.chdir(tmp_path)
    async with open_environment("fleet", root=tmp_path / "a") as a:
        assert a.remote is not None
        await a.storage(ns).insert(b"k", b"from a")
    async with open_environment("fleet", root=tmp_path / "b") as b:
        assert b.remote is not None and b.remote.settings.url == server.url
        assert await b.storage(ns).get(b"k") == b"from a"
    async with open_environment("fleet", root=tmp_path / "c", remote="") as c:
        assert c.remote is None
        assert await c.storage(ns).get(b"k") is None
    monkeypatch.setenv("WARMENV_REMOTE", "")
    async with open_environment("fleet", root=tmp_path / "d") as d:
        assert d.remote is None
        assert await d.storage(ns).get(b"k") is None


def test_an_invalid_name_says_the_one_rule_wherever_it_is_checked(tmp_path: Path) -> None:
    """The library, the configuration and the command line say the same rule; the
    name is shown as the command shows text from outside (a stray byte as \\xff)."""
    from warmenv import activate
    from warmenv.config import check_name

    rule = "use letters, digits, '.', '_' and '-' (and not '.' or '..')"
    with pytest.raises(ValueError) as raised:
        activate("a\udcffb")
    assert str(raised.value) == f"invalid environment name 'a\\xffb': {rule}"
    with pytest.raises(TypeError, match=re.escape("an environment name is a str, got int 7")):
        check_name(7)
    (tmp_path / "warmenv.toml").write_text('environment = ".."\n')
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path)
    assert str(refused.value).endswith(f"'..' is not an environment name; {rule}")


def test_is_utf8_is_false_only_for_what_cannot_be_written_as_utf_8() -> None:
    from warmenv._text import is_utf8

    assert is_utf8("") and is_utf8("ascii") and is_utf8("é 日本 🙂") and is_utf8("é".encode())
    assert not is_utf8("a\udcffb") and not is_utf8("\ud800") and not is_utf8(b"\xff")


# --- what is not a setting at all: one ConfigError line naming the file or variable ----


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfer\x00o\x00o\x00t\x00", b'root = "caf\xe9"\n'],
    ids=["utf-16 with a byte-order mark", "latin-1"],
)
def test_a_settings_file_that_is_not_utf8_is_a_config_error_naming_it(
    tmp_path: Path, content: bytes
) -> None:
    with one_trial(*_UNREADABLE_SETTINGS):
        (tmp_path / "warmenv.toml").write_bytes(content)
        with pytest.raises(ConfigError, match="not UTF-8 text") as refused:
            load_config(tmp_path)
        assert str(tmp_path / "warmenv.toml") in str(refused.value)


def test_a_pyproject_that_is_not_utf8_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with one_trial(*_UNREADABLE_SETTINGS):
        (tmp_path / "pyproject.toml").write_bytes(b"\xfe\xff\x00[")
        with pytest.raises(ConfigError, match=r"pyproject\.toml: not UTF-8 text"):
            load_config(tmp_path)


def test_a_root_in_an_unknown_users_home_is_a_config_error_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with one_trial(*_UNREADABLE_SETTINGS):
        (tmp_path / "warmenv.toml").write_text('root = "~nosuchuser-warmenv/x"\n')
        with pytest.raises(ConfigError, match=r"key .root.*names no home directory"):
            load_config(tmp_path)
        (tmp_path / "warmenv.toml").unlink()
        monkeypatch.setenv("WARMENV_ROOT", "~nosuchuser-warmenv/y")
        with pytest.raises(ConfigError, match=r"WARMENV_ROOT.*names no home directory"):
            load_config(tmp_path)


@pytest.mark.anyio
async def test_open_environment_in_an_unknown_users_home_is_a_warmenv_error() -> None:
    with one_trial(*_UNREADABLE_SETTINGS):
        with pytest.raises(WarmenvError, match="'~nosuchuser-warmenv' names no home directory"):
            async with open_environment("e", root="~nosuchuser-warmenv/x"):
                pass
