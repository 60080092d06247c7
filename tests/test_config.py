from __future__ import annotations

import re
from pathlib import Path

import pytest

from warmenv import WarmenvError
from warmenv.config import Config, ConfigError, load_config, user_root
from warmenv.stream import StreamPolicy


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
