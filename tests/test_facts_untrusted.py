"""Checking an untrusted bundle runs no code: its facts are strings, never module names.

A captured tree's facts are the bundle's own strings. A fact named
`<pkg>.<sub>.path` once had `importlib.util.find_spec("<pkg>.<sub>")` work
out an install path, which imports `<pkg>`: `warmenv check evil.bundle`
ran whatever `<pkg>` runs on import. Here a package whose import leaves a
marker file sits on the checking child's `sys.path`; the bundle names it in
such facts, and the marker never appears. A bundle an import would refuse
for its signature is refused before its facts are looked at.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from warmenv import open_environment
from warmenv._facts import Facts, fact_here, is_fact
from warmenv.bundle import Trust, export_bundle, preflight
from warmenv.caches import directory

EVIL = "evilfactpkg"
FACTS = [(f"{EVIL}.sub.zz.path", "abc"), (f"{EVIL}.path", "abc")]


def _evil_package(where: Path, marker: Path) -> Path:
    """A package on no path but the child's, whose import writes `marker`."""
    package = where / EVIL
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (package / "sub.py").write_text("")
    return where


async def _bundle(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "kernel.bin").write_bytes(b"k" * 100)
    out = tmp_path / "evil.bundle"
    async with open_environment("ci", root=tmp_path / "root") as env:
        await directory.capture(env, source, tool="x", facts=Facts.of(FACTS))
        await export_bundle(env, out, name="evil", version="1.0")
    return out


def _child(args: list[str], path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(path), *(p for p in sys.path if os.path.isdir(p))])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def evil(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the bundle, the directory holding the package, the marker its import writes)."""
    marker = tmp_path / "imported"
    path = _evil_package(tmp_path / "lib", marker)
    return anyio.run(_bundle, tmp_path), path, marker


def test_warmenv_check_of_a_bundle_naming_a_module_in_a_fact_imports_nothing(
    evil: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    bundle, path, marker = evil
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _child(["-m", "warmenv", "check", str(bundle)], path, empty)
    assert not marker.exists(), "checking the bundle imported the package it names"
    assert list(empty.iterdir()) == []
    assert f"fact '{EVIL}.sub.zz.path' abc was captured" in done.stdout, done.stdout + done.stderr
    assert "not computed here" in done.stdout
    assert "will not hit" in done.stdout


def test_preflight_of_a_bundle_naming_a_module_in_a_fact_imports_nothing(
    evil: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    bundle, path, marker = evil
    code = (
        "import sys, anyio\n"
        "from warmenv.bundle import preflight\n"
        "report = anyio.run(preflight, sys.argv[1])\n"
        f"assert {EVIL!r} not in sys.modules\n"
        "print(report)\n"
    )
    done = _child(["-c", code, str(bundle)], path, tmp_path)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "preflight imported the package the bundle names"
    assert "not computed here" in done.stdout, done.stdout


def test_a_fact_naming_a_module_inside_a_package_is_no_fact_and_is_refused() -> None:
    assert is_fact("torch.path") and is_fact("python") and is_fact("cupy")
    assert not is_fact(f"{EVIL}.sub.path")
    with pytest.raises(ValueError, match="top-level package"):
        fact_here(f"{EVIL}.sub.path")
    with pytest.raises(ValueError, match="top-level package"):
        Facts.here("python", "this.zz.path")


def test_a_top_level_install_path_is_found_without_importing_the_package(
    evil: tuple[Path, Path, Path],
) -> None:
    _, path, marker = evil
    code = (
        "import sys\n"
        "from warmenv._facts import fact_here\n"
        f"print(fact_here({EVIL + '.path'!r}))\n"
        f"assert {EVIL!r} not in sys.modules\n"
    )
    done = _child(["-c", code], path, path)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert done.stdout.strip() not in ("", "none")


@pytest.mark.anyio
async def test_preflight_refuses_an_unsigned_bundle_before_it_reads_its_facts(
    evil: tuple[Path, Path, Path],
) -> None:
    bundle, _, _ = evil
    report = await preflight(bundle, trust=Trust(require_signature=True))
    assert not report.ok
    assert report.signature_refused is not None
    assert report.caches == ()  # the facts were not worked out
    assert any("facts are not checked: its signature is refused" in r for r in report.reasons)
