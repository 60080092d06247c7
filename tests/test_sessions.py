"""The nox sessions run what the repository holds and the documents name them.

A benchmark no session runs is never run (bench_caches.py and
bench_caches_cpu.py were not, before `nox -s bench_caches`), and a session
the documents do not name is one a contributor does not know to run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _noxfile() -> ast.Module:
    return ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))


def _sessions() -> set[str]:
    """The functions of noxfile.py decorated as sessions."""
    return {
        node.name
        for node in ast.walk(_noxfile())
        if isinstance(node, ast.FunctionDef)
        and any("session" in ast.unparse(d) for d in node.decorator_list)
    }


def test_every_benchmark_script_is_run_by_a_session() -> None:
    named = {
        node.value
        for node in ast.walk(_noxfile())
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    scripts = {p.name for p in (ROOT / "benchmarks").glob("bench_*.py")}
    assert scripts - named == set()


def test_contributing_names_every_session() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert _sessions() - set(re.findall(r"nox -s (\w+)", text)) == set()


def test_the_readme_names_the_heavier_sessions() -> None:
    named = set(re.findall(r"nox -s (\w+)", (ROOT / "README.md").read_text(encoding="utf-8")))
    assert {"compilers", "reliability", "bench", "bench_caches"} <= named
    assert named <= _sessions()
