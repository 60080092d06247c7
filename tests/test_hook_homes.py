"""`warmenv run`'s hooks of older warmenv versions: removed once nothing can be using them.

Each version's hooks live in `<user cache>/warmenv/.run-hooks/<version>`,
held by a lock every run of that version takes (and hands to its command).
A run of another version removes such a directory only when nobody holds
its lock and no run took it for `STALE_AFTER`; never one reached through a
symlink, one others can write, or one without a lock. The holders here are
real processes of a given version (`HookHome(version=...)`, as a warmenv of
that version makes it), the cleaner a run of this version, in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from warmenv.caches._hookdir import STALE_AFTER, HookHome

OLD = "0.1.0"

_HOLDER = """
import sys
from warmenv.caches._hookdir import HookHome
with HookHome(version=sys.argv[1]) as home:
    home.directory({"hook.py": "made by " + sys.argv[1] + "\\n"})
    print(home.path, flush=True)
    sys.stdin.readline()  # holds its lock until the test says
"""


@pytest.fixture(autouse=True)
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where every version's hooks are, in the test's own user cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "warmenv" / ".run-hooks"


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[str]]:
    """A live process of warmenv `OLD` holding its hooks' directory."""
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, OLD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.readline()  # its directory is made and held
    yield process
    _end(process)


def _end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.communicate("\n", timeout=60)


def _made_by_a_run_of(version: str) -> Path:
    """The directory a run of `version` made and left (the run has ended)."""
    done = subprocess.run(
        [sys.executable, "-c", _HOLDER, version], input="\n", capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _last_used(directory: Path, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(directory / ".lock", (when, when))


def _a_run_of_this_version() -> Path:
    with HookHome() as home:
        return home.directory({"hook.py": "this version's\n"})


def test_another_versions_directory_unused_for_a_week_is_removed(hooks: Path) -> None:
    # Every version's directory stayed for ever.
    old = _made_by_a_run_of(OLD)
    _last_used(old, STALE_AFTER + 60)
    mine = _a_run_of_this_version()
    assert not old.exists()
    assert sorted(p.name for p in hooks.iterdir()) == [mine.parent.name]


def test_another_versions_directory_used_within_the_week_is_kept() -> None:
    # A process it started may still import from it, without holding its lock.
    old = _made_by_a_run_of(OLD)
    _last_used(old, STALE_AFTER - 600)
    _a_run_of_this_version()
    assert old.is_dir() and _digests(old)


def test_a_directory_a_live_process_holds_is_kept_and_removed_once_it_ends(
    hooks: Path, holder: subprocess.Popen[str]
) -> None:
    old = hooks / OLD
    _last_used(old, STALE_AFTER + 60)  # long ago, yet held now
    _a_run_of_this_version()
    assert old.is_dir()
    _end(holder)
    _last_used(old, STALE_AFTER + 60)
    _a_run_of_this_version()
    assert not old.exists()


def test_a_symlink_where_a_version_directory_would_be_is_not_followed(
    hooks: Path, tmp_path: Path
) -> None:
    elsewhere = _made_by_a_run_of(OLD)
    _last_used(elsewhere, STALE_AFTER + 60)
    target = tmp_path / "elsewhere"
    elsewhere.rename(target)
    (hooks / OLD).symlink_to(target)
    _a_run_of_this_version()
    assert (hooks / OLD).is_symlink()
    assert sorted(p.name for p in target.iterdir()) == sorted([".lock", *_digests(target)])
    assert _digests(target)


def test_a_version_directory_others_can_write_is_left_alone(hooks: Path) -> None:
    old = _made_by_a_run_of(OLD)
    _last_used(old, STALE_AFTER + 60)
    old.chmod(0o777)  # not this user's alone: not ours to judge
    _a_run_of_this_version()
    assert old.is_dir() and _digests(old)


def test_a_version_directory_without_a_lock_is_left_alone(hooks: Path) -> None:
    # Made by a warmenv from before the locks: nothing tells whether a process uses it.
    old = _made_by_a_run_of(OLD)
    (old / ".lock").unlink()
    old_enough = time.time() - STALE_AFTER - 60
    os.utime(old, (old_enough, old_enough))
    _a_run_of_this_version()
    assert old.is_dir() and _digests(old)


def test_what_is_not_a_version_directory_is_left_alone(hooks: Path) -> None:
    _a_run_of_this_version()
    (hooks / "notes").mkdir()
    (hooks / "a-file").write_text("mine\n")
    _a_run_of_this_version()
    assert (hooks / "notes").is_dir() and (hooks / "a-file").read_text() == "mine\n"


def test_a_home_is_held_while_open_and_removable_once_closed(hooks: Path) -> None:
    with HookHome(version=OLD) as held:
        held.directory({"hook.py": "x\n"})
        _last_used(held.path, STALE_AFTER + 60)
        _a_run_of_this_version()
        assert held.path.is_dir()
    _a_run_of_this_version()
    assert not held.path.exists()


def _digests(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name != ".lock"]
