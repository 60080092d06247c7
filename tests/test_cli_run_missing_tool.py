"""`warmenv run --cache TOOL` where TOOL's package is not installed: one line, the install hint.

The Python here is a real one without any compiler: a fresh virtual
environment that sees warmenv's source and its required distributions only
(linked from this test's own site-packages), so the compilers the test
session may have are truly absent from it. warmenv reads a tool's version
from its own Python (it decides which entries can hit), so it refuses
before restoring anything or starting COMMAND.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import warmenv

_TOOLS = ("jax", "numba", "triton", "torch")
_CLONE = Path(warmenv.__file__).resolve().parent.parent.parent


def _required(distribution: str, seen: set[str]) -> None:
    """`distribution` and what it requires (no extras), by normalised name, into `seen`."""
    name = re.sub(r"[-_.]+", "-", distribution).lower()
    if name in seen:
        return
    seen.add(name)
    for requirement in importlib.metadata.requires(distribution) or []:
        if "extra ==" in requirement:
            continue
        marker = requirement.partition(";")[2]
        if "python_version" in marker and "<" in marker and sys.version_info >= (3, 13):
            continue
        required = re.match(r"[A-Za-z0-9._-]+", requirement)
        if required is not None:
            _required(required.group(0), seen)


def _top_level(distribution: str) -> set[Path]:
    """Where the importable top-level modules of `distribution` are installed."""
    found: set[Path] = set()
    dist = importlib.metadata.distribution(distribution)
    for file in dist.files or []:
        parts = file.parts
        if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] == "..":
            continue
        if len(parts) > 1 or parts[0].endswith((".py", ".so")):
            found.add(Path(str(dist.locate_file(parts[0]))))
    return found


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with warmenv and its requirements, and none of the compilers."""
    home = tmp_path_factory.mktemp("bare")
    venv.create(home / "venv", with_pip=False)
    python = home / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    linked = home / "linked"
    linked.mkdir()
    names: set[str] = set()
    for requirement in importlib.metadata.requires("warmenv") or []:
        if "extra ==" not in requirement:
            match = re.match(r"[A-Za-z0-9._-]+", requirement)
            if match is not None:
                _required(match.group(0), names)
    for name in names:
        try:
            locations = _top_level(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a marker left it out here
        for location in locations:
            (linked / location.name).symlink_to(location)
    source = Path(warmenv.__file__).parent.parent
    (site / "warmenv-bare.pth").write_text(f"{source}\n{linked}\n", encoding="utf-8")
    return python


@pytest.mark.parametrize("tool", sorted(_TOOLS))
def test_run_refuses_a_tool_not_installed_in_one_line_with_the_hint(
    bare_python: Path, tmp_path: Path, tool: str
) -> None:
    ran = tmp_path / "ran"
    command = [str(bare_python), "-c", f"open({str(ran)!r}, 'w')"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("WARMENV_", "PYTHON"))}
    completed = subprocess.run(
        [bare_python, "-m", "warmenv", "run", "--root", str(tmp_path / "root"), "--cache", tool,
         "--", *command],
        capture_output=True, text=True, timeout=120, env=environ,
    )  # fmt: skip
    assert completed.returncode == 1, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    # warmenv runs from the clone without being installed: the hint installs from the clone
    assert f"pip install -e '{_CLONE}[{tool}]'" in lines[0] and f"--cache {tool}" in lines[0]
    assert not ran.exists()  # COMMAND never started
    assert not (tmp_path / "root" / "default.caches").exists()  # nothing restored


def test_the_bare_python_has_no_compiler(bare_python: Path) -> None:
    found = subprocess.run(
        [bare_python, "-c", "import importlib.util as u; "
         "print([m for m in ('jax', 'numba', 'triton', 'torch') if u.find_spec(m)])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert found == "[]"
