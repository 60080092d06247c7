"""Busy is not read-only: an open waits for another process's lock within `lock_timeout`.

Another process holding the environment's write lock (`BEGIN IMMEDIATE`)
made the open wait 30 s, then open the file read-only for the whole process,
with writes failing as "attempt to write a readonly database" long after the
lock was gone and the command line blaming the directory's permissions
(issue 22). The lock is held by a real second process here.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from helpers import backend_label, one_trial
from test_cli import warmenv
from test_cli_errors import assert_one_error_line
from warmenv import ConfigError, EnvironmentLockedError, Stored, load_config, open_environment

pytestmark = pytest.mark.anyio

_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
conn.close()
"""


@contextmanager
def locked_by_another_process(path: Path) -> Iterator[None]:
    """`path`'s write lock held by a child process for the block (released at its end)."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline() == "locked\n"
            yield
        finally:
            child.stdin.write("\n")
            child.stdin.close()
            assert child.wait(timeout=30) == 0


async def _made(path: Path) -> Path:
    async with open_environment(file=path) as env:
        assert await env.storage("app/1/k").insert(b"k", b"v") == Stored()
    return path


_CHECKED = (
    "a second process holds BEGIN IMMEDIATE: the open fails within 10 s with "
    "EnvironmentLockedError naming the file (lock_timeout 0.3 s); once released, the same "
    "process opens it writable and an insert is stored"
)


async def test_an_open_of_a_locked_environment_says_so_within_lock_timeout_and_recovers(
    tmp_path: Path, anyio_backend: object
) -> None:
    scenario = f"open while another process holds the lock ({backend_label(anyio_backend)})"
    with one_trial(scenario, _CHECKED):
        await _locked_then_released(tmp_path)


async def _locked_then_released(tmp_path: Path) -> None:
    path = await _made(tmp_path / "e.db")
    with locked_by_another_process(path):
        started = time.monotonic()
        with pytest.raises(EnvironmentLockedError, match="locked by another process") as caught:
            with anyio.fail_after(20):
                async with open_environment(file=path, lock_timeout=0.3):
                    pass
        assert time.monotonic() - started < 10
        assert str(path) in str(caught.value) and "lock_timeout" in str(caught.value)
    # The lock released: the same process opens the file as it is, writable.
    async with open_environment(file=path, lock_timeout=0.3) as env:
        assert not env.read_only and env.degraded is None
        assert await env.storage("app/1/k").insert(b"k2", b"v2") == Stored()


def test_gc_on_a_locked_environment_says_locked_not_unwritable(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    anyio.run(_made, root / "e.db")
    quick = {"WARMENV_LOCK_TIMEOUT": "0.3"}
    with locked_by_another_process(root / "e.db"):
        started = time.monotonic()
        completed = warmenv("gc", "--max-bytes", "1GB", "--env", "e", root=root, env=quick)
        elapsed = time.monotonic() - started
        line = assert_one_error_line(completed, 1)
    assert "locked by another process" in line and "writable" not in line, line
    assert elapsed < 20, elapsed
    completed = warmenv("gc", "--max-bytes", "1GB", "--env", "e", root=root, env=quick)
    assert completed.returncode == 0, completed.stderr


def test_lock_timeout_is_a_setting_and_a_bad_one_names_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "warmenv.toml").write_text("lock_timeout = 2.5\n")
    assert load_config(tmp_path).lock_timeout == 2.5
    monkeypatch.setenv("WARMENV_LOCK_TIMEOUT", "0.25")
    assert load_config(tmp_path).lock_timeout == 0.25
    monkeypatch.setenv("WARMENV_LOCK_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="WARMENV_LOCK_TIMEOUT must be seconds"):
        load_config(tmp_path)
    monkeypatch.delenv("WARMENV_LOCK_TIMEOUT")
    (tmp_path / "warmenv.toml").write_text("lock_timeout = -1\n")
    with pytest.raises(ConfigError, match="key 'lock_timeout' must be seconds"):
        load_config(tmp_path)
