"""`warmenv run --cache-dir DIR` where DIR lies under a symlink to a missing path: one
error line naming the link and where it points (not mkdir's bare "File exists")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from compilers.machines import require


def test_run_with_a_cache_dir_under_a_dangling_symlink_names_the_link(tmp_path: Path) -> None:
    require("numba")
    link = tmp_path / "mylink"
    link.symlink_to(tmp_path / "gone")
    completed = subprocess.run(
        [sys.executable, "-m", "warmenv", "run", "--root", str(tmp_path / "root"),
         "--cache", "numba", "--cache-dir", str(link / "cache"), "--", "true"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 1
    errors = [line for line in completed.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, completed.stderr
    assert f"{link} is a symlink to a missing path ({tmp_path / 'gone'})" in errors[0]
    assert "File exists" not in completed.stderr
