"""The fresh-clone review of the command line: each finding, pinned in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

import test_cli
from test_cli import TOTAL, first_progress_line, run_raw, warmenv
from test_cli_errors import assert_one_error_line, files_under
from test_cli_signals import BACKENDS, SIGNALS, digest
from warmenv import open_environment
from warmenv.persistence import Store

# The fixtures these tests share with test_cli.py.
warm_root = test_cli.warm_root
bundle = test_cli.bundle


def export_args(out: Path, *extra: str) -> list[str]:
    return ["export", str(out), "--name", "n", "--app-version", "1", "--env", "warm", *extra]


# --- 1. ls without --env ------------------------------------------------------------


def test_ls_without_a_default_environment_lists_the_others(warm_root: Path) -> None:
    completed = warmenv("ls", root=warm_root)
    assert completed.returncode == 0, completed.stderr
    assert "warm" in completed.stdout
    assert "no environment named 'default' (the default)" in completed.stdout
    document = json.loads(warmenv("ls", "--json", root=warm_root).stdout)
    assert [e["name"] for e in document["environments"]] == ["warm"]
    assert document["environment"] is None and document["namespaces"] is None


def test_ls_of_an_empty_root_says_there_are_no_environments(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    completed = warmenv("ls", root=tmp_path / "r")
    assert completed.returncode == 0, completed.stderr
    assert "no environments in" in completed.stdout
    assert "file size" not in completed.stdout  # no table headers over nothing


# --- 2. a root that is a regular file -------------------------------------------------


@pytest.mark.parametrize("command", ["ls", "export", "purge"])
def test_a_root_that_is_a_file_is_not_a_directory(tmp_path: Path, command: str) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    args = {
        "ls": ["ls"],
        "export": ["export", str(tmp_path / "o.bundle"), "--name", "n", "--app-version", "1"],
        "purge": ["purge", "--yes"],
    }[command]
    completed = warmenv(*args, root=None, env={"WARMENV_ROOT": str(a_file)})
    line = assert_one_error_line(completed, 1)
    assert f"{a_file} is not a directory" in line
    assert "does not exist" not in line


# --- 3. --namespace that matches nothing ------------------------------------------------


def test_export_of_a_namespace_that_matches_nothing_fails_and_leaves_out_alone(
    warm_root: Path, tmp_path: Path, bundle: Path
) -> None:
    before = digest(bundle)
    completed = warmenv(*export_args(bundle, "--namespace", "nothing/here"), root=warm_root)
    line = assert_one_error_line(completed, 1)
    assert "no namespace matches 'nothing/here'" in line
    assert digest(bundle) == before
    assert sorted(p.name for p in bundle.parent.iterdir() if p.name.startswith(".")) == []


def test_export_of_a_namespace_that_matches_nothing_writes_no_new_file(
    warm_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "new.bundle"
    completed = warmenv(*export_args(out, "--namespace", "nothing"), root=warm_root)
    assert "no namespace matches 'nothing'" in assert_one_error_line(completed, 1)
    assert not out.exists()


def test_import_of_a_namespace_that_matches_nothing_fails_and_creates_nothing(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "fresh"
    completed = warmenv("import", str(bundle), "--namespace", "nothing", root=root)
    assert "no namespace matches 'nothing'" in assert_one_error_line(completed, 1)
    assert not root.exists()


def test_purge_of_a_namespace_that_matches_nothing_says_so(warm_root: Path) -> None:
    completed = warmenv("purge", "--env", "warm", "--namespace", "nothing", "--yes", root=warm_root)
    assert "no namespace matches 'nothing'" in assert_one_error_line(completed, 1)


@pytest.mark.parametrize("command", ["export", "import", "purge"])
def test_an_empty_namespace_prefix_is_bad_usage(
    warm_root: Path, bundle: Path, tmp_path: Path, command: str
) -> None:
    args = {
        "export": export_args(tmp_path / "o.bundle"),
        "import": ["import", str(bundle), "--env", "warm"],
        "purge": ["purge", "--env", "warm", "--yes"],
    }[command]
    before = files_under(warm_root)
    completed = warmenv(*args, "--namespace", "", root=warm_root)
    assert "--namespace must not be empty" in assert_one_error_line(completed, 2)
    assert files_under(warm_root) == before


# --- 4. a signal while the export's last step runs ---------------------------------------

# The export's last step (publishing the bundle) cannot be interrupted; this
# child sends itself the signal once the export has completed, and waits
# (shielded, so nothing is cancelled) until the command has seen it: exactly a
# signal that arrives in the last moments.
LATE_SIGNAL = textwrap.dedent(
    """
    import os, signal, sys
    import anyio
    import warmenv.cli.export as export
    from warmenv.cli import main

    real = export._export

    async def late(args, out, *rest):
        report = await real(args, out, *rest)
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        with anyio.CancelScope(shield=True):
            while not out.stopped:
                await anyio.lowlevel.checkpoint()
        return report

    export._export = late
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_a_signal_as_the_export_completes_exits_with_its_status_and_says_it_is_published(
    warm_root: Path, tmp_path: Path, name: str, backend: str
) -> None:
    out = tmp_path / "late.bundle"
    completed = subprocess.run(
        [sys.executable, "-c", LATE_SIGNAL, name, *export_args(out), "--root", str(warm_root)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WARMENV_CLI_BACKEND": backend},
    )
    line = assert_one_error_line(completed, SIGNALS[name])
    assert f"the export had completed: {out} is published" in line
    verified = warmenv("verify", str(out), root=tmp_path)
    assert verified.returncode == 0, verified.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_with_json_a_signal_as_the_export_completes_is_one_document_with_result_and_error(
    warm_root: Path, tmp_path: Path, backend: str
) -> None:
    # stdout held the export's report and then a second document, the error's.
    out = tmp_path / "late.bundle"
    arguments = export_args(out, "--json", "--root", str(warm_root))
    completed = subprocess.run(
        [sys.executable, "-c", LATE_SIGNAL, "SIGTERM", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WARMENV_CLI_BACKEND": backend},
    )
    assert completed.returncode == SIGNALS["SIGTERM"], completed.stderr
    document = json.loads(completed.stdout)  # the whole of stdout, one document
    assert document["exit"] == SIGNALS["SIGTERM"]
    assert f"the export had completed: {out} is published" in document["error"]
    assert document["entries"] == TOTAL and document["path"] == str(out)


# --- 5. --name blank or with control characters -------------------------------------------


@pytest.mark.parametrize("name", ["   ", "\t", "tab\there", "bell\x07", "esc\x1b[2J", "nl\nx"])
def test_a_blank_name_or_one_with_control_characters_is_bad_usage(
    warm_root: Path, tmp_path: Path, name: str
) -> None:
    out = tmp_path / "o.bundle"
    completed = warmenv(
        "export", str(out), "--name", name, "--app-version", "1", "--env", "warm", root=warm_root
    )
    assert "--name" in assert_one_error_line(completed, 2)
    assert list(tmp_path.iterdir()) == [warm_root]


@pytest.mark.parametrize("version", ["1\n2", "1\x1b[2J", "1\u202e2", "1\x9b"])
def test_an_app_version_with_control_characters_is_bad_usage(
    warm_root: Path, tmp_path: Path, version: str
) -> None:
    out = tmp_path / "o.bundle"
    completed = warmenv(
        "export", str(out), "--name", "n", "--app-version", version, "--env", "warm", root=warm_root
    )
    assert "--app-version" in assert_one_error_line(completed, 2)
    assert list(tmp_path.iterdir()) == [warm_root]


# --- 6. check --json carries the digest reason ------------------------------------------------


def test_check_json_says_the_content_matches_its_digest(bundle: Path, tmp_path: Path) -> None:
    completed = warmenv("check", str(bundle), "--json", root=tmp_path)
    document = json.loads(completed.stdout)
    assert f"its content matches its digest ({TOTAL} entries)" in document["reasons"]
    assert document["digest_matches"] is True


# --- 7. stdout closed during import ---------------------------------------------------------


def test_a_closed_stdout_during_import_says_where_the_import_stopped(
    tmp_path: Path,
) -> None:
    root = tmp_path / "r"

    async def fill() -> None:
        async with open_environment("src", root=root) as env:
            await env.storage("app/1/big").insert_many(
                (b"%08d" % i, b"v" * 64) for i in range(200_000)
            )

    anyio.run(fill)
    shipped = tmp_path / "big.bundle"
    completed = warmenv(
        "export", str(shipped), "--name", "n", "--app-version", "1", "--env", "src", root=root
    )
    assert completed.returncode == 0, completed.stderr
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warmenv",
            "import",
            str(shipped),
            "--env",
            "dst",
            "--root",
            str(root),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    first_progress_line(process.stdout)  # the import is under way
    process.stdout.close()
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=120) == 1
    assert err.count("\n") == 1, err
    assert err.startswith("warmenv: error: output closed: the import stopped after ")
    assert "entries" in err or "entry" in err


# --- 8. check --app-version -------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--app-version", "--version"])
def test_check_accepts_app_version_and_its_alias(bundle: Path, tmp_path: Path, option: str) -> None:
    completed = warmenv("check", str(bundle), option, "1", "--json", root=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["ok"] is True


def test_check_with_another_app_version_will_not_hit(bundle: Path, tmp_path: Path) -> None:
    completed = warmenv("check", str(bundle), "--app-version", "2", root=tmp_path)
    assert completed.returncode == 1


# --- 9. an environment file that is not a regular file --------------------------------------


def test_import_into_an_environment_that_is_a_fifo_says_so_in_one_sentence(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "r"
    root.mkdir()
    os.mkfifo(root / "f.db")
    completed = warmenv("import", str(bundle), "--env", "f", root=root)
    line = assert_one_error_line(completed, 1)
    assert line == (
        f"warmenv: error: cannot write environment 'f': {root / 'f.db'} is a FIFO, not a "
        f"database file; nothing would persist, so nothing was done (move {root / 'f.db'} "
        "away, or choose another --env)\n"
    )


def test_import_into_an_environment_that_is_a_directory_says_so(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "r"
    (root / "d.db").mkdir(parents=True)
    completed = warmenv("import", str(bundle), "--env", "d", root=root)
    assert "is a directory, not a database file" in assert_one_error_line(completed, 1)


# --- 10. one escaping for bytes that are not UTF-8 -----------------------------------------


def test_a_bad_format_and_a_bad_env_name_escape_bytes_alike(tmp_path: Path) -> None:
    bad_format = run_raw("export", "o", "--name", "n", "--app-version", "1", "--format", b"\xff")
    bad_env = run_raw("ls", "--env", b"\xff", "--root", str(tmp_path))
    for completed in (bad_format, bad_env):
        assert completed.returncode == 2
        assert b"'\\xff'" in completed.stderr, completed.stderr
        assert b"udcff" not in completed.stderr


# --- C. help, empty tables, plurals, --quiet ------------------------------------------------


def _commands() -> list[str]:
    from warmenv.cli import _COMMANDS

    return [c.__name__.rsplit(".", 1)[1] for c in _COMMANDS]


def test_every_command_and_argument_has_help() -> None:
    import argparse

    from warmenv.cli import build_parser

    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(commands.choices) == len(_commands())
    for name, sub in commands.choices.items():
        assert sub.description, f"{name} has no description"
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_plurals_are_right_for_one(tmp_path: Path) -> None:
    root = tmp_path / "r"

    async def fill() -> None:
        async with open_environment("one", root=root) as env:
            await env.storage("app/1/x").insert(b"k", b"v")

    anyio.run(fill)
    listed = warmenv("ls", "--env", "one", root=root)
    assert "1 namespace, 1 entry in 'one'" in listed.stdout
    out = tmp_path / "one.bundle"
    exported = warmenv(
        "export", str(out), "--name", "n", "--app-version", "1", "--env", "one", root=root
    )
    assert "exported 1 entry (" in exported.stdout and " in 1 namespace to " in exported.stdout
    purged = warmenv("purge", "--env", "one", "--yes", root=root)
    assert "deleted 1 entry in 1 namespace" in purged.stdout


def test_an_empty_environment_says_so_instead_of_printing_headers(tmp_path: Path) -> None:
    root = tmp_path / "r"

    async def make() -> None:
        async with open_environment("empty", root=root):
            pass

    anyio.run(make)
    completed = warmenv("ls", "--env", "empty", root=root)
    assert "environment 'empty' holds no entries yet" in completed.stdout
    assert "namespace  entries" not in completed.stdout


@pytest.mark.parametrize("option", ["--quiet", "-q"])
def test_quiet_prints_nothing_but_still_does_the_work(
    warm_root: Path, tmp_path: Path, option: str
) -> None:
    out = tmp_path / "q.bundle"
    completed = warmenv(*export_args(out), option, root=warm_root)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "" and completed.stderr == ""
    assert out.is_file()
    listed = warmenv("ls", "--env", "warm", option, root=warm_root)
    assert listed.returncode == 0 and listed.stdout == ""


def test_quiet_still_reports_errors(tmp_path: Path) -> None:
    completed = warmenv("verify", str(tmp_path / "missing.bundle"), "--quiet", root=tmp_path)
    assert_one_error_line(completed, 1)


# --- B. warmenv explain ----------------------------------------------------------------------


@pytest.fixture
def versions_root(tmp_path: Path) -> Path:
    root = tmp_path / "v"

    async def fill() -> None:
        async with open_environment("e", root=root) as env:
            store: Store[str, int] = await env.store("app/1/kernels")
            await store.insert("k1", 1)
            await store.insert("k2", 2)
            tuned: Store[str, int] = await env.store("app/2/tuned")
            await tuned.insert("k9", 9)

    anyio.run(fill)
    return root


@pytest.mark.parametrize("backend", BACKENDS)
def test_explain_prints_the_namespaces_nearby(versions_root: Path, backend: str) -> None:
    completed = warmenv(
        "explain",
        "app/2/kernels",
        "k1",
        "--env",
        "e",
        root=versions_root,
        env={"WARMENV_CLI_BACKEND": backend},
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("namespace 'app/2/kernels' holds no entries, so key \"k1\" misses")
    assert lines[1] == "  - 'app/1/kernels': version '1' instead of '2'; 2 entries; holds the key"
    assert lines[2] == "  - 'app/2/tuned': path 'tuned' instead of 'kernels'; 1 entry; not the key"


def test_explain_json_lists_the_namespaces_nearby(versions_root: Path) -> None:
    completed = warmenv(
        "explain", "app/2/kernels", "k1", "--env", "e", "--json", root=versions_root
    )
    document = json.loads(completed.stdout)
    assert document["key"] == '"k1"'
    assert document["has_key"] is False
    assert document["nearby"] == [
        {"namespace": "app/1/kernels", "differs": ["version"], "entries": 2, "has_key": True},
        {"namespace": "app/2/tuned", "differs": ["path"], "entries": 1, "has_key": False},
    ]


def test_explain_takes_a_raw_key(versions_root: Path) -> None:
    completed = warmenv(
        "explain", "app/2/kernels", '"k2"', "--raw-key", "--env", "e", "--json", root=versions_root
    )
    assert json.loads(completed.stdout)["nearby"][0]["has_key"] is True


def test_explain_finds_an_integer_or_tuple_key_by_its_json_with_raw_key(tmp_path: Path) -> None:
    root = tmp_path / "ints"

    async def fill() -> None:
        async with open_environment("e", root=root) as env:
            store: Store[object, str] = await env.store("app/1/kernels")
            await store.insert(42, "x")
            await store.insert(("matmul", 4096), "y")

    anyio.run(fill)

    def has_key(*args: str) -> bool:
        completed = warmenv("explain", "app/2/kernels", *args, "--env", "e", "--json", root=root)
        assert completed.returncode == 0, completed.stderr
        (nearby,) = json.loads(completed.stdout)["nearby"]
        return bool(nearby["has_key"])

    assert not has_key("42")  # the string "42"
    assert has_key("42", "--raw-key")
    assert has_key('["matmul",4096]', "--raw-key")


def test_explain_of_a_missing_environment_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "none"
    completed = warmenv("explain", "app/1/x", "--env", "nope", root=root)
    assert "no environment 'nope'" in assert_one_error_line(completed, 1)
    assert not root.exists()


def test_explain_of_an_empty_namespace_is_bad_usage(versions_root: Path) -> None:
    completed = warmenv("explain", "/", "--env", "e", root=versions_root)
    assert_one_error_line(completed, 2)


def test_explain_escapes_what_the_environment_holds(tmp_path: Path) -> None:
    root = tmp_path / "r"

    async def fill() -> None:
        async with open_environment("e", root=root) as env:
            await env.storage("app/1/\x1b[2Jevil").insert(b"k", b"v")

    anyio.run(fill)
    completed = run_raw("explain", "app/2/\x1b[2Jevil", "--env", "e", "--root", str(root))
    assert completed.returncode == 0, completed.stderr
    assert b"\x1b" not in completed.stdout
    assert b"\\x1b[2Jevil" in completed.stdout


def test_explain_misses_logged_by_a_real_process(versions_root: Path) -> None:
    script = textwrap.dedent(
        """
        import logging, sys
        import anyio
        from warmenv import open_environment

        logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")

        async def main():
            async with open_environment("e", root=sys.argv[1]) as env:
                store = await env.store("app/2/kernels")
                await store.get("k1")
                await store.get("k2")

        anyio.run(main)
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script, str(versions_root)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "WARMENV_EXPLAIN_MISSES": "1"},
    )
    assert completed.returncode == 0, completed.stderr
    logged = [line for line in completed.stderr.splitlines() if line.startswith("warmenv.explain")]
    assert len(logged) == 1
    assert logged[0].startswith("warmenv.explain INFO first miss in ")
    assert "'app/1/kernels': version '1' instead of '2'" in completed.stderr
