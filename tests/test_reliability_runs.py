"""`nox -s reliability` runs every test that records a row of docs/reliability.md.

The session rewrites the table from the rows its runs record (`RELIABILITY_RUNS`
in noxfile.py), so a test that records a row but is in none of the runs has its
row dropped by the next full run: rows of issue 22's classes were merged into the
table from targeted runs while their tests were missing from the session. Which
tests record a row is read from their source (a call of `helpers`' `one_trial`
or `reliability_row`, or `@counted`, in the test or in a function of its module
it calls); which of them a run selects, from pytest's own collection of the
run's arguments. Every run is collected in one child process (`pytest.main`
once per run): collecting is mostly importing the test modules, which the
runs share, so the check costs one import of the suite, not one per run
(about half the CPU time: 4.3 s, where six children took 9.1 s). A saturated
machine stretches even that one import many times over (six of them took the
test past the suite's 300 s timeout at load 15-35), so the test has its own,
larger timeout: a backstop against a hang, not a bound on what it checks.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RECORDERS = frozenset({"one_trial", "reliability_row", "counted"})
"""The names in tests/helpers.py that record a row."""

_Function = ast.FunctionDef | ast.AsyncFunctionDef


def reliability_runs() -> list[list[str]]:
    """`RELIABILITY_RUNS` as noxfile.py writes it (a literal: nox need not be installed)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == "RELIABILITY_RUNS" and node.value is not None:
                runs: list[list[str]] = ast.literal_eval(node.value)
                return runs
    raise AssertionError("noxfile.py has no RELIABILITY_RUNS")


def _recorders_in(tree: ast.Module) -> set[str]:
    """How this module names helpers' recording functions: as imported, or `helpers.x`."""
    names = {f"helpers.{name}" for name in RECORDERS}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "helpers":
            names |= {a.asname or a.name for a in node.names if a.name in RECORDERS}
    return names


def _called(function: _Function) -> set[str]:
    """The names `function` calls or is decorated by (`helpers.x` as such)."""
    names = set()
    for node in [*function.decorator_list, *ast.walk(function)]:
        target = node.func if isinstance(node, ast.Call) else node
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            names.add(f"{target.value.id}.{target.attr}")
    return names


def _writes_its_own_report(function: _Function) -> bool:
    """A test of the recording itself: it points WARMENV_RELIABILITY_REPORT at its own file."""
    return any(
        isinstance(node, ast.Constant) and node.value == "WARMENV_RELIABILITY_REPORT"
        for node in ast.walk(function)
    )


def recording_tests(path: Path) -> set[str]:
    """The tests of one module that record a row, as `name` or `Class::name`."""
    tree = ast.parse(path.read_text())
    recorders = _recorders_in(tree)
    functions: dict[str, _Function] = {}
    for node in tree.body:
        if isinstance(node, _Function):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, _Function):
                    functions[f"{node.name}::{member.name}"] = member
    calls = {name: _called(function) for name, function in functions.items()}
    recording = {name for name, called in calls.items() if called & recorders}
    while True:  # and the functions that call one of those, to any depth
        more = {name for name, called in calls.items() if called & recording} - recording
        if not more:
            break
        recording |= more
    return {
        name
        for name in recording
        if name.rsplit("::", 1)[-1].startswith("test_")
        and not _writes_its_own_report(functions[name])
    }


_BACKSTOP = 900
"""Seconds the collecting test may take (the suite's default is 300)."""

# The child that collects each run: pytest.main per run, the test items' ids kept by a plugin.
_COLLECT = """
import json, sys
import pytest

class Kept:
    ids = []

    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

runs, out = json.loads(sys.argv[1]), sys.argv[2]
found = []
for run in runs:
    kept = Kept()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *run], plugins=[kept])
    found.append({"code": int(code), "ids": kept.ids})
with open(out, "w") as file:
    json.dump(found, file)
"""


def selected(runs: list[list[str]], files: list[Path], out: Path) -> list[set[str]]:
    """The tests each `pytest RUN` selects, as `file::name` (parameters dropped): collected
    by pytest itself, over the run's files or, for a run over the whole suite, `files`.
    `out` is where the child writes what it found."""
    arguments = []
    for run in runs:
        named = [a for a in run if a.endswith(".py")]
        options = [a for a in run if not a.endswith(".py")]
        paths = named or [str(f.relative_to(ROOT)) for f in files]
        arguments.append([*options, *paths])
    completed = subprocess.run(
        [sys.executable, "-c", _COLLECT, json.dumps(arguments), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=_BACKSTOP - 60,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    found = json.loads(out.read_text())
    for run, each in zip(runs, found, strict=True):
        assert each["code"] in (0, 5), f"collecting {run} failed: {completed.stdout}"  # 5: none
    return [
        {
            f"{Path(path).name}::{name.split('[', 1)[0]}"
            for path, name in (nodeid.split("::", 1) for nodeid in each["ids"])
        }
        for each in found
    ]


@pytest.mark.timeout(_BACKSTOP)
def test_every_test_that_records_a_row_is_in_a_run_of_the_reliability_session(
    tmp_path: Path,
) -> None:
    recording = {
        f"{path.name}::{name}"
        for path in sorted(TESTS.glob("test_*.py"))
        for name in recording_tests(path)
    }
    assert len(recording) > 50  # the reading of the sources finds them
    files = sorted({TESTS / test.split("::", 1)[0] for test in recording})
    covered = set().union(*selected(reliability_runs(), files, tmp_path / "selected.json"))
    missing = sorted(recording - covered)
    assert not missing, (
        f"{len(missing)} tests record a row of docs/reliability.md but no run of "
        f"`nox -s reliability` selects them (add them to RELIABILITY_RUNS in noxfile.py): "
        + ", ".join(missing)
    )


def test_the_reading_finds_the_ways_a_test_records_a_row(tmp_path: Path) -> None:
    module = tmp_path / "test_sample.py"
    module.write_text(
        """
import helpers
from helpers import counted as row_of, one_trial

def counted(root):  # not helpers' counted
    return root

def trials_of(row):
    with one_trial(*row):
        pass

@row_of("a", "b")
def test_decorated(): ...

async def test_in_its_body():
    with helpers.reliability_row("a", "b"):
        pass

def test_through_a_helper():
    trials_of(("a", "b"))

class TestGrouped:
    def test_in_a_class(self):
        with one_trial("a", "b"):
            pass

def test_a_local_namesake():
    counted(1)

def test_of_the_recording(monkeypatch):
    monkeypatch.setenv("WARMENV_RELIABILITY_REPORT", "x")
    with one_trial("a", "b"):
        pass
"""
    )
    assert recording_tests(module) == {
        "test_decorated",
        "test_in_its_body",
        "test_through_a_helper",
        "TestGrouped::test_in_a_class",
    }
