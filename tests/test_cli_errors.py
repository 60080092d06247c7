"""Every way a command can fail: one line, the documented exit status, nothing left behind.

Run as users run it, in a child process: bad arguments (exit 2, before any
work), files that cannot be written (exit 1, naming the file), environments
that cannot persist an import, read-only commands that must create nothing,
bundles that fail their digest, and the JSON error object for scripts.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import test_cli
from conftest import KERNELS
from helpers import one_trial, run_python, unprivileged_user
from test_cli import TOTAL, run_raw, warmenv
from test_config import _UNREADABLE_SETTINGS
from test_redirected_roots import _planted
from warmenv import open_environment

# The fixtures these tests share with test_cli.py.
warm_root = test_cli.warm_root
bundle = test_cli.bundle
big_flat_bundle = test_cli.big_flat_bundle

CLI = "import sys; from warmenv.cli import main; sys.exit(main(sys.argv[1:]))"


def files_under(path: Path) -> set[str]:
    """Every file and directory below `path` (to prove a command created nothing)."""
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def assert_one_error_line(completed: subprocess.CompletedProcess[str], status: int) -> str:
    assert completed.returncode == status, (completed.stdout, completed.stderr)
    assert "Traceback" not in completed.stderr
    assert completed.stderr.startswith("warmenv: error: "), completed.stderr
    assert completed.stderr.count("\n") == 1, completed.stderr
    return completed.stderr


def tampered(bundle: Path) -> Path:
    """`bundle` with one value changed behind its digest's back."""
    with sqlite3.connect(bundle) as conn:
        conn.execute("UPDATE entries SET value = x'00' WHERE key = ?", (b"k001",))
    conn.close()
    return bundle


# --- bad usage: exit 2, before any work -------------------------------------------


def test_an_empty_bundle_name_is_bad_usage_and_writes_nothing(
    warm_root: Path, tmp_path: Path
) -> None:
    before = files_under(tmp_path)
    completed = warmenv(
        "export", str(tmp_path / "b.bundle"), "--name", "", "--app-version", "1", root=warm_root
    )
    assert "--name must not be empty" in assert_one_error_line(completed, 2)
    assert files_under(tmp_path) == before


def test_a_bundle_name_that_is_not_utf8_is_bad_usage_before_any_work(
    warm_root: Path, tmp_path: Path
) -> None:
    before = files_under(tmp_path)
    completed = run_raw(
        "export",
        str(tmp_path / "b.bundle"),
        "--name",
        b"H100 \xff\xfe",
        "--app-version",
        "1",
        "--env",
        "warm",
        "--root",
        str(warm_root),
    )
    assert completed.returncode == 2
    assert completed.stdout == b""  # no progress: refused before the export started
    assert (
        completed.stderr == b"warmenv: error: export: --name H100 \\xff\\xfe is not valid UTF-8 "
        b"text; spell it in UTF-8 (see 'warmenv export --help')\n"
    )
    assert files_under(tmp_path) == before


def test_a_namespace_prefix_that_is_not_utf8_is_bad_usage(bundle: Path, tmp_path: Path) -> None:
    completed = run_raw(
        "import", str(bundle), "--namespace", b"app\xff", "--root", str(tmp_path / "r")
    )
    assert completed.returncode == 2
    assert completed.stderr.count(b"\n") == 1
    assert b"Traceback" not in completed.stderr
    assert not (tmp_path / "r").exists()


def test_a_usage_error_is_one_line(tmp_path: Path) -> None:
    completed = warmenv("export", "out.bundle", root=tmp_path)
    assert "--name" in assert_one_error_line(completed, 2)


def test_an_unknown_backend_is_bad_usage(tmp_path: Path) -> None:
    completed = warmenv("ls", root=tmp_path, env={"WARMENV_CLI_BACKEND": "curio"})
    assert "WARMENV_CLI_BACKEND" in assert_one_error_line(completed, 2)


# --- --json: the error is a JSON object as well -----------------------------------


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["inspect", "/nonexistent/missing.bundle"], 1),
        (["export", "out.bundle"], 2),
        (["ls", "--env", "bad name"], 2),
        (["ls", "--env", "typo"], 1),
    ],
)
def test_with_json_an_error_is_also_a_json_object_on_stdout(
    args: list[str], status: int, tmp_path: Path
) -> None:
    completed = warmenv(*args, "--json", root=tmp_path)
    line = assert_one_error_line(completed, status)
    document = json.loads(completed.stdout)
    assert document == {"error": line.removeprefix("warmenv: error: ").rstrip("\n"), "exit": status}


def test_with_json_a_failed_check_carries_the_report_and_the_error(
    bundle: Path, tmp_path: Path
) -> None:
    completed = warmenv("check", str(bundle), "--version", "9", "--json", root=tmp_path)
    assert_one_error_line(completed, 1)
    document = json.loads(completed.stdout)
    assert document["exit"] == 1
    assert "will not hit" in document["error"]
    assert document["ok"] is False


# --- files that cannot be written: exit 1, one line naming the file ----------------


@pytest.mark.parametrize("form", ["sqlite", "flat"])
def test_export_into_an_unwritable_directory_fails_in_one_line(shared_tmp: Path, form: str) -> None:
    source = shared_tmp / "source"
    _fill(source)
    locked = shared_tmp / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    out = locked / "out.bundle"
    child = run_python(
        CLI,
        "export",
        str(out),
        str(source / "warm.db"),
        "--name",
        "n",
        "--app-version",
        "1",
        "--format",
        form,
        "--root",
        str(shared_tmp / "r"),
        user=unprivileged_user(),
    )
    line = assert_one_error_line(child, 1)
    assert str(locked) in line
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("form", ["sqlite", "flat"])
def test_export_from_an_environment_in_a_read_only_directory_reads_it_and_leaves_it_alone(
    shared_tmp: Path, form: str
) -> None:
    # Neither read-write nor read-only can make the -shm file there: only immutable reads it.
    source = shared_tmp / "source"
    _fill(source)
    out = shared_tmp / "out"
    out.mkdir()
    out.chmod(0o777)
    child = run_python(
        CLI,
        *("export", str(out / "b.bundle"), str(source / "warm.db"), "--name", "n"),
        *("--app-version", "1", "--format", form, "--root", str(shared_tmp / "r")),
        user=unprivileged_user(),
    )
    assert child.returncode == 0, child.stderr
    assert (out / "b.bundle").is_file()
    assert sorted(p.name for p in source.iterdir()) == ["warm.db"]


@pytest.mark.parametrize("form", ["sqlite", "flat"])
def test_export_past_the_file_size_limit_fails_in_one_line(tmp_path: Path, form: str) -> None:
    # A file-size limit makes writes fail as a full disk does, without a disk to fill.
    source = tmp_path / "source"
    _fill(source, values=4000)

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

    out = tmp_path / "out" / "b.bundle"
    out.parent.mkdir()
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "warmenv", "export", str(out), str(source / "warm.db")),
            *("--name", "n", "--app-version", "1", "--format", form, "--root", str(tmp_path / "r")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limited,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    line = assert_one_error_line(completed, 1)
    assert "out" in line
    assert list(out.parent.iterdir()) == []  # no bundle, no staging file


def _fill(root: Path, values: int = 10) -> None:
    async def fill() -> None:
        async with open_environment("warm", root=root) as env:
            await env.storage(KERNELS).insert_many((b"%06d" % i, b"v" * 512) for i in range(values))

    anyio.run(fill)
    for path in [root, *root.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)


# --- import into an environment that cannot persist: exit 1, and why ---------------


@pytest.mark.parametrize("json_mode", [False, True], ids=["plain", "json"])
def test_import_into_a_root_that_is_a_file_fails_and_says_why(
    bundle: Path, tmp_path: Path, json_mode: bool
) -> None:
    a_file = tmp_path / "not-a-directory"
    a_file.write_text("")
    completed = warmenv(
        "import",
        str(bundle),
        *(["--json"] if json_mode else []),
        root=None,
        env={"WARMENV_ROOT": str(a_file)},
    )
    line = assert_one_error_line(completed, 1)
    assert "not a directory" in line
    assert "nothing" in line
    assert "imported" not in completed.stdout.replace("nothing was imported", "")
    if json_mode:
        assert json.loads(completed.stdout)["exit"] == 1


def test_import_into_an_unwritable_directory_fails_and_says_why(
    warm_root: Path, shared_tmp: Path
) -> None:
    shipped = shared_tmp / "warm.bundle"
    completed = warmenv(
        "export", str(shipped), "--name", "n", "--app-version", "1", "--env", "warm", root=warm_root
    )
    assert completed.returncode == 0, completed.stderr
    shipped.chmod(0o644)
    root = shared_tmp / "locked"
    root.mkdir()
    root.chmod(0o555)
    child = run_python(
        CLI, "import", str(shipped), "--env", "e", "--root", str(root), user=unprivileged_user()
    )
    line = assert_one_error_line(child, 1)
    assert line == (
        f"warmenv: error: cannot write environment 'e': {root} is not writable by this "
        f"process; nothing would persist, so nothing was done (environments live in the root "
        f"{root}: choose a root you can write with --root DIR, the WARMENV_ROOT variable, or "
        "root in warmenv.toml ([tool.warmenv] in pyproject.toml))\n"
    )
    assert list(root.iterdir()) == []


def test_import_into_a_read_only_environment_fails_and_says_why(
    warm_root: Path, shared_tmp: Path
) -> None:
    shipped = shared_tmp / "warm.bundle"
    completed = warmenv(
        "export", str(shipped), "--name", "n", "--app-version", "1", "--env", "warm", root=warm_root
    )
    assert completed.returncode == 0, completed.stderr
    shipped.chmod(0o644)
    root = shared_tmp / "ro"
    _fill(root)
    (root / "warm.db").chmod(0o444)
    root.chmod(0o555)
    child = run_python(
        CLI,
        "import",
        str(shipped),
        "--env",
        "warm",
        "--root",
        str(root),
        "--json",
        user=unprivileged_user(),
    )
    line = assert_one_error_line(child, 1)
    assert "read-only" in line
    assert json.loads(child.stdout)["exit"] == 1


def _read_only_file_in_a_writable_directory(shared_tmp: Path) -> Path:
    """An environment `warm` whose file the unprivileged user may read but not write,
    in a directory that user may write (so SQLite could create -wal and -shm there)."""
    root = shared_tmp / "writable"
    _fill(root)
    (root / "warm.db").chmod(0o444)
    root.chmod(0o1777)  # sticky: a root others may write without the bit is refused
    return root


def test_import_into_a_read_only_file_in_a_writable_directory_is_refused_up_front(
    warm_root: Path, shared_tmp: Path
) -> None:
    shipped = shared_tmp / "warm.bundle"
    completed = warmenv(
        "export", str(shipped), "--name", "n", "--app-version", "1", "--env", "warm", root=warm_root
    )
    assert completed.returncode == 0, completed.stderr
    shipped.chmod(0o644)
    root = _read_only_file_in_a_writable_directory(shared_tmp)
    child = run_python(
        CLI, "import", str(shipped), "--env", "warm", "--root", str(root), user=unprivileged_user()
    )
    line = assert_one_error_line(child, 1)
    assert "read-only" in line
    assert "not writable" in line
    assert child.stdout == ""  # refused before verifying or importing anything
    assert sorted(p.name for p in root.iterdir()) == ["warm.db"]


def test_import_into_a_writable_file_in_a_read_only_directory_names_the_directory(
    bundle: Path, shared_tmp: Path
) -> None:
    # The file may be written, its directory not (no -wal beside it): the library
    # falls back to read-only and says why; the command reads that reason, looks at
    # nothing on disk again (it used to guess "its directory is not writable" from
    # os.access, on the event loop, naming no directory).
    shipped = shared_tmp / "warm.bundle"
    shipped.write_bytes(bundle.read_bytes())
    shipped.chmod(0o644)
    root = shared_tmp / "ro"
    _fill(root)
    (root / "warm.db").chmod(0o666)
    root.chmod(0o555)
    child = run_python(
        CLI, "import", str(shipped), "--env", "warm", "--root", str(root), user=unprivileged_user()
    )
    line = assert_one_error_line(child, 1)
    assert line.startswith(
        f"warmenv: error: environment 'warm' is read-only: opening {root / 'warm.db'} for "
        "writing failed: "
    ), line
    assert line.endswith(
        f" (its directory {root} is not writable by this process); nothing was done\n"
    ), line
    assert sorted(p.name for p in root.iterdir()) == ["warm.db"]
    listed = run_python(CLI, "ls", "--env", "warm", "--root", str(root), user=unprivileged_user())
    assert listed.returncode == 0, listed.stderr  # reading it is what read-only is for
    assert "app/1/kernels" in listed.stdout


def test_import_into_a_bundle_named_as_an_environment_says_it_is_a_bundle(
    bundle: Path, tmp_path: Path
) -> None:
    # Read-only because the file is a bundle, in a directory anyone may write: the
    # reason is the library's, not a guess about the directory.
    root = tmp_path / "r"
    root.mkdir()
    (root / "b.db").write_bytes(bundle.read_bytes())
    completed = warmenv("import", str(bundle), "--env", "b", root=root)
    line = assert_one_error_line(completed, 1)
    assert line == (
        f"warmenv: error: environment 'b' is read-only: opening {root / 'b.db'} for writing "
        "failed: it is a bundle, not an environment: import it instead; nothing was done\n"
    )


# --- commands that only read create nothing ----------------------------------------


def test_ls_of_an_environment_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "R"
    completed = warmenv("ls", "--env", "typo", root=root)
    assert "no environment 'typo'" in assert_one_error_line(completed, 1)
    assert not root.exists()


def test_ls_of_a_misspelt_environment_names_those_that_exist(warm_root: Path) -> None:
    before = files_under(warm_root)
    completed = warmenv("ls", "--env", "wram", root=warm_root)
    line = assert_one_error_line(completed, 1)
    assert "no environment 'wram'" in line
    assert "warm" in line.replace("'wram'", "")
    assert files_under(warm_root) == before


def test_ls_of_an_existing_environment_leaves_its_directory_as_it_was(warm_root: Path) -> None:
    before = files_under(warm_root)
    completed = warmenv("ls", "--env", "warm", root=warm_root)
    assert completed.returncode == 0, completed.stderr
    assert files_under(warm_root) == before


@pytest.mark.parametrize("command", ["ls", "stats"])
def test_reading_a_read_only_file_in_a_writable_directory_creates_nothing(
    shared_tmp: Path, command: str
) -> None:
    # A mode=ro connection would make -wal and -shm files there and could not remove them.
    root = _read_only_file_in_a_writable_directory(shared_tmp)
    child = run_python(CLI, command, "--env", "warm", "--root", str(root), user=unprivileged_user())
    assert child.returncode == 0, child.stderr
    assert "app/1/kernels" in child.stdout
    assert sorted(p.name for p in root.iterdir()) == ["warm.db"]


@pytest.mark.parametrize("form", ["sqlite", "flat"])
def test_export_from_a_read_only_file_in_a_writable_directory_leaves_nothing_beside_it(
    shared_tmp: Path, form: str
) -> None:
    root = _read_only_file_in_a_writable_directory(shared_tmp)
    out = shared_tmp / "out"
    out.mkdir()
    out.chmod(0o777)
    child = run_python(
        CLI,
        *("export", str(out / "b.bundle"), str(root / "warm.db"), "--name", "n"),
        *("--app-version", "1", "--format", form, "--root", str(shared_tmp / "r")),
        user=unprivileged_user(),
    )
    assert child.returncode == 0, child.stderr
    assert (out / "b.bundle").is_file()
    assert sorted(p.name for p in root.iterdir()) == ["warm.db"]


@pytest.mark.parametrize("command", ["inspect", "verify", "check"])
@pytest.mark.parametrize("which", ["sound", "tampered", "missing"])
def test_commands_that_read_a_bundle_create_nothing(
    bundle: Path, tmp_path: Path, command: str, which: str
) -> None:
    target = {"sound": bundle, "tampered": bundle, "missing": tmp_path / "gone"}[which]
    if which == "tampered":
        tampered(bundle)
    before = files_under(tmp_path)
    completed = warmenv(command, str(target), root=tmp_path / "R")
    fails = which == "missing" or (which == "tampered" and command != "inspect")
    assert completed.returncode == (1 if fails else 0), completed.stderr
    assert "Traceback" not in completed.stderr
    assert files_under(tmp_path) == before
    assert not Path(os.environ["WARMENV_ROOT"]).exists()


@pytest.mark.parametrize("which", ["tampered", "missing", "not-a-bundle"])
def test_a_failing_import_leaves_no_environment_behind(
    bundle: Path, tmp_path: Path, which: str
) -> None:
    junk = tmp_path / "junk.bundle"
    junk.write_bytes(b"not a bundle at all")
    target = {"tampered": bundle, "missing": tmp_path / "gone", "not-a-bundle": junk}
    if which == "tampered":
        tampered(bundle)
    root = tmp_path / "new" / "root"
    completed = warmenv("import", str(target[which]), "--env", "fresh", root=root)
    assert_one_error_line(completed, 1)
    assert not (tmp_path / "new").exists()


def test_a_refused_import_leaves_a_symlink_to_a_missing_path_at_the_environment(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "target"
    root.mkdir()
    link = root / "gone.db"
    link.symlink_to(tmp_path / "elsewhere" / "gone.db")
    completed = warmenv("import", str(bundle), "--env", "gone", root=root)
    assert "is a symlink to a missing path" in assert_one_error_line(completed, 1)
    assert os.readlink(link) == str(tmp_path / "elsewhere" / "gone.db")  # not the import's
    assert files_under(root) == {"gone.db"}


def test_a_failing_import_removes_the_environment_it_made_but_no_file_it_found(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "target"
    root.mkdir()
    # A journal that was there before, of no database (its first byte 0: SQLite reads
    # it as no hot journal and leaves it alone): not the import's to remove.
    stale = root / "fresh.db-journal"
    stale.write_bytes(b"\x00 someone else's")
    completed = warmenv("import", str(tampered(bundle)), "--env", "fresh", root=root)
    assert "does not match its digest" in assert_one_error_line(completed, 1)
    assert files_under(root) == {"fresh.db-journal"}  # the environment it made is gone
    assert stale.read_bytes() == b"\x00 someone else's"


def test_a_failing_import_into_an_existing_environment_keeps_it(
    bundle: Path, warm_root: Path
) -> None:
    before = files_under(warm_root)
    completed = warmenv("import", str(tampered(bundle)), "--env", "warm", root=warm_root)
    assert_one_error_line(completed, 1)
    assert files_under(warm_root) == before
    left = json.loads(warmenv("ls", "--env", "warm", "--json", root=warm_root).stdout)
    assert sum(n["entries"] for n in left["namespaces"]) == TOTAL


def test_purge_of_an_environment_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "R"
    completed = warmenv("purge", "--env", "typo", "--yes", root=root)
    assert "no environment 'typo'" in assert_one_error_line(completed, 1)
    assert not root.exists()


def test_export_of_an_environment_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    completed = warmenv(
        "export",
        str(tmp_path / "b.bundle"),
        "--name",
        "n",
        "--app-version",
        "1",
        root=tmp_path / "R",
    )
    assert "no environment" in assert_one_error_line(completed, 1)
    assert files_under(tmp_path) == set()


# --- check runs the digest check ---------------------------------------------------


def test_check_refuses_a_bundle_that_fails_its_digest(bundle: Path, tmp_path: Path) -> None:
    completed = warmenv("check", str(tampered(bundle)), "--version", "1", root=tmp_path)
    assert "does not match its digest" in assert_one_error_line(completed, 1)
    assert "can hit" not in completed.stdout


def test_check_of_a_sound_bundle_says_its_digest_matches(bundle: Path, tmp_path: Path) -> None:
    completed = warmenv("check", str(bundle), "--version", "1", root=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "can hit" in completed.stdout
    assert f"its content matches its digest ({TOTAL} entries)" in completed.stdout


@pytest.mark.parametrize("command", ["verify", "check"])
def test_a_flat_bundle_truncated_while_it_is_checked_does_not_crash_the_command(
    big_flat_bundle: Path, tmp_path: Path, command: str
) -> None:
    # The bundle used to be read through a mapping: truncated under it, the process died
    # of SIGBUS (exit 135, no message). Now the command reads a copy of its own.
    process = subprocess.Popen(
        [sys.executable, "-m", "warmenv", command, str(big_flat_bundle)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # the digest check is under way
    assert first.startswith("verifying "), first
    os.truncate(big_flat_bundle, 64)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, (process.returncode, err)
    assert ("ok (150,000 entries" if command == "verify" else "can hit") in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "big.bundle"]


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    root = tmp_path / "r"

    async def fill() -> None:
        async with open_environment("many", root=root) as env:
            for i in range(3000):  # a table far larger than a pipe holds
                await env.storage(f"app/1/namespace-{i:05d}").insert(b"k", b"v")

    anyio.run(fill)
    process = subprocess.Popen(
        [sys.executable, "-m", "warmenv", "ls", "--env", "many", "--root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().startswith(b"environments in")
    process.stdout.close()  # `| head -1`
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=60) == 1
    assert err == b""


def test_a_read_only_environment_whose_wal_cannot_be_read_says_why_in_one_sentence(
    shared_tmp: Path,
) -> None:
    # The library's reason holds parentheses of its own: the line keeps it whole,
    # after "cannot read environment 'warm': ", not split at its last parenthesis.
    source = shared_tmp / "source"
    _fill(source)
    root = shared_tmp / "root"
    root.mkdir()
    root.chmod(0o1777)  # writable (sticky): SQLite could create a -shm here, so refused
    with sqlite3.connect(source / "warm.db") as writer:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE entries SET value = x'00'")
        writer.commit()
        for name in ("warm.db", "warm.db-wal"):  # while open: commits in the -wal, no -shm
            (root / name).write_bytes((source / name).read_bytes())
            (root / name).chmod(0o444)
    writer.close()
    child = run_python(CLI, "ls", "--env", "warm", "--root", str(root), user=unprivileged_user())
    line = assert_one_error_line(child, 1)
    db = root / "warm.db"
    assert (
        f"cannot read environment 'warm': {db}-wal holds commits not yet in {db} and there is"
        in line
    )
    assert line.endswith(
        "no -shm file (a writer stopped before checkpointing); reading it would leave a -shm "
        "file behind, so it is not read: open it once as a user who may write it\n"
    )
    assert sorted(p.name for p in root.iterdir()) == ["warm.db", "warm.db-wal"]


@pytest.mark.parametrize("backend", ["trio", "uvloop"])
def test_a_cli_backend_that_is_not_installed_is_one_line_naming_the_variable(
    backend: str,
) -> None:
    with one_trial(*_UNREADABLE_SETTINGS):
        # The backend's package hidden from the child, as on a machine without it.
        code = (
            f"import os, sys; sys.modules[{backend!r}] = None; "
            f"os.environ['WARMENV_CLI_BACKEND'] = {backend!r}; "
            "from warmenv.cli import main; sys.exit(main(['ls']))"
        )
        completed = run_python(code)
        assert completed.returncode == 2, completed.stderr
        assert completed.stderr.count("\n") == 1, completed.stderr
        assert f"WARMENV_CLI_BACKEND={backend!r} needs {backend}" in completed.stderr


@pytest.mark.parametrize("command", [["ls"], ["ls", "e"], ["stats"], ["explain", "app/k/1"]])
@pytest.mark.parametrize("mode", [0o700, 0o711, 0o744], ids=oct)
def test_a_root_the_user_cannot_read_is_said_so_never_empty(
    shared_tmp: Path, mode: int, command: list[str]
) -> None:
    # 0700: not even searchable; 0711: searchable, not listable; 0744: listable, not searchable.
    # Never "no environments" (nor "it holds no environments"): it holds `e`, unseen.
    root = shared_tmp / "root"
    root.mkdir()

    async def fill() -> None:
        async with open_environment("e", root=root):
            pass

    anyio.run(fill)
    root.chmod(mode)
    child = run_python(CLI, *command, "--root", str(root), user=unprivileged_user())
    line = assert_one_error_line(child, 1)
    assert str(root) in line
    assert "cannot read" in line or "cannot be read" in line
    assert "no environments" not in line and "holds no" not in line


@pytest.mark.parametrize(
    ("program", "status", "said"),
    [
        ("no-such-command-here", 127, "command not found: 'no-such-command-here' (not on PATH)"),
        ("./no-such-file", 127, "command not found: './no-such-file' (no such file)"),
        ("./plain.txt", 126, "command cannot be run: './plain.txt' (not executable)"),
        ("./a-directory", 126, "command cannot be run: './a-directory' (a directory)"),
    ],
)
@pytest.mark.parametrize("tool", ["jax", "numba"])
def test_run_with_a_command_that_cannot_start_exits_as_a_shell_does(
    tmp_path: Path, program: str, status: int, said: str, tool: str
) -> None:
    # Said before anything is restored (and before the tool is asked for: installed or not).
    (tmp_path / "plain.txt").write_text("echo hi\n")
    (tmp_path / "a-directory").mkdir()
    root = tmp_path / "root"
    completed = subprocess.run(
        [sys.executable, "-m", "warmenv", "run", "--root", str(root), "--cache", tool, "--",
         program],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    line = assert_one_error_line(completed, status)
    assert line == f"warmenv: error: {said}\n"
    assert not root.exists()


@pytest.mark.parametrize(
    ("mode", "denied"),
    [(0o700, "not readable or searchable"), (0o744, "not searchable")],
    ids=["0700", "0744"],
)
def test_ls_of_a_root_it_may_not_read_says_the_root_not_an_environment(
    shared_tmp: Path, mode: int, denied: str
) -> None:
    # The listing was asked for: the root is what is in the way, not `default` in it.
    root = shared_tmp / "locked"
    _fill(root)
    (root / "warm.db").rename(root / "default.db")
    root.chmod(mode)
    child = run_python(CLI, "--root", str(root), "ls", user=unprivileged_user())
    line = assert_one_error_line(child, 1)
    assert line == f"warmenv: error: cannot read {root}: {denied} by this process\n"


@pytest.mark.parametrize("named", [["--env", "warm"], ["warm"]], ids=["--env", "NAME"])
@pytest.mark.parametrize(
    ("mode", "denied"),
    [(0o700, "not readable or searchable"), (0o711, "not readable"), (0o744, "not searchable")],
    ids=["0700", "0711", "0744"],
)
def test_ls_of_an_environment_in_a_root_it_may_not_read_names_the_root_and_the_access_lacking(
    shared_tmp: Path, mode: int, denied: str, named: list[str]
) -> None:
    # As `ls` alone says it: the root, and which access this process lacks, never
    # "cannot read environment 'warm'" with the access it found missing first.
    root = shared_tmp / "locked"
    _fill(root)
    root.chmod(mode)
    child = run_python(CLI, "--root", str(root), "ls", *named, user=unprivileged_user())
    line = assert_one_error_line(child, 1)
    assert line == f"warmenv: error: cannot read {root}: {denied} by this process\n"


def test_import_through_another_users_symlink_fails_in_one_line_and_creates_nothing(
    bundle: Path, shared_tmp: Path
) -> None:
    # `nobody` plants `sub -> victimdir` in a sticky directory of theirs; root runs
    # the command: it would have created `warm.db` in root's own directory.
    link, victim = _planted(shared_tmp)
    completed = warmenv("import", str(bundle), "--env", "warm", root=link)
    line = assert_one_error_line(completed, 1)
    assert line.startswith(
        f"warmenv: error: cannot write environment 'warm': {link} is a symlink of another "
        "user's (uid "
    ), line
    assert list(victim.iterdir()) == []
