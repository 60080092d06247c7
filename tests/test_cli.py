"""The `warmenv` command, run as users run it: in a subprocess."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import anyio
import pytest

from conftest import KERNELS, sample_entries
from warmenv import open_environment
from warmenv.bundle import open_bundle

TOTAL = sum(len(items) for items in sample_entries().values())


def warmenv(
    *args: str | bytes,
    root: Path | None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m warmenv ARGS --root ROOT` as a user would, output captured as text
    (in `cwd`, for a command that may write a file named as typed: never the clone)."""
    root_option = ["--root", str(root)] if root is not None else []
    completed = run_raw(*args, *root_option, env=env, cwd=cwd)
    return subprocess.CompletedProcess(
        completed.args,
        completed.returncode,
        completed.stdout.decode("utf-8"),
        completed.stderr.decode("utf-8"),
    )


def run_raw(
    *args: str | bytes,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `python -m warmenv ARGS` with its output as the bytes it wrote."""
    return subprocess.run(
        [sys.executable, "-m", "warmenv", *args],
        capture_output=True,
        timeout=120,
        cwd=cwd,
        input=None if stdin is None else stdin.encode(),
        env={**os.environ, "COLUMNS": "120", **(env or {})},
    )


def terminal(
    *args: str, keys: tuple[tuple[bytes, bytes], ...] = (), env: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """Run `python -m warmenv ARGS` on a pseudo-terminal: its exit status and every byte shown.

    `keys` are (prompt, typed) pairs: once `prompt` has appeared, `typed` is
    written to the terminal as a user would type it (b"\x03" is Ctrl-C).
    """
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal user running the command
        os.environ.update(
            {"COLUMNS": "400", "LINES": "50", "TERM": "xterm-256color", **(env or {})}
        )
        os.execv(sys.executable, [sys.executable, "-m", "warmenv", *args])
    output = b""
    pending = list(keys)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal closes when the child exits
            break
        if not chunk:
            break
        output += chunk
        if pending and pending[0][0] in output:
            os.write(fd, pending.pop(0)[1])
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), output


def as_json(completed: subprocess.CompletedProcess[str]) -> Any:
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


@pytest.fixture
def warm_root(tmp_path: Path) -> Path:
    """A root whose environment 'warm' holds `sample_entries()`."""
    root = tmp_path / "root"

    async def fill() -> None:
        async with open_environment("warm", root=root) as env:
            for namespace, items in sample_entries().items():
                await env.storage(namespace).insert_many(items.items())

    anyio.run(fill)
    return root


@pytest.fixture
def bundle(warm_root: Path, tmp_path: Path) -> Path:
    out = tmp_path / "warm.bundle"
    completed = warmenv(
        "export",
        str(out),
        "--name",
        "H100 Linux",
        "--app-version",
        "1",
        "--env",
        "warm",
        root=warm_root,
    )
    assert completed.returncode == 0, completed.stderr
    return out


def test_demo_runs_the_whole_story_and_the_warm_start_is_ten_times_faster(
    tmp_path: Path,
) -> None:
    report = as_json(warmenv("demo", "--json", root=tmp_path / "demo"))
    assert report["cold_computed"] == report["keys"] >= 24
    assert report["warm_computed"] == 0
    assert report["same_choices"] is True
    assert report["preflight_ok"] is True
    assert report["imported"] == report["keys"]
    assert report["cold_seconds"] >= 10 * report["warm_seconds"]
    assert Path(report["bundle"]["path"]).is_file()


def test_demo_prints_a_table_of_cold_and_warm_start(tmp_path: Path) -> None:
    completed = warmenv("demo", root=tmp_path / "demo")
    assert completed.returncode == 0, completed.stderr
    assert "cold start vs warm start" in completed.stdout
    assert "faster and chose the same implementations" in completed.stdout


@pytest.mark.parametrize(
    ("option", "value"), [("--remote", "redis://127.0.0.1:1/0"), ("--env", "other")]
)
def test_the_demo_refuses_options_it_would_ignore(tmp_path: Path, option: str, value: str) -> None:
    completed = warmenv("demo", option, value, root=tmp_path / "demo")
    assert completed.returncode == 2
    assert f"takes no {option}" in completed.stderr
    assert not (tmp_path / "demo").exists()


def test_ls_lists_environments_and_namespaces(warm_root: Path) -> None:
    report = as_json(warmenv("ls", "--env", "warm", "--json", root=warm_root))
    assert [e["name"] for e in report["environments"]] == ["warm"]
    assert {n["namespace"]: n["entries"] for n in report["namespaces"]} == {
        ns: len(items) for ns, items in sample_entries().items()
    }
    table = warmenv("ls", "--env", "warm", root=warm_root)
    assert str(KERNELS) in table.stdout


def test_export_writes_a_bundle_and_reports_it(warm_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.flat"
    report = as_json(
        warmenv(
            "export",
            str(out),
            "--name",
            "n",
            "--app-version",
            "1",
            "--format",
            "flat",
            "--namespace",
            "app",
            "--env",
            "warm",
            "--json",
            root=warm_root,
        )
    )
    assert report["entries"] == TOTAL - 1
    assert out.is_file()


@pytest.mark.parametrize("bundle_format", ["sqlite", "flat"])
def test_export_writes_format_1_for_old_readers_on_request(
    warm_root: Path, tmp_path: Path, bundle_format: str
) -> None:
    reports = {}
    for version in ("1", "2"):
        out = tmp_path / f"b{version}.bundle"
        reports[version] = as_json(
            warmenv(
                "export",
                str(out),
                "--name",
                "n",
                "--app-version",
                "1",
                "--format",
                bundle_format,
                "--format-version",
                version,
                "--env",
                "warm",
                "--json",
                root=warm_root,
            )
        )

    async def format_version() -> int:
        async with open_bundle(tmp_path / "b1.bundle") as bundle:
            await bundle.verify()
            return bundle.format_version

    assert anyio.run(format_version) == 1
    assert reports["1"]["entries"] == TOTAL
    assert reports["1"].keys() == reports["2"].keys()  # the output is the same otherwise


@pytest.mark.parametrize("bad", ["3", "0", "two"])
def test_export_of_an_unknown_format_version_is_bad_usage(
    warm_root: Path, tmp_path: Path, bad: str
) -> None:
    out = tmp_path / "b.bundle"
    completed = warmenv(
        "export",
        str(out),
        "--name",
        "n",
        "--app-version",
        "1",
        "--format-version",
        bad,
        "--env",
        "warm",
        root=warm_root,
    )
    assert completed.returncode == 2
    assert "--format-version" in completed.stderr
    assert not out.exists()


def test_export_takes_explicit_sources(warm_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.bundle"
    report = as_json(
        warmenv(
            "export",
            str(out),
            str(warm_root / "warm.db"),
            "--name",
            "n",
            "--app-version",
            "1",
            "--json",
            root=tmp_path / "elsewhere",
        )
    )
    assert report["entries"] == TOTAL


def test_export_sources_may_follow_the_options(warm_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.bundle"
    report = as_json(
        warmenv(
            "export",
            str(out),
            "--name",
            "n",
            "--app-version",
            "1",
            "--format",
            "flat",
            str(warm_root / "warm.db"),
            str(warm_root),
            "--json",
            root=tmp_path / "elsewhere",
        )
    )
    assert report["entries"] == TOTAL


def test_import_fills_an_environment(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "other"
    report = as_json(warmenv("import", str(bundle), "--env", "fresh", "--json", root=root))
    assert report["imported"] == TOTAL
    again = as_json(warmenv("import", str(bundle), "--env", "fresh", "--json", root=root))
    assert (again["imported"], again["skipped"]) == (0, TOTAL)


def test_import_says_when_it_created_the_environment(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    first = warmenv("import", str(bundle), "--env", "typo", root=root)
    assert first.returncode == 0, first.stderr
    assert f"created environment 'typo' at {root / 'typo.db'}" in first.stdout
    again = warmenv("import", str(bundle), "--env", "typo", root=root)
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout


def test_plain_output_shows_progress_lines_and_a_summary(bundle: Path, tmp_path: Path) -> None:
    completed = warmenv("import", str(bundle), "--env", "fresh", root=tmp_path / "r")
    assert completed.returncode == 0
    assert f"importing warm.bundle: {TOTAL}/{TOTAL} (100%)" in completed.stdout
    assert f"imported {TOTAL} entries" in completed.stdout


def test_inspect_shows_the_manifest_and_namespaces(bundle: Path, tmp_path: Path) -> None:
    report = as_json(warmenv("inspect", str(bundle), "--json", root=tmp_path))
    assert report["manifest"]["name"] == "H100 Linux"
    assert report["entries"] == TOTAL
    text = warmenv("inspect", str(bundle), root=tmp_path).stdout
    assert "H100 Linux" in text
    assert str(KERNELS) in text


def test_verify_accepts_a_sound_bundle(bundle: Path, tmp_path: Path) -> None:
    report = as_json(warmenv("verify", str(bundle), "--json", root=tmp_path))
    assert report["ok"] is True


def test_verify_rejects_a_tampered_bundle_in_one_line(bundle: Path, tmp_path: Path) -> None:
    import sqlite3

    with sqlite3.connect(bundle) as conn:
        conn.execute("UPDATE entries SET value = x'00' WHERE key = ?", (b"k001",))
    conn.close()
    completed = warmenv("verify", str(bundle), root=tmp_path)
    assert completed.returncode == 1
    assert completed.stderr.count("\n") == 1
    assert "does not match its digest" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_check_reports_the_preflight(bundle: Path, tmp_path: Path) -> None:
    report = as_json(warmenv("check", str(bundle), "--version", "1", "--json", root=tmp_path))
    assert report["ok"] is True
    other = warmenv("check", str(bundle), "--version", "9", root=tmp_path)
    assert other.returncode == 1
    assert "will not hit" in other.stdout


def test_check_says_which_namespaces_of_the_application_the_bundle_holds(
    bundle: Path, tmp_path: Path
) -> None:
    args = ["check", str(bundle), "--namespace", "app/1/kernels", "--namespace", "app/2/kernels"]
    completed = warmenv(*args, root=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert (
        "- 1 of 2 namespaces named is not in the bundle and will miss: 'app/2/kernels' "
        "(nearest there: 'app/1/kernels', version '1' instead of '2')\n"
    ) in completed.stdout
    report = as_json(warmenv(*args, "--json", root=tmp_path))
    assert report["would_hit"] == ["app/1/kernels"]
    assert [e["namespace"] for e in report["would_miss"]] == ["app/2/kernels"]
    missed = warmenv("check", str(bundle), "--namespace", "app/2/kernels", root=tmp_path)
    assert missed.returncode == 1
    assert "will not hit" in missed.stdout


def test_check_of_an_empty_namespace_is_bad_usage(bundle: Path, tmp_path: Path) -> None:
    completed = warmenv("check", str(bundle), "--namespace", "/", root=tmp_path)
    assert completed.returncode == 2
    assert "--namespace must not be empty" in completed.stderr


def test_purge_needs_confirmation_then_deletes(warm_root: Path) -> None:
    refused = warmenv("purge", "--env", "warm", root=warm_root)
    assert refused.returncode == 2
    assert "--yes" in refused.stderr
    report = as_json(
        warmenv("purge", "--env", "warm", "--namespace", "app2", "--yes", "--json", root=warm_root)
    )
    assert report["deleted"] == 1
    left = as_json(warmenv("ls", "--env", "warm", "--json", root=warm_root))
    assert "app2/1/kernels" not in {n["namespace"] for n in left["namespaces"]}


@pytest.mark.parametrize(
    "args",
    [
        ["import", "/nonexistent/missing.bundle"],
        ["inspect", "/nonexistent/missing.bundle"],
    ],
)
def test_a_missing_bundle_fails_with_one_line_and_no_traceback(
    args: list[str], tmp_path: Path
) -> None:
    completed = warmenv(*args, root=tmp_path)
    assert completed.returncode == 1
    assert completed.stderr.strip().count("\n") == 0
    assert "missing.bundle" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_a_corrupt_bundle_fails_with_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bundle"
    junk.write_bytes(b"WARMENV\x01" + b"\xff" * 64)
    completed = warmenv("import", str(junk), root=tmp_path / "r")
    assert completed.returncode == 1
    assert completed.stderr.strip().count("\n") == 0
    assert completed.stderr.startswith("warmenv: error: ")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    completed = warmenv("inspect", str(tmp_path / "missing"), "--debug", root=tmp_path)
    assert completed.returncode == 1
    assert "Traceback" in completed.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["export", "out.bundle"],  # --name is required
        ["import"],
        ["no-such-command"],
        ["export", "o", "--name", "n", "--app-version", "1", "--format", "zip"],
        ["ls", "--env", "bad name"],
    ],
)
def test_bad_usage_exits_2(args: list[str], tmp_path: Path) -> None:
    completed = warmenv(*args, root=tmp_path)
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr


def test_an_existing_foreign_file_is_not_overwritten(warm_root: Path, tmp_path: Path) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    completed = warmenv(
        "export",
        str(precious),
        "--name",
        "n",
        "--app-version",
        "1",
        "--env",
        "warm",
        root=warm_root,
    )
    assert completed.returncode == 1
    assert "not a warmenv bundle; it was left as it is: choose another path" in completed.stderr
    assert precious.read_text() == "keep me"


def test_import_in_a_terminal_draws_a_progress_bar(bundle: Path, tmp_path: Path) -> None:
    status, output = terminal("import", str(bundle), "--env", "tty", "--root", str(tmp_path / "t"))
    text = output.decode("utf-8", "replace")
    assert status == 0, text
    assert "━" in text  # rich's bar
    assert f"{TOTAL}/{TOTAL}" in text
    assert f"imported {TOTAL} entries" in text


def _interrupt_after_first_progress(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the command and press Ctrl-C (SIGINT) once it reports progress."""
    process = subprocess.Popen(
        [sys.executable, "-m", "warmenv", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first = first_progress_line(process.stdout)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, first + out, err)


def first_progress_line(stdout: IO[str], stderr: IO[str] | None = None) -> str:
    """The plain lines up to the first that shows progress (`done/total`): the operation's
    batches are under way. An import's digest check comes before, in lines of its own
    (`verifying NAME: bytes/total ...`). `stderr`, if given, is read into the failure of
    a command that ended before."""
    lines = ""
    while "/" not in (line := stdout.readline()) or line.startswith("verifying "):
        assert line.startswith("verifying "), (lines + line, stderr and stderr.read())
        lines += line
    return lines + line


@pytest.fixture
def big_flat_bundle(tmp_path: Path) -> Path:
    root = tmp_path / "big"

    async def make() -> None:
        async with open_environment("big", root=root) as env:
            await env.storage(KERNELS).insert_many(
                (b"%08d" % i, os.urandom(512)) for i in range(150_000)
            )

    anyio.run(make)
    out = tmp_path / "big.bundle"
    completed = warmenv(
        "export",
        str(out),
        "--name",
        "big",
        "--app-version",
        "1",
        "--format",
        "flat",
        str(root / "big.db"),
        root=root,
    )
    assert completed.returncode == 0, completed.stderr
    return out


def test_ctrl_c_during_import_exits_130_and_leaves_whole_batches(
    big_flat_bundle: Path, tmp_path: Path
) -> None:
    import sqlite3

    root = tmp_path / "target"
    completed = _interrupt_after_first_progress(
        "import", str(big_flat_bundle), "--env", "t", "--root", str(root)
    )
    assert completed.returncode == 130
    assert completed.stderr.count("\n") == 1
    assert "interrupted" in completed.stderr
    conn = sqlite3.connect(root / "t.db")
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    (count,) = conn.execute("SELECT count(*) FROM entries").fetchone()
    conn.close()
    assert count % 1024 == 0 or count == 150_000


def test_ctrl_c_during_export_exits_130_and_leaves_the_previous_bundle(
    big_flat_bundle: Path, tmp_path: Path
) -> None:
    before = big_flat_bundle.read_bytes()
    completed = _interrupt_after_first_progress(
        "export",
        str(big_flat_bundle),
        "--name",
        "again",
        "--app-version",
        "1",
        "--format",
        "flat",
        str(tmp_path / "big" / "big.db"),
        "--root",
        str(tmp_path / "big"),
    )
    assert completed.returncode == 130
    assert "interrupted" in completed.stderr
    assert big_flat_bundle.read_bytes() == before
    assert list(tmp_path.glob(".*.warmenv-staging")) == []


def test_remote_that_does_not_answer_leaves_import_working_and_hides_its_password(
    bundle: Path, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"redis://:sekret-word@127.0.0.1:{port}/0"
    completed = warmenv(
        "import", str(bundle), "--env", "fresh", "--remote", url, "--json", root=tmp_path / "r"
    )
    assert completed.returncode == 0, completed.stderr
    assert as_json(completed)["imported"] == TOTAL
    assert "sekret-word" not in completed.stdout + completed.stderr
    bad = warmenv("ls", "--env", "fresh", "--remote", "bogus://x", root=tmp_path / "r")
    assert bad.returncode != 0 and "not a Redis URL" in bad.stderr
