"""Every Python example in the documentation runs, as a reader would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _examples() -> list[Any]:
    found = []
    for page in PAGES:
        for number, match in enumerate(BLOCK.finditer(page.read_text()), 1):
            found.append(pytest.param(match.group(1), id=f"{page.name}-{number}"))
    return found


EXAMPLES = _examples()


def test_the_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs(code: str, tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "WARMENV_ROOT": str(tmp_path / "root")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr


def test_every_example_passes_mypy_strict(tmp_path: Path) -> None:
    """Examples are code users copy: each one type-checks under `mypy --strict`."""
    from mypy import api

    files = []
    for param in EXAMPLES:
        (code,) = param.values
        name = str(param.id).replace(".", "_").replace("-", "_")
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        files.append(str(path))
    stdout, stderr, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / ".mypy_cache"), *files]
    )
    assert status == 0, stdout + stderr
