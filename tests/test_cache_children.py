"""`warmenv run`'s hooks in its command: entry points its compilers load by themselves.

No compiler is needed here: the entry points are loaded as JAX and torch
load theirs (`importlib.metadata.entry_points(group=...)`), in a fresh
interpreter whose `PYTHONPATH` is what `warmenv run` gives its command. The
compilers' own tests (tests/compilers/) count real hits through them.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import warmenv.caches._children
import warmenv.caches.jax
import warmenv.caches.torch
import warmenv.caches.triton
from helpers import run_python, unprivileged_user
from warmenv.caches._children import MAX_COUNTS_BYTES, hook_variables, new_counts, read_counts
from warmenv.caches._hookdir import MAX_HOOK_BYTES, HookHome, _read
from warmenv.caches._paths import UnsafeTargetError


@pytest.fixture(autouse=True)
def _private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This user's warmenv directory, where the hooks are written, in the test's own."""
    home = tmp_path / "home-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


LOAD = textwrap.dedent(
    """
    import importlib, json, sys
    from importlib.metadata import entry_points
    found = {}
    for group in ("torch.backends", "jax_plugins"):
        for entry in entry_points(group=group):
            if group == "jax_plugins":  # JAX: a module, whose initialize() it calls
                hook = importlib.import_module(entry.value).initialize
            else:  # torch: the object itself
                hook = entry.load()
            hook()
            found[group] = hook.__module__
    print(json.dumps(found))
    """
)


def _load(cwd: Path, *python_options: str) -> dict[str, str]:
    variables: dict[str, str] = {}
    with HookHome() as home:
        for tool, module in (("torch", warmenv.caches.torch), ("jax", warmenv.caches.jax)):
            variables.update(hook_variables(tool, module.ENTRY_POINTS, (), variables, home))
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    child = subprocess.run(
        [sys.executable, *python_options, "-c", LOAD],
        env={**environ, **variables},
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
    )
    found: dict[str, str] = json.loads(child.stdout)
    return found


def test_the_command_loads_warmenvs_hooks_through_its_compilers_entry_points(
    tmp_path: Path,
) -> None:
    found = _load(tmp_path)
    assert found == {
        "torch.backends": "warmenv.caches._torch_plugin",
        "jax_plugins": "warmenv.caches._jax_plugin",
    }


def test_a_command_whose_python_has_no_warmenv_loads_hooks_that_do_nothing(
    tmp_path: Path,
) -> None:
    # -S: no site-packages, so no warmenv; torch would fail `import torch` on a hook it
    # cannot load, JAX would log an error: the hooks written for the command are no-ops.
    found = _load(tmp_path, "-S")
    assert found == {
        "torch.backends": "warmenv_run_hooks_torch",
        "jax_plugins": "warmenv_run_hooks_jax",
    }


def test_a_warmenv_planted_in_the_commands_working_directory_is_never_imported(
    tmp_path: Path,
) -> None:
    # `python -c` puts the working directory first on sys.path: its warmenv/ is found first.
    planted = tmp_path / "cwd" / "warmenv"
    planted.mkdir(parents=True)
    ran = tmp_path / "ran"
    (planted / "__init__.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    found = _load(tmp_path / "cwd")
    assert not ran.exists()
    assert found == {
        "torch.backends": "warmenv_run_hooks_torch",
        "jax_plugins": "warmenv_run_hooks_jax",
    }


@pytest.mark.parametrize("before", ["/a::/b", "/a:", ":/a", "/a"])
def test_the_commands_pythonpath_is_kept_exactly_after_the_hooks(before: str) -> None:
    # An empty entry is the working directory to Python: dropping it changes what imports.
    with HookHome() as home:
        variables = hook_variables(
            "torch", warmenv.caches.torch.ENTRY_POINTS, (), {"PYTHONPATH": before}, home
        )
    first, _, rest = variables["PYTHONPATH"].partition(os.pathsep)
    assert Path(first, "warmenv_run_hooks_torch.py").is_file()
    assert rest == before


def test_the_hooks_directory_is_private_and_outlives_the_run(_private_home: Path) -> None:
    variables = _torch_hooks()
    directory = Path(variables["PYTHONPATH"])
    assert directory.is_relative_to(_private_home)
    for path in (directory, *directory.rglob("*")):
        mode = path.lstat().st_mode
        assert path.lstat().st_uid == os.geteuid()
        assert not mode & (stat.S_IWGRP | stat.S_IWOTH), path


def test_a_hooks_directory_that_was_changed_is_rewritten() -> None:
    variables = _torch_hooks()
    directory = Path(variables["PYTHONPATH"])
    shim = directory / "warmenv_run_hooks_torch.py"
    written = shim.read_text()
    shim.write_text("print('changed')\n")
    (directory / "extra.dist-info").mkdir()
    again = _torch_hooks()
    assert again == variables
    assert shim.read_text() == written
    assert not (directory / "extra.dist-info").exists()


def test_hooks_under_a_directory_others_can_write_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may rename what is in it
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared / "cache"))
    with pytest.raises(UnsafeTargetError, match="other users can write"):
        _torch_hooks()


def _torch_hooks() -> dict[str, str]:
    with HookHome() as home:
        return hook_variables("torch", warmenv.caches.torch.ENTRY_POINTS, (), {}, home)


_COUNTING_CHILD = textwrap.dedent(
    """
    import json
    from warmenv.caches._hookdir import MAX_HOOK_BYTES, HookHome, _read
    from warmenv.caches._tools import counting, tool
    with HookHome() as home:
        found = counting([tool("jax"), tool("torch")], {}, home)
    print(json.dumps({"variables": found.variables, "unable": repr(found.unable)}))
    """
)


def test_where_the_hooks_cannot_be_written_nothing_is_counted_and_it_says_why(
    shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user whose cache directory cannot be made (a read-only home): warmenv run failed.
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared_tmp / "cache"))
    shared_tmp.chmod(0o555)  # root's (as root, the child runs as nobody): no one else writes
    child = run_python(_COUNTING_CHILD, user=unprivileged_user())
    assert child.returncode == 0, child.stderr
    found = json.loads(child.stdout)
    assert found["variables"] == {}
    assert found["unable"].startswith("PermissionError(13, 'Permission denied')")
    assert not (shared_tmp / "cache").exists()


_COUNT_CHILD = textwrap.dedent(
    """
    from warmenv.caches._children import write_counts
    write_counts("torch", 1, 0)
    """
)


def _counted_into(path: Path) -> subprocess.CompletedProcess[str]:
    """A process that outlived `warmenv run` writing its counts at exit to `path`."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", _COUNT_CHILD],
        env={**environ, "WARMENV_CACHE_COUNTS": str(path)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_counts_are_never_written_through_a_symlink_left_where_the_file_was(
    tmp_path: Path,
) -> None:
    # The run's directory is gone; whoever recreated it put a symlink at the counts' name.
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "counts.jsonl").symlink_to(victim)
    child = _counted_into(tmp_path / "counts.jsonl")
    assert child.returncode == 0, child.stderr
    assert victim.read_text() == "precious\n"


def test_counts_are_never_written_to_a_file_the_run_did_not_make(tmp_path: Path) -> None:
    child = _counted_into(tmp_path / "counts.jsonl")
    assert child.returncode == 0, child.stderr
    assert not (tmp_path / "counts.jsonl").exists()


def test_counts_are_appended_to_the_file_the_run_made(tmp_path: Path) -> None:
    counts = tmp_path / "counts.jsonl"
    new_counts(counts)
    _counted_into(counts)
    _counted_into(counts)
    assert read_counts(counts)["torch"].hits == 2


def test_a_counts_file_the_command_made_huge_is_read_up_to_the_cap_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counts = tmp_path / "counts.jsonl"
    new_counts(counts)
    _counted_into(counts)
    # The command grew the file past the cap (sparse: no disk is filled).
    os.truncate(counts, MAX_COUNTS_BYTES + (1 << 20))
    with caplog.at_level(logging.WARNING, logger="warmenv.caches"):
        found = read_counts(counts)
    assert found["torch"].hits == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{counts} holds {MAX_COUNTS_BYTES + (1 << 20):,} bytes, over the "
        f"{MAX_COUNTS_BYTES:,} bytes warmenv reads of it; the command's cache counts are "
        "from the part read"
    ]


def test_a_count_line_the_cap_cuts_short_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    counts = tmp_path / "counts.jsonl"
    new_counts(counts)
    _counted_into(counts)
    first = counts.stat().st_size
    _counted_into(counts)
    monkeypatch.setattr(warmenv.caches._children, "MAX_COUNTS_BYTES", first + 20)
    with caplog.at_level(logging.WARNING, logger="warmenv.caches"):
        assert read_counts(counts)["torch"].hits == 1
    assert f"over the {first + 20:,} bytes" in caplog.text


def test_a_hook_file_grown_past_the_cap_is_not_read_whole_and_is_made_again(
    tmp_path: Path,
) -> None:
    files = {"hook.py": "x\n"}
    with HookHome() as home:
        made = home.directory(files)
    os.truncate(made / "hook.py", 1 << 30)  # sparse: no disk is filled
    with pytest.raises(UnsafeTargetError) as refused:
        _read(made / "hook.py", "")
    assert str(refused.value) == (
        f"{made / 'hook.py'} holds {1 << 30:,} bytes, over the {MAX_HOOK_BYTES:,} bytes "
        "warmenv reads of it"
    )
    with HookHome() as home:
        assert home.directory(files) == made
    assert (made / "hook.py").read_text() == "x\n"


def test_count_lines_that_are_not_whole_counts_are_skipped_with_one_warning_for_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counts = tmp_path / "counts.jsonl"
    new_counts(counts)
    _counted_into(counts)
    with counts.open("a") as file:
        for bad in ('"hits":1e999', '"hits":-1', '"hits":true', '"hits":2.0', '"hits":"2"'):
            file.write('{"tool":"torch",' + bad + ',"misses":0}\n')
        file.write('{"tool":"torch","hits":0,"misses":0,"served":{"files":{"k":-3}}}\n')
        file.write("[" * 100_000 + "\n")
    with caplog.at_level(logging.WARNING, logger="warmenv.caches"):
        found = read_counts(counts)
    assert found["torch"].hits == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"{counts}: 7 line(s)"), warnings
