"""Only this user's (or root's) settings are obeyed.

The settings name the root, the remote and the trusted keys: a file found
walking up from the working directory that another user owns or may write,
or that lies where another user could swap it, is skipped with one warning
naming it, its owner and why, and the walk stops there. The other user is a
child that is `nobody`, writing real files in a sticky directory open to
everyone (a shared /tmp); we run as root, so the reader is the one at risk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import run_python, unprivileged_user
from warmenv import WarmenvWarning
from warmenv.config import Config, ConfigError, _read_toml, load_config, user_root

_ATTACK = textwrap.dedent(
    """
    remote = "redis://127.0.0.1:1"
    root = "{shared}/nobodys-root"
    require_signature = false
    trusted_keys = ["ed25519:{key}"]
    environment = "nobodys"
    """
)
_KEY = "A" * 43


@pytest.fixture(autouse=True)
def _no_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ROOT", "ENVIRONMENT", "REMOTE", "TRUSTED_KEYS", "REQUIRE_SIGNATURE"):
        monkeypatch.delenv(f"WARMENV_{name}", raising=False)


@pytest.fixture
def project() -> Iterator[Path]:
    """Our directory (mode 0755, with our own `warmenv.toml` naming environment
    'ours'), holding `shared`: mode 1777, as /tmp is, with `shared/work` ours.
    Made under /tmp, not the test's own directory, which `nobody` may not enter."""
    top = Path(tempfile.mkdtemp(prefix="warmenv-settings-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "warmenv.toml").write_text('environment = "ours"\n')
        shared = top / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        (shared / "work").mkdir()
        yield top
    finally:
        shutil.rmtree(top)


def _as_nobody(code: str) -> None:
    user = unprivileged_user()
    if user is None:
        pytest.skip("writing as another user needs root (we are that other user's target)")
    child = run_python(code, user=user)
    assert child.returncode == 0, child.stderr


def _plant(path: Path, text: str) -> None:
    """`text` written at `path` by `nobody`, readable by all."""
    _as_nobody(
        f"import os, sys; open({str(path)!r}, 'w').write({text!r}); os.chmod({str(path)!r}, 0o644)"
    )


def _defaults_but_warned(work: Path, *expected: str) -> Config:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(work)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert issubclass(caught[0].category, WarmenvWarning)
    message = str(caught[0].message)
    assert "\n" not in message
    for part in expected:
        assert part in message, message
    return config


def test_another_users_settings_file_is_skipped_with_one_warning_and_the_walk_stops(
    project: Path,
) -> None:
    shared = project / "shared"
    _plant(shared / "warmenv.toml", _ATTACK.format(shared=shared, key=_KEY))
    config = _defaults_but_warned(
        shared / "work", str(shared / "warmenv.toml"), "nobody (uid", "another user"
    )
    # Not nobody's values, and not our parent's either: the walk stopped at theirs.
    assert config == Config(root=user_root())
    assert config.remote is None and config.trusted_keys == () and config.environment == "default"


def test_another_users_pyproject_stops_the_walk_unread(project: Path) -> None:
    shared = project / "shared"
    _plant(shared / "pyproject.toml", "this is [not toml")  # never parsed: no ConfigError
    config = _defaults_but_warned(shared / "work", str(shared / "pyproject.toml"), "nobody")
    assert config.environment == "default"


def test_a_symlink_of_another_users_to_our_settings_is_not_followed(project: Path) -> None:
    shared = project / "shared"
    ours = project / "warmenv.toml"
    _as_nobody(f"import os; os.symlink({str(ours)!r}, {str(shared / 'warmenv.toml')!r})")
    config = _defaults_but_warned(shared / "work", "symlink of another user's")
    assert config.environment == "default"


@pytest.mark.parametrize("mode", [0o664, 0o646], ids=["group", "others"])
def test_our_settings_file_that_others_may_write_is_skipped(project: Path, mode: int) -> None:
    file = project / "warmenv.toml"
    file.chmod(mode)
    config = _defaults_but_warned(project, str(file), "other users may write it", "chmod go-w")
    assert config.environment == "default"


def test_our_settings_file_in_a_directory_open_to_others_is_skipped(project: Path) -> None:
    open_dir = project / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # no sticky bit: anyone may rename our file away
    (open_dir / "warmenv.toml").write_text('environment = "open"\n')
    config = _defaults_but_warned(open_dir, str(open_dir), "without the sticky bit")
    assert config.environment == "default"


def test_our_own_settings_in_a_sticky_directory_are_obeyed(project: Path) -> None:
    shared = project / "shared"
    (shared / "warmenv.toml").write_text('environment = "mine"\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(shared / "work").environment == "mine"


def test_a_settings_file_swapped_for_another_users_after_it_was_found_is_refused_unread(
    project: Path,
) -> None:
    theirs = project / "shared" / "warmenv.toml"
    _plant(theirs, _ATTACK.format(shared=project, key=_KEY))
    with pytest.raises(ConfigError, match="belongs to another user"):
        _read_toml(theirs)  # what the walk reads once it found a file of ours there


def test_a_project_root_beside_another_users_pyproject_is_refused(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = project / "shared"
    _plant(shared / "pyproject.toml", '[project]\nname = "x"\n')
    monkeypatch.setenv("WARMENV_ROOT", "project")
    with warnings.catch_warnings(record=True), pytest.raises(ConfigError) as raised:
        warnings.simplefilter("always")
        load_config(shared / "work")
    assert str(shared / "pyproject.toml") in str(raised.value)
    assert "another user" in str(raised.value)


def test_a_trusted_key_file_of_another_users_is_refused(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = project / "shared" / "ci.pub"
    _plant(key_file, f"ed25519:{_KEY}\n")
    monkeypatch.setenv("WARMENV_TRUSTED_KEYS", str(key_file))
    with pytest.raises(ConfigError) as raised:
        load_config(project)
    assert "WARMENV_TRUSTED_KEYS" in str(raised.value) and str(key_file) in str(raised.value)
    assert "another user" in str(raised.value)


def test_warmenv_ls_never_lists_another_users_root(project: Path, tmp_path: Path) -> None:
    shared = project / "shared"
    _plant(shared / "warmenv.toml", _ATTACK.format(shared=shared, key=_KEY))
    _as_nobody(f"import os; os.makedirs({str(shared / 'nobodys-root')!r})")
    completed = subprocess.run(
        [sys.executable, "-m", "warmenv", "ls"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=shared / "work",
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "120"},
    )
    assert completed.returncode == 0, completed.stderr
    assert "nobodys-root" not in completed.stdout
    warned = [line for line in completed.stderr.splitlines() if "warmenv.toml" in line]
    assert len(warned) == 1 and "nobody" in warned[0], completed.stderr
    assert "nobodys-root" not in completed.stderr
