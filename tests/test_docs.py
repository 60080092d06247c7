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


def test_every_code_fence_is_a_line_of_its_own() -> None:
    """A fence with text after it never closes: the rest of the page renders as code."""
    bad = [
        f"{page.name}:{number}: {line.strip()}"
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if line.lstrip().startswith("```") and not re.fullmatch(r"\s*```[\w-]*", line)
    ]
    assert not bad, bad


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


@pytest.mark.parametrize(
    "code",
    [e for e in EXAMPLES if "generate_key(" in e.values[0]],
)
def test_an_example_that_makes_a_key_runs_again_in_the_same_directory(
    code: str, tmp_path: Path
) -> None:
    # A reader runs an example twice (after an edit, say); a key that exists must not stop it.
    for run in ("first", "again"):
        completed = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env={**os.environ, "WARMENV_ROOT": str(tmp_path / "root")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert completed.returncode == 0, (run, completed.stderr)


def test_the_signing_guide_makes_its_key_only_once() -> None:
    guide = (ROOT / "docs" / "bundles.md").read_text()
    assert "[ -e ci.key ] || warmenv keygen ci.key" in guide


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


def test_the_first_install_command_works_from_a_clone_as_warmenv_is_not_on_pypi() -> None:
    # A new user's first command was `pip install warmenv`, which PyPI does not have.
    clone_install = 'python -m pip install -e ".[cli]"'
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    first = re.search(r"^```sh\n(.*?)$", quickstart, re.M)
    assert first is not None and first.group(1).startswith(clone_install), first
    assert clone_install in (ROOT / "README.md").read_text()
    for page in PAGES:
        for line in page.read_text().splitlines():
            assert not re.match(r"\s*(python -m )?pip install ['\"]?warmenv\b", line), (
                f"{page.name}: {line.strip()} installs from PyPI, where warmenv is not"
            )
