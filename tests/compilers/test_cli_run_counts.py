"""The counts file of `warmenv run` is the command's: whatever it writes there is
parsed into a count or refused, never into warmenv's own failure.

COMMAND here writes one line of its choosing beside a true count, as any
process of the command could; `--cache numba` since its hooks are what
append to the file (`warmenv.caches._children.write_counts`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compilers.machines import require

_GOOD = {"tool": "numba", "hits": 2, "misses": 1, "served": {"files": {"f.nbi": 2}}}
_WRITE = (
    "import os, sys; "
    "f = open(os.environ['WARMENV_CACHE_COUNTS'], 'a'); "
    "f.write(sys.argv[1] + '\\n'); f.write(sys.argv[2] + '\\n'); f.close(); "
    "sys.exit(7)"
)


@pytest.fixture(autouse=True)
def _numba_installed() -> None:
    require("numba")


@pytest.mark.parametrize(
    "bad",
    [
        '{"tool":"numba","hits":1e999,"misses":0}',
        '{"tool":"numba","hits":-5,"misses":0}',
        '{"tool":"numba","hits":true,"misses":0}',
        '{"tool":"numba","hits":1.5,"misses":0}',
        '{"tool":"numba","hits":"3","misses":0}',
        '{"tool":"numba","hits":0,"misses":0,"uncached":-1}',
        '{"tool":"numba","hits":0,"misses":0,"served":{"files":{"x":1e999}}}',
        '{"tool":"numba","hits":0,"misses":0,"served":{"files":{"x":-1}}}',
        '{"tool":"numba","hits":0,"misses":0,"served":{"files":[1]}}',
        '{"tool":7,"hits":0,"misses":0}',
        "[" * 100_000,
        "not json",
    ],
    ids=[
        "inf", "negative", "bool", "float", "str", "uncached-negative", "served-inf",
        "served-negative", "served-list", "tool-int", "deep", "text",
    ],
)  # fmt: skip
def test_a_bad_counts_line_is_skipped_with_one_warning_and_the_run_goes_on(
    tmp_path: Path, bad: str
) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "warmenv", "run", "--root", str(tmp_path / "root"),
         "--cache", "numba", "--", sys.executable, "-c", _WRITE, bad, json.dumps(_GOOD)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 7, completed.stderr  # the command's status, not warmenv's
    said = completed.stderr.splitlines()
    assert "warmenv: numba: 2 cache hits, 1 miss (its own counters)" in said, completed.stderr
    assert any(line.startswith("warmenv: numba: captured") for line in said), completed.stderr
    warned = [line for line in said if "not counts" in line]
    assert len(warned) == 1 and "1 line(s)" in warned[0], completed.stderr
    assert "error" not in completed.stderr
