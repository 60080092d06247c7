"""What the command prints, whatever the terminal and whatever the paths hold.

A line rich wraps on a narrow terminal must not end in the space it wrapped
at (a copied digest or summary would carry it), and `--json` must be valid
UTF-8 JSON even when a path holds bytes that are not UTF-8 (they are written
escaped, `\\xff`, as on the terminal, never as a lone surrogate).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from test_cli import run_raw, terminal, warmenv
from warmenv import Namespace, open_environment

# A line longer than 80 columns in each summary: the digest, a machine, a namespace.
LONG = "a-namespace-long-enough-that-the-summary-line-wraps-at-eighty-columns"


@pytest.fixture
def long_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"

    async def fill() -> None:
        async with open_environment("warm", root=root) as env:
            await env.storage(Namespace("app", LONG, version="1")).insert(b"k", b"v")

    anyio.run(fill)
    return root


def _lines(output: bytes) -> list[str]:
    return output.decode("utf-8", "replace").replace("\r\n", "\n").split("\n")


@pytest.mark.parametrize(
    "command",
    [
        ("inspect", "{bundle}"),
        ("check", "{bundle}", "--app-version", "1", "--namespace", f"app/{LONG}/1"),
        ("explain", "--env", "warm", "--root", "{root}", f"app/{LONG}/1", "k"),
        ("stats", "--env", "warm", "--root", "{root}"),
    ],
    ids=lambda command: command[0],
)
def test_no_line_ends_in_a_space_on_an_80_column_terminal(
    long_root: Path, tmp_path: Path, command: tuple[str, ...]
) -> None:
    bundle = tmp_path / "warm.bundle"
    if "{bundle}" in command:
        exported = warmenv(
            "export",
            str(bundle),
            "--env",
            "warm",
            "--name",
            "n",
            "--app-version",
            "1",
            root=long_root,
        )
        assert exported.returncode == 0, exported.stderr
    args = [a.format(bundle=bundle, root=long_root) for a in command]
    code, output = terminal(*args, env={"COLUMNS": "80"})
    assert code in (0, 1), output
    lines = _lines(output)
    assert any(len(line) > 70 for line in lines), lines  # it did fill the width
    assert [line for line in lines if line != line.rstrip()] == []


def test_json_of_a_path_that_is_not_utf_8_is_utf_8_with_the_byte_escaped(
    tmp_path: Path,
) -> None:
    missing = os.fsencode(tmp_path) + b"/caf\xe9.bundle"
    completed = run_raw("inspect", missing, "--json")
    assert completed.returncode == 1
    document = json.loads(completed.stdout.decode("utf-8"))
    error = document["error"]
    error.encode("utf-8")  # no lone surrogate
    assert "caf\\xe9.bundle" in error, error
    assert "caf\\xe9.bundle" in completed.stderr.decode("utf-8")  # as the line says it
