"""The test helpers themselves: children running as another user see what they need."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

import helpers
from helpers import json_lines, run_python, staged_path, unprivileged_user

_PROBE = """
import json, sys
import probe_pkg, warmenv, warmenv.bundle, warmenv.cli, anyio, attrs, platformdirs, trio
try:
    import uvloop
except ImportError:
    uvloop = None
print(json.dumps({"answer": probe_pkg.ANSWER, "uvloop": uvloop is not None}))
"""


def _private_package(tmp_path: Path) -> Path:
    """A directory on the path that only its owner may enter, as a clone under /root is."""
    private = tmp_path / "private-clone"
    (private / "probe_pkg").mkdir(parents=True)
    (private / "probe_pkg" / "__init__.py").write_text("ANSWER = 42\n")
    (private / "probe_pkg" / "__init__.py").chmod(0o600)
    private.chmod(0o700)
    return private


def test_a_child_running_as_another_user_imports_code_from_a_private_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = _private_package(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path, str(private)])
    [seen] = json_lines(run_python(_PROBE, user=unprivileged_user()))
    assert seen == {"answer": 42, "uvloop": sys.platform != "win32"}


def test_the_staged_copy_is_open_to_everyone_and_leaves_out_our_standard_library(
    tmp_path: Path,
) -> None:
    private = _private_package(tmp_path)
    staged = staged_path((*sys.path, str(private)))
    assert staged == staged_path((*sys.path, str(private))), "made once, then reused"
    stdlib = os.path.realpath(sys.base_prefix)
    for entry in staged:
        assert not os.path.realpath(entry).startswith(stdlib + os.sep)
        for directory, _, files in os.walk(entry):
            assert stat.S_IMODE(os.stat(directory).st_mode) & 0o005 == 0o005, directory
            for name in files:
                mode = os.stat(os.path.join(directory, name)).st_mode
                assert mode & stat.S_IROTH, os.path.join(directory, name)
    copied = {p.name for entry in staged for p in entry.iterdir()}
    expected = {"probe_pkg", "warmenv", "anyio", "attrs", "platformdirs", "trio", "outcome", "rich"}
    assert expected <= copied
    assert "hypothesis" not in copied and "_pytest" not in copied  # only what children import


def test_a_search_path_holding_the_temporary_directory_is_not_copied_into_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Made where the helper makes its stage (the system's temporary directory), as a
    # directory other users may enter: pytest's own base directory is closed to them.
    scratch = Path(tempfile.mkdtemp(prefix="warmenv-test-stage-"))
    try:
        scratch.chmod(0o755)
        (scratch / "probe.py").write_text("ANSWER = 42\n")
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the stage is made
        staged = helpers._stage.__wrapped__((str(scratch),))
        assert staged == []  # not copied: it holds the stage
        (stage,) = [p for p in scratch.iterdir() if p.name.startswith("warmenv-child-path-")]
        assert sum(1 for _ in stage.rglob("*")) == 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
