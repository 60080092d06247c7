"""What a new user met on the command line, as found by the third fresh-clone review.

Each finding stood for a class, and each test pins the class's rule on a
real `python -m warmenv` (or `main` in a child running as `nobody`, where a
permission must bind): every command line the help and docs/cli.md show is
one the parser takes; an option given before its command, flag or not, says
where it goes; a root that cannot be written is refused before anything is
printed, naming the root tried and only the ways the command takes one; a
name that reads as a file is refused with the command that fits; `ls` says a
root does not exist; explain's lines count and name as they should; bare
`warmenv` and `warmenv help` list the commands; and a typo of a tool, an
option, a command's case or a version without its option gets the closest.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import textwrap
from pathlib import Path

import anyio
import pytest

from helpers import run_python, unprivileged_user
from test_cli import warmenv
from test_cli_errors import CLI, assert_one_error_line, files_under
from test_cli_new_user import subcommands
from warmenv import Namespace, open_environment
from warmenv.cli import build_parser
from warmenv.cli._errors import UsageError
from warmenv.persistence import Store

DOCS = Path(__file__).parent.parent / "docs" / "cli.md"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root with 'quickstart': app/1/kernels holding the integer key 4096 and 'k1'."""
    made = tmp_path / "root"

    async def make() -> None:
        async with open_environment("quickstart", root=made) as env:
            store: Store[object, str] = await env.store(Namespace("app", "kernels", version="1"))
            await store.insert(4096, "an integer key")
            await store.insert("k1", "a string key")

    anyio.run(make)
    return made


@pytest.fixture
def shipped(root: Path, shared_tmp: Path) -> Path:
    """A bundle of 'quickstart' that `nobody` may read."""
    out = shared_tmp / "h100.bundle"
    completed = warmenv(
        *("export", str(out), "--name", "h100", "--app-version", "1", "--env", "quickstart"),
        root=root,
    )
    assert completed.returncode == 0, completed.stderr
    out.chmod(0o644)
    return out


# --- 1. what the help and the docs show is what the parser takes -------------------------


def test_explain_takes_a_raw_key_after_the_flag_as_its_help_shows(root: Path) -> None:
    for given in (["--raw-key", "4096"], ["4096", "--raw-key"]):  # and as KEY, as before
        completed = warmenv(
            *("explain", "app/1/kernels", *given, "--env", "quickstart", "--json"), root=root
        )
        assert completed.returncode == 0, completed.stderr
        document = json.loads(completed.stdout)
        assert (document["key"], document["has_key"]) == ("4096", True)


def test_explain_given_a_key_twice_says_to_give_it_once(root: Path) -> None:
    twice = ["explain", "app/1/kernels", "1", "--raw-key", "2", "--env", "quickstart"]
    line = assert_one_error_line(warmenv(*twice, root=root), 2)
    assert "KEY given twice ('1', and '2' after --raw-key); give it once" in line


def _help_texts() -> list[str]:
    texts = [build_parser().description or ""]
    for parser in subcommands().values():
        texts += [parser.description or "", parser.epilog or ""]
        texts += [a.help for a in parser._actions if a.help and a.help != argparse.SUPPRESS]
    return texts


def _examples() -> list[str]:
    """Every command line shown whole: `warmenv ...` in backquotes in the help texts and
    docs/cli.md, and `$ warmenv ...` in its blocks. A synopsis (`[--format sqlite|flat]`,
    `SOURCE...`) is no command line and a pipe is the shell's: those are left out."""
    docs = DOCS.read_text()
    shown = re.findall(r"`(warmenv [^`]+)`", "\n".join([*_help_texts(), docs]))
    shown += re.findall(r"^\$ (warmenv .+)$", docs, re.M)
    return sorted(
        {example for example in shown if not re.search(r"[\[\]|<>{}]|\.\.\.|\bCOMMAND\b", example)}
    )


EXAMPLES = _examples()


def test_the_help_and_docs_show_whole_command_lines() -> None:
    assert len(EXAMPLES) >= 20, EXAMPLES
    assert any("--raw-key 42" in e for e in EXAMPLES), EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_command_line_shown_is_one_the_parser_takes(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = shlex.split(example)[1:]
    try:
        _, extra = build_parser().parse_known_args(arguments)
    except SystemExit as exc:  # --help, --version
        assert exc.code == 0, example
        return
    except UsageError as exc:
        # A command named with only some of its arguments (`warmenv export --sign KEY`):
        # what it shows is taken, what it leaves out is not its point.
        assert "the following arguments are required" in str(exc), (example, exc)
        return
    assert extra == [], example


# --- 2. an option before its command, flag or not ---------------------------------------


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--yes", "purge", "--env", "quickstart"], "--yes is an option of purge"),
        (["--raw-key", "explain", "app/1/kernels", "4096"], "--raw-key is an option of explain"),
        (["--no-verify", "import", "{bundle}", "--env", "x"], "--no-verify is an option of import"),
    ],
)
def test_a_flag_before_its_command_says_to_give_it_after(
    root: Path, shipped: Path, arguments: list[str], said: str
) -> None:
    before = files_under(root)
    given = [a.format(bundle=shipped) for a in arguments]
    line = assert_one_error_line(warmenv(*given, root=root), 2)
    assert f"unrecognized arguments: {given[0]}; {said}: give it after the command" in line
    assert f"(warmenv {given[1]} ... {given[0]})" in line
    assert files_under(root) == before  # nothing purged, nothing imported


def test_an_option_of_no_one_before_a_command_gets_the_closest(root: Path) -> None:
    line = assert_one_error_line(warmenv("--nmespace", "app", "purge", root=root), 2)
    assert "--nmespace is an option of neither warmenv nor purge; did you mean '--namespace'?" in (
        line
    )


# --- 3. the demo refuses an unwritable root before any line, naming only --root ---------


def test_the_demo_refuses_an_unwritable_root_before_its_first_line(shared_tmp: Path) -> None:
    locked = shared_tmp / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    child = run_python(CLI, "demo", "--root", str(locked), user=unprivileged_user())
    line = assert_one_error_line(child, 1)
    assert child.stdout == ""  # no "1. cold start ..." over a refusal
    assert line.endswith(
        f"(environments live in the root {locked}: choose a root you can write with --root DIR)\n"
    )
    assert "WARMENV_ROOT" not in line and "warmenv.toml" not in line  # demo reads neither


# --- 4. a root that cannot be created is named -------------------------------------------

_NO_HOME = textwrap.dedent(
    """
    import os, sys
    os.environ["HOME"] = "/nonexistent"
    for name in ("XDG_CACHE_HOME", "WARMENV_ROOT", "WARMENV_ENVIRONMENT"):
        os.environ.pop(name, None)
    from warmenv.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_a_root_under_a_missing_home_is_named_as_the_root_that_cannot_be_created(
    shipped: Path,
) -> None:
    child = run_python(_NO_HOME, "import", str(shipped), "--env", "x", user=unprivileged_user())
    line = assert_one_error_line(child, 1)
    assert "cannot create its root /nonexistent/.cache/warmenv (" in line, line
    assert "(choose a root you can write with --root DIR, the WARMENV_ROOT variable" in line


def test_ls_of_a_root_behind_a_private_directory_names_the_directory(shared_tmp: Path) -> None:
    private = shared_tmp / "private"
    private.mkdir()
    private.chmod(0o700)  # as /root is: nobody may not even look inside
    child = run_python(CLI, "ls", "--root", str(private / "x"), user=unprivileged_user())
    line = assert_one_error_line(child, 1)
    assert line == (
        f"warmenv: error: cannot read {private / 'x'}: {private} is not searchable by this "
        "process\n"
    )


# --- 5. a name that reads as a file -------------------------------------------------------


def test_an_environment_name_ending_in_db_is_refused_with_the_name_meant(
    root: Path, shipped: Path
) -> None:
    before = files_under(root)
    line = assert_one_error_line(warmenv("import", str(shipped), "--env", "x.db", root=root), 2)
    assert "invalid environment name 'x.db': it names an environment's file (.db)" in line
    assert "give 'x'" in line
    assert files_under(root) == before  # no x.db.db


@pytest.mark.parametrize(
    ("arguments", "meant"),
    [
        (["ls", "h100.bundle"], "to see what it holds: `warmenv inspect h100.bundle`"),
        (["stats", "--env", "h100.bundle"], "to see what it holds: `warmenv inspect h100.bundle`"),
        (
            ["import", "{bundle}", "--env", "h100.bundle"],
            "to import it, give it as the BUNDLE: `warmenv import h100.bundle --env NAME`",
        ),
    ],
)
def test_a_bundle_name_given_as_an_environment_gets_the_command_that_fits(
    root: Path, shipped: Path, arguments: list[str], meant: str
) -> None:
    given = [a.format(bundle=shipped) for a in arguments]
    line = assert_one_error_line(warmenv(*given, root=root), 2)
    assert line.rstrip().endswith(f"; {meant} (see 'warmenv {given[0]} --help')"), line
    assert line.count("`warmenv import") + line.count("`warmenv inspect") == 1, line


def test_a_bundle_name_in_the_environment_variable_is_said_once(root: Path) -> None:
    completed = warmenv("ls", root=root, env={"WARMENV_ENVIRONMENT": "h100.bundle"})
    line = assert_one_error_line(completed, 1)
    assert "'h100.bundle' is not an environment name; it names a bundle file" in line
    assert line.count("not an environment") == 1, line


def test_the_library_says_a_bundle_name_in_its_own_terms(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_environment("h100.bundle", root=tmp_path):
            pass

    with pytest.raises(ValueError, match="invalid environment name") as raised:
        anyio.run(main)
    assert "warmenv import" not in str(raised.value) and "`" not in str(raised.value)
    assert "warmenv.bundle.import_bundle" in str(raised.value)


# --- 6. ls of a root that does not exist, and of one without the default -----------------


def test_ls_of_a_root_that_does_not_exist_says_so_and_succeeds(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "x"
    completed = warmenv("ls", root=missing)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"no environments: the root {missing} does not exist yet")
    assert "default" not in completed.stdout
    assert json.loads(warmenv("ls", "--json", root=missing).stdout)["root_exists"] is False
    assert not missing.parent.exists()


def test_ls_of_an_empty_root_says_only_that_it_holds_none(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    completed = warmenv("ls", root=tmp_path / "r")
    assert (completed.returncode, completed.stdout) == (0, f"no environments in {tmp_path / 'r'}\n")


def test_ls_without_the_default_environment_names_it_as_the_default(root: Path) -> None:
    completed = warmenv("ls", root=root)
    assert completed.returncode == 0, completed.stderr
    assert f"no environment named 'default' (the default) in {root}" in completed.stdout


# --- 7. explain's wording -------------------------------------------------------------------


def test_explain_of_a_name_alone_says_it_has_no_version_or_path(root: Path) -> None:
    completed = warmenv("explain", "app", "--env", "quickstart", root=root)
    assert completed.returncode == 0, completed.stderr
    assert "instead of ''" not in completed.stdout, completed.stdout
    assert (
        "- 'app/1/kernels': version '1', path 'kernels' ('app' has no version or path segment)"
        in completed.stdout
    )


def test_explain_swapped_counts_one_entry_in_the_singular(tmp_path: Path) -> None:
    async def make() -> None:
        async with open_environment("e", root=tmp_path) as env:
            await env.storage(Namespace("app", "k", version="1")).insert_many([(b"k", b"v")])

    anyio.run(make)
    completed = warmenv("explain", "k1", "app/1/k", "--env", "e", "--json", root=tmp_path)
    assert "KEY 'app/1/k' is a namespace here (1 entry)" in json.loads(completed.stdout)["hint"]


# --- 8. bare warmenv, and warmenv help ---------------------------------------------------------


def test_bare_warmenv_lists_the_commands(tmp_path: Path) -> None:
    line = assert_one_error_line(warmenv(root=None), 2)
    assert "the following arguments are required: COMMAND; give one of: demo, ls, stats," in line


@pytest.mark.parametrize(
    ("arguments", "shows"), [([], "COMMAND ...\n"), (["ls"], "usage: warmenv ls")]
)
def test_warmenv_help_is_warmenv_help_option(arguments: list[str], shows: str) -> None:
    completed = warmenv("help", *arguments, root=None)
    assert completed.returncode == 0, completed.stderr
    assert shows in completed.stdout
    assert completed.stdout == warmenv(*arguments, "--help", root=None).stdout


# --- 9. did you mean ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "suggestion"),
    [
        (["run", "--cache", "jaxx", "--", "true"], "; did you mean 'jax'?"),
        (["purge", "--nmespace", "app", "--env", "quickstart"], "; did you mean '--namespace'?"),
        (["LS"], "; did you mean 'ls'?"),
        (["check", "{bundle}", "1.0"], "; did you mean --app-version 1.0?"),
    ],
)
def test_a_typo_gets_the_closest(
    root: Path, shipped: Path, arguments: list[str], suggestion: str
) -> None:
    before = files_under(root)
    given = [a.format(bundle=shipped) for a in arguments]
    line = assert_one_error_line(warmenv(*given, root=root), 2)
    assert suggestion in line, line
    assert files_under(root) == before
