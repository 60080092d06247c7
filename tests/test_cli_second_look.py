"""What a new user met on the command line, as found by the second fresh-clone review.

Each finding stood for a class, and each test pins the class's rule on a
real `python -m warmenv` (or `main` in a child running as `nobody`, where a
permission must bind): a root that cannot be written is named with the way
to choose another; a file that cannot be written is the one the user named;
a name in the wrong place, swapped arguments and typos get a hint; a Ctrl-C
while the command loads is one line and 130; `ls` shows a dangling link; a
bundle's name is no environment's; an empty export warns; and no install
hint says `warmenv[...]`, which PyPI does not serve.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from helpers import run_python, unprivileged_user
from test_cli import warmenv
from test_cli_errors import CLI, assert_one_error_line, files_under
from warmenv import Namespace, open_environment
from warmenv.bundle import open_bundle
from warmenv.cli import build_parser

BACKENDS = ["asyncio", "trio"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root with environment 'svc' (100 entries under app/1/k) and an empty 'empty'."""
    made = tmp_path / "root"

    async def make() -> None:
        async with open_environment("svc", root=made) as env:
            items = [(b"k%d" % i, b"v") for i in range(100)]
            await env.storage(Namespace("app", "k", version="1")).insert_many(items)
        async with open_environment("empty", root=made):
            pass

    anyio.run(make)
    return made


@pytest.fixture
def shipped(root: Path, shared_tmp: Path) -> Path:
    """A bundle of 'svc' that `nobody` may read."""
    out = shared_tmp / "svc.bundle"
    completed = warmenv(
        "export", str(out), "--name", "svc", "--app-version", "1", "--env", "svc", root=root
    )
    assert completed.returncode == 0, completed.stderr
    out.chmod(0o644)
    return out


# --- 1. a root that cannot be written: named, with the way to choose another -----------


def test_an_import_under_an_unwritable_root_names_the_root_and_how_to_choose_one(
    shipped: Path, shared_tmp: Path
) -> None:
    locked = shared_tmp / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    root = locked / "envs"  # the root itself does not exist: its parent is what stops it
    child = run_python(
        CLI, "import", str(shipped), "--env", "e", "--root", str(root), user=unprivileged_user()
    )
    line = assert_one_error_line(child, 1)
    assert f"cannot create its root {root} ({locked} is not writable by this process)" in line
    assert "(choose a root you can write with --root DIR, the WARMENV_ROOT variable" in line
    assert "root in warmenv.toml" in line
    assert "--env" not in line  # another name would fail alike
    assert list(locked.iterdir()) == []


def test_the_demo_refuses_an_unwritable_root_before_any_work(shared_tmp: Path) -> None:
    locked = shared_tmp / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    child = run_python(CLI, "demo", "--root", str(locked), user=unprivileged_user())
    line = assert_one_error_line(child, 1)
    assert line.startswith("warmenv: error: cannot write environment 'machine-a': ")
    assert f"environments live in the root {locked}: choose a root you can write" in line
    assert "tuned" not in child.stdout  # refused before the cold start's seconds of work
    assert list(locked.iterdir()) == []


# --- 2. a file that cannot be written is the one the user named -------------------------


@pytest.mark.parametrize("bundle_format", ["sqlite", "flat"])
def test_an_export_into_an_unwritable_directory_names_the_destination(
    root: Path, shared_tmp: Path, bundle_format: str
) -> None:
    source = shared_tmp / "svc.db"
    source.write_bytes((root / "svc.db").read_bytes())
    source.chmod(0o644)
    locked = shared_tmp / "out"
    locked.mkdir()
    locked.chmod(0o555)
    out = locked / "svc.bundle"
    child = run_python(
        CLI,
        *("export", str(out), "--name", "n", "--app-version", "1", str(source)),
        *("--format", bundle_format, "--root", str(shared_tmp / "r")),
        user=unprivileged_user(),
    )
    line = assert_one_error_line(child, 1)
    assert line == f"warmenv: error: {out}: Permission denied: cannot create a file in {locked}\n"
    assert list(locked.iterdir()) == []


# --- 3. a name in the wrong place -------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "meant"),
    [
        (["purge", "svc"], "warmenv purge --env svc"),
        (["gc", "svc"], "warmenv gc --env svc"),
        (["stats", "svc", "app/1/k"], "warmenv stats app/1/k --env svc"),
        (["explain", "app/1/k", "k1", "svc"], "warmenv explain app/1/k k1 --env svc"),
    ],
)
def test_an_environment_given_where_env_is_expected_says_the_command_meant(
    root: Path, arguments: list[str], meant: str
) -> None:
    before = files_under(root)
    line = assert_one_error_line(warmenv(*arguments, root=root), 2)
    assert f"'svc' is an environment in {root}: did you mean `{meant}`?" in line
    assert files_under(root) == before


def test_an_import_given_a_new_name_positionally_says_to_give_env(
    root: Path, shipped: Path
) -> None:
    before = files_under(root)
    line = assert_one_error_line(warmenv("import", str(shipped), "fresh", root=root), 2)
    assert "unrecognized arguments: fresh; to name an environment, give --env fresh" in line
    assert files_under(root) == before


def test_a_command_option_before_the_command_says_where_it_goes(root: Path, shipped: Path) -> None:
    completed = warmenv("--app-version", "1", "import", str(shipped), "--env", "t", root=root)
    line = assert_one_error_line(completed, 2)
    assert "--app-version is an option of import: give it after the command" in line
    assert "(warmenv import ... --app-version ...)" in line
    assert not (root / "t.db").exists()


def test_a_stray_argument_that_names_nothing_gets_argparse_line_alone(root: Path) -> None:
    line = assert_one_error_line(warmenv("stats", "app/1/k", "extra", "--env", "svc", root=root), 2)
    assert line == (
        "warmenv: error: stats: unrecognized arguments: extra (see 'warmenv stats --help')\n"
    )


# --- 4. explain with its arguments swapped ---------------------------------------------


def test_explain_with_key_and_namespace_swapped_says_the_order(root: Path) -> None:
    completed = warmenv("explain", "k1", "app/1/k", "--env", "svc", "--json", root=root)
    assert completed.returncode == 0, completed.stderr
    hint = json.loads(completed.stdout)["hint"]
    assert hint == (
        "NAMESPACE 'k1' holds nothing, but KEY 'app/1/k' is a namespace here (100 entries): "
        "the namespace comes first, `warmenv explain app/1/k k1`"
    )


def test_explain_in_the_right_order_gets_no_swap_hint(root: Path) -> None:
    completed = warmenv("explain", "app/1/k", "nope", "--env", "svc", "--json", root=root)
    assert completed.returncode == 0, completed.stderr
    assert "comes first" not in (json.loads(completed.stdout)["hint"] or "")


# --- 5. did you mean ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "suggestion"),
    [
        (["stast"], "did you mean 'stats'?"),
        (["export", "o.bundle", "--format", "flt"], "did you mean 'flat'?"),
        (["ls", "--env", "svx"], "did you mean 'svc'?"),
        (["stats", "ap", "--env", "svc"], "(did you mean 'app'?)"),
        (["stats", "app/2", "--env", "svc"], "(did you mean 'app/1'?)"),
        (["purge", "--namespace", "ap", "--env", "svc", "--yes"], "(did you mean 'app'?)"),
    ],
)
def test_a_typo_gets_the_closest_name(root: Path, arguments: list[str], suggestion: str) -> None:
    before = files_under(root)
    completed = warmenv(*arguments, root=root)
    assert completed.returncode in (1, 2), completed.stderr
    assert suggestion in assert_one_error_line(completed, completed.returncode)
    assert files_under(root) == before


def test_explain_of_a_mistyped_namespace_suggests_the_closest(root: Path) -> None:
    completed = warmenv("explain", "ap/1/kk", "--env", "svc", root=root)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-1] == "hint: did you mean 'app/1/k'?"


def test_a_name_unlike_any_gets_no_suggestion(root: Path) -> None:
    for arguments in (["zzzz"], ["ls", "--env", "qqqqqq"], ["stats", "zzz", "--env", "svc"]):
        completed = warmenv(*arguments, root=root)
        assert "did you mean" not in completed.stderr, completed.stderr


# --- 6. stats names the environment without "(read-only)" -----------------------------


def test_stats_names_the_environment_without_saying_read_only(root: Path) -> None:
    line = assert_one_error_line(warmenv("stats", "nothing", "--env", "svc", root=root), 1)
    assert line == (
        f"warmenv: error: no namespace matches 'nothing' in environment 'svc' at "
        f"{root / 'svc.db'}\n"
    )


# --- 7. Ctrl-C while the command loads ----------------------------------------------------

# Holds the child in its first import of anyio (after warmenv's own first module) and
# says so on stderr: the moment to press Ctrl-C, seen rather than slept for.
_HOLD_AT_ANYIO = """
import os, signal, sys

class Hold:
    def find_spec(self, name, path=None, target=None):
        if name == "anyio":
            sys.meta_path.remove(self)
            os.write(2, b"loading anyio\\n")
            signal.pause()
        return None

sys.meta_path.insert(0, Hold())
"""


def _interrupted_while_loading(
    hold: str, arguments: list[str], tmp_path: Path, **popen: Any
) -> tuple[subprocess.Popen[str], str, str]:
    """`python -m warmenv ARGUMENTS` held by `hold` (a sitecustomize) in its first import
    of anyio, sent SIGINT once it says so; the process, its stdout and its stderr."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(hold))
    path = os.pathsep.join([str(site), *(p for p in sys.path if p)])
    environment = {**os.environ, "PYTHONPATH": path, **popen.pop("env", {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "warmenv", *arguments],
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        **{"stdout": subprocess.PIPE, **popen},
    )
    assert process.stderr is not None
    assert process.stderr.readline() == "loading anyio\n"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    return process, out, err


@pytest.mark.parametrize("json_mode", [False, True])
def test_ctrl_c_while_the_command_loads_is_one_line_and_130(
    root: Path, shipped: Path, tmp_path: Path, json_mode: bool
) -> None:
    target = tmp_path / "target"
    arguments = ["import", str(shipped), "--env", "t", "--root", str(target)]
    process, out, err = _interrupted_while_loading(
        _HOLD_AT_ANYIO, arguments + (["--json"] if json_mode else []), tmp_path
    )
    assert process.returncode == 130, err
    assert err == "warmenv: error: interrupted while starting; nothing was done\n"
    if json_mode:
        assert json.loads(out) == {
            "error": "interrupted while starting; nothing was done",
            "exit": 130,
        }
    assert not target.exists()


# As _HOLD_AT_ANYIO, with stdout closed: the file the hold opens then takes its descriptor.
_HOLD_WITH_STDOUT_REUSED = _HOLD_AT_ANYIO.replace(
    'os.write(2, b"loading anyio\\n")',
    'os.open(os.environ["REUSED"], os.O_WRONLY | os.O_CREAT, 0o600)\n'
    '            os.write(2, b"loading anyio\\n")',
)


def test_ctrl_c_while_loading_never_writes_into_a_file_that_took_stdouts_descriptor(
    root: Path, shipped: Path, tmp_path: Path
) -> None:
    assert "REUSED" in _HOLD_WITH_STDOUT_REUSED
    reused = tmp_path / "reused.txt"
    process, _, err = _interrupted_while_loading(
        _HOLD_WITH_STDOUT_REUSED,
        ["import", str(shipped), "--env", "t", "--json", "--root", str(tmp_path / "target")],
        tmp_path,
        stdout=subprocess.DEVNULL,
        env={"REUSED": str(reused)},
        preexec_fn=lambda: os.close(1),
    )
    assert process.returncode == 130, err
    assert err == "warmenv: error: interrupted while starting; nothing was done\n"
    assert reused.exists() and reused.read_bytes() == b""


def test_a_program_named_warmenv_gets_its_own_ctrl_c_once_warmenv_is_imported(
    tmp_path: Path,
) -> None:
    program = tmp_path / "bin" / "warmenv"  # a wrapper of the user's own, by that name
    program.parent.mkdir()
    program.write_text(
        "import os, signal, warmenv\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    signal.pause()\n"
        "except KeyboardInterrupt:\n"
        "    print('caught')\n"
        "finally:\n"
        "    print('cleaned up')\n"
    )
    child = subprocess.run(
        [sys.executable, str(program), "--json"], capture_output=True, text=True, timeout=60
    )
    assert (child.returncode, child.stdout) == (0, "caught\ncleaned up\n"), child.stderr


def test_a_program_importing_warmenv_keeps_its_own_ctrl_c() -> None:
    code = (
        "import signal, warmenv\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert child.stdout == "True\n"


# --- 8. ls lists a dangling link --------------------------------------------------------


def test_ls_lists_a_dangling_environment_link_with_a_note(root: Path, tmp_path: Path) -> None:
    gone = tmp_path / "gone.db"
    (root / "moved.db").symlink_to(gone)
    completed = warmenv("ls", root=root)
    assert completed.returncode == 0, completed.stderr
    assert re.search(r"^moved \(dangling symlink\) +-$", completed.stdout, re.M), completed.stdout
    assert completed.stderr == (
        f"warmenv: warning: {root / 'moved.db'} is a symlink to a missing path ({gone}): no "
        "environment can be opened through it; fix or remove it\n"
    )
    listed = json.loads(warmenv("ls", "--json", root=root).stdout)["environments"]
    assert {"name": "moved", "path": str(root / "moved.db"), "file_bytes": None} == {
        k: v for k, v in listed[1].items() if k != "dangling"
    }
    assert [e["name"] for e in listed] == ["empty", "moved", "svc"]


# --- 9. a name that reads as a file -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("keys.bundle", "it names a bundle file (.bundle), which is imported into an"),
        ("a/b", "a name, not a path"),
    ],
)
def test_an_environment_name_that_reads_as_a_file_is_refused_with_a_hint(
    root: Path, shipped: Path, name: str, why: str
) -> None:
    before = files_under(root)
    for arguments in (["import", str(shipped)], ["ls"], ["stats"]):
        line = assert_one_error_line(warmenv(*arguments, "--env", name, root=root), 2)
        assert f"invalid environment name '{name}': {why}" in line
    assert files_under(root) == before


@pytest.mark.parametrize("name", ["$(id>x).bundle", "a b;rm -r x.bundle", "`id`.bundle"])
def test_a_bundle_name_of_shell_words_gets_no_command_to_paste(
    root: Path, shipped: Path, name: str
) -> None:
    # The name may come from a cloned project's pyproject.toml: no hint may hand it back
    # as a command line, where the shell would run what it holds.
    line = assert_one_error_line(warmenv("stats", "--env", name, root=root), 2)
    assert "warmenv import" not in line and "letters, digits" in line, line


def test_the_library_refuses_a_bundle_name_as_an_environment(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_environment("keys.bundle", root=tmp_path):
            pass

    with pytest.raises(ValueError, match=r"invalid environment name 'keys\.bundle'"):
        anyio.run(main)
    assert list(tmp_path.iterdir()) == []


# --- 10. an empty export ------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_export_warns_and_writes_a_valid_bundle(
    root: Path, tmp_path: Path, backend: str
) -> None:
    out = tmp_path / "empty.bundle"
    completed = warmenv(
        *("export", str(out), "--name", "e", "--app-version", "1", "--env", "empty"),
        root=root,
        env={"WARMENV_CLI_BACKEND": backend},
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == (
        f"warmenv: warning: the source held no entries: {out} is a valid bundle of nothing "
        "(an import of it adds nothing); check the --env or SOURCE given\n"
    )

    async def namespaces() -> list[object]:
        async with open_bundle(out) as bundle:
            return list(await bundle.namespaces())

    assert anyio.run(namespaces) == []
    with sqlite3.connect(out) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()


def test_an_export_with_entries_does_not_warn(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "svc.bundle"
    completed = warmenv(
        "export", str(out), "--name", "s", "--app-version", "1", "--env", "svc", root=root
    )
    assert completed.returncode == 0 and completed.stderr == "", completed.stderr


# --- 11. install hints ------------------------------------------------------------------

_PYPI_EXTRA = re.compile(r"warmenv\[[a-z]+\]")
DOCS = Path(__file__).parent.parent / "docs"


def test_no_page_says_to_install_an_extra_from_pypi() -> None:
    pages = [*DOCS.glob("*.md"), DOCS.parent / "README.md"]
    said = {
        page.name: _PYPI_EXTRA.findall(page.read_text())
        for page in pages
        if page.name != "changelog.md"
    }
    assert {name: found for name, found in said.items() if found} == {}


def test_no_help_text_says_to_install_an_extra_from_pypi() -> None:
    parser = build_parser()
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = [parser.format_help(), *(p.format_help() for p in action.choices.values())]
    assert [h for h in helps if _PYPI_EXTRA.search(h.replace("\n", " "))] == []
    import warmenv.cli

    assert not _PYPI_EXTRA.search(warmenv.cli.__doc__ or "")
