"""Shell completion of `warmenv`, driven as bash drives it, through the installed script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from warmenv import open_environment

BIN = Path(sys.executable).parent
COMMANDS = {
    "demo", "ls", "stats", "explain", "export", "import",
    "inspect", "verify", "check", "purge", "gc", "vacuum", "run",
}  # fmt: skip


def installed(name: str) -> str:
    found = shutil.which(name, path=str(BIN))
    if found is None:
        pytest.fail(f"no {name} beside {sys.executable}: pip install -e '.[test]'")
    return found


def run_bash(script: str, env: dict[str, str] | None = None) -> list[str]:
    completed = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})},
    )
    assert completed.returncode == 0, completed.stderr
    return [line.strip() for line in completed.stdout.splitlines() if line.strip()]


def complete(line: str, env: dict[str, str] | None = None) -> list[str]:
    """What <TAB> after `line` offers, through the documented set-up:
    `eval "$(register-python-argcomplete warmenv)"` in bash, then the
    completion function bash would call, with the words bash would split."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    script = f"""
eval "$(register-python-argcomplete warmenv)"
COMP_LINE={_quote(line)}
COMP_POINT=${{#COMP_LINE}}
COMP_WORDS=({" ".join(_quote(w) for w in words)})
COMP_CWORD={len(words) - 1}
_python_argcomplete warmenv
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    return run_bash(script, env)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.fixture
def environments(tmp_path: Path) -> Path:
    """A root holding the environments 'alpha' and 'beta'."""
    root = tmp_path / "root"

    async def create() -> None:
        for name in ("alpha", "beta"):
            async with open_environment(name, root=root):
                pass

    anyio.run(create)
    return root


def test_the_sub_commands_are_offered() -> None:
    assert COMMANDS <= set(complete("warmenv "))


def test_a_partial_sub_command_is_completed() -> None:
    assert complete("warmenv st") == ["stats"]
    assert set(complete("warmenv i")) == {"import", "inspect"}


def test_a_sub_commands_options_are_offered() -> None:
    offered = set(complete("warmenv import --"))
    shared = {"--env", "--root", "--remote", "--json", "--quiet", "--debug", "--help"}
    assert shared | {"--namespace", "--no-verify"} <= offered
    assert "--html" not in offered  # stats' own
    assert "--html" in complete("warmenv stats --h")


def test_env_is_completed_with_the_environments_under_root(environments: Path) -> None:
    assert complete(f"warmenv ls --root {environments} --env ") == ["alpha", "beta"]
    assert complete(f"warmenv stats --root {environments} --env b") == ["beta"]


def test_env_offers_only_valid_names_never_control_characters(environments: Path) -> None:
    for hostile in ("\x1b[31mevil", "new\nline", "a b", "\x9bcsi"):
        (environments / f"{hostile}.db").touch()
    assert complete(f"warmenv ls --root {environments} --env ") == ["alpha", "beta"]


def test_env_is_completed_from_the_configured_root(environments: Path) -> None:
    assert complete("warmenv purge --env ", env={"WARMENV_ROOT": str(environments)}) == [
        "alpha",
        "beta",
    ]


def test_completing_runs_nothing(tmp_path: Path) -> None:
    root = tmp_path / "never"
    offered = complete(f"warmenv import bundle --root {root} --env fresh --")
    assert "--no-verify" in offered
    assert not root.exists()


def test_the_protocol_directly_the_completions_go_to_file_descriptor_8() -> None:
    """argcomplete's protocol without the shell function: `_ARGCOMPLETE`,
    `COMP_LINE`, `COMP_POINT`, and the answer written to fd 8 (stdout unused)."""
    line = "warmenv gc --"
    script = 'exec "$0" 8>&1 1>/dev/null 9>/dev/null'
    completed = subprocess.run(
        ["bash", "-c", script, installed("warmenv")],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "_ARGCOMPLETE": "1",
            "_ARGCOMPLETE_IFS": "\n",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
        },
    )
    assert completed.returncode == 0, completed.stderr
    offered = {option.strip() for option in completed.stdout.split("\n")}
    assert {"--max-bytes", "--older-than", "--keep-versions", "--env"} <= offered


def test_the_script_is_marked_for_global_completion() -> None:
    """What `activate-global-python-argcomplete`'s hook checks before completing."""
    completed = subprocess.run(
        [sys.executable, "-m", "argcomplete._check_console_script", installed("warmenv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_a_normal_run_does_not_import_argcomplete() -> None:
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "warmenv", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "warmenv.cli" in completed.stderr  # the import log is there
    assert "argcomplete" not in completed.stderr
