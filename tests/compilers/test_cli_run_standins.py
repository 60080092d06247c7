"""`warmenv run --cache TOOL -- COMMAND`: restore before, run, capture after, transparently.

COMMAND here is a small Python script standing in for a compiler: it reads
the variables `run` sets and writes a file where the tool would cache. The
real compilers under `run` are in test_compiler_run.py. These live among the
compiler tests because `warmenv run --cache jax` needs JAX installed beside
warmenv (its version decides which entries can hit); without it, run refuses
in one line (tests/test_cli_run_missing_tool.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

import warmenv
from compilers.machines import require
from warmenv import open_environment
from warmenv.bundle import export_bundle, import_bundle
from warmenv.caches import jax as cached_jax


@pytest.fixture(autouse=True)
def _jax_installed() -> None:
    require("jax")


STANDIN = textwrap.dedent(
    """
    import json, os, signal, sys
    cache = os.environ["JAX_COMPILATION_CACHE_DIR"]
    found = sorted(os.listdir(cache)) if os.path.isdir(cache) else []
    print(json.dumps({
        "found": found,
        "xla_caches": os.environ.get("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"),
        "cache": cache,
    }), flush=True)
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, "jit_f-%d-cache" % len(found)), "wb") as f:
        f.write(b"executable")
    if sys.argv[1] == "wait":
        signal.signal(signal.SIGTERM, lambda n, f: sys.exit(40 + n))
        print("ready", flush=True)
        signal.pause()
    if sys.argv[1] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(sys.argv[1]))
    """
)


_WARMENV_RUN = (sys.executable, "-m", "warmenv", "run")


def _run(
    root: Path,
    *command: str,
    options: tuple[str, ...] = (),
    environ: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_WARMENV_RUN, "--root", str(root), *options, "--", *command],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("JAX_")} | (environ or {}),
    )


def _script(tmp_path: Path) -> str:
    path = tmp_path / "standin.py"
    path.write_text(STANDIN, encoding="utf-8")
    return str(path)


def _standin(tmp_path: Path, how: str) -> list[str]:
    return [sys.executable, _script(tmp_path), how]


def _first_json(stdout: str) -> dict[str, object]:
    found = json.loads(stdout.splitlines()[0])
    assert isinstance(found, dict)
    return found


def test_run_passes_the_exit_status_through_and_captures_after(tmp_path: Path) -> None:
    root = tmp_path / "root"
    completed = _run(root, sys.executable, _script(tmp_path), "3", options=("--cache", "jax"))
    assert completed.returncode == 3, completed.stderr
    seen = _first_json(completed.stdout)
    assert seen["xla_caches"] == "none"  # the trap fixed for the child
    assert seen["cache"] == str(root / "default.caches" / "jax")
    assert "jax: captured 1 file (" in completed.stderr and ": 1 new," in completed.stderr

    async def files() -> list[bytes]:
        async with open_environment("default", root=root) as env:
            return [k async for k, _ in env.storage(cached_jax.tree().namespace).scan()]

    assert anyio.run(files) == [b"jit_f-0-cache"]


def test_run_restores_on_another_machine_before_the_command_starts(tmp_path: Path) -> None:
    first, second = tmp_path / "one" / "root", tmp_path / "elsewhere" / "deeper" / "root"
    script = _script(tmp_path)
    assert _run(first, sys.executable, script, "0", options=("--cache", "jax")).returncode == 0
    bundle = tmp_path / "jax.bundle"

    async def ship() -> None:
        async with open_environment("default", root=first) as env:
            await export_bundle([env], bundle, name="ci", version="1")
        async with open_environment("default", root=second) as env:
            await import_bundle(bundle, env)

    anyio.run(ship)
    cache = tmp_path / "given"
    completed = _run(
        second, sys.executable, script, "0", options=("--cache", "jax", "--cache-dir", str(cache))
    )
    assert completed.returncode == 0, completed.stderr
    assert _first_json(completed.stdout)["found"] == ["jit_f-0-cache"]
    assert (cache / "jax" / "jit_f-0-cache").read_bytes() == b"executable"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_run_passes_a_signal_on_to_the_command_and_its_status_back(
    tmp_path: Path, backend: str
) -> None:
    root = tmp_path / "root"
    process = subprocess.Popen(
        [*_WARMENV_RUN, "--root", str(root), "--cache", "jax", "--", *_standin(tmp_path, "wait")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WARMENV_CLI_BACKEND": backend},
    )
    assert process.stdout is not None
    process.stdout.readline()  # the stand-in's JSON line
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 40 + signal.SIGTERM, err  # the child's own handler's status
    assert "jax: captured 1 file (" in err  # it ended by itself: captured


def test_a_command_ended_by_a_signal_is_not_captured(tmp_path: Path) -> None:
    root = tmp_path / "root"
    completed = _run(root, sys.executable, _script(tmp_path), "die", options=("--cache", "jax"))
    assert completed.returncode == 128 + signal.SIGKILL
    assert "not captured: the command was ended by SIGKILL" in completed.stderr


def test_run_refuses_an_unknown_tool_naming_the_known_ones(tmp_path: Path) -> None:
    completed = _run(tmp_path / "root", "true", options=("--cache", "fortran"))
    assert completed.returncode == 2
    assert "unknown cache tool 'fortran': use one of" in completed.stderr
    assert "jax" in completed.stderr and "numba" in completed.stderr


def test_run_without_a_command_is_bad_usage(tmp_path: Path) -> None:
    completed = _run(tmp_path / "root", options=("--cache", "jax"))
    assert completed.returncode == 2
    assert "name the command to run after '--'" in completed.stderr


def test_a_command_that_does_not_exist_fails_in_one_line(tmp_path: Path) -> None:
    completed = _run(tmp_path / "root", "no-such-command-here", options=("--cache", "jax"))
    assert completed.returncode == 127  # as a shell says it
    assert "command not found: 'no-such-command-here'" in completed.stderr


def test_options_after_the_double_dash_belong_to_the_command(tmp_path: Path) -> None:
    completed = _run(
        tmp_path / "root",
        sys.executable,
        _script(tmp_path),
        "0",
        "--json",
        options=("--cache", "jax"),
    )
    assert completed.returncode == 0, completed.stderr
    assert _first_json(completed.stdout)["found"] == []  # the child's line, not warmenv's JSON
    assert "warmenv: jax: restored" in completed.stderr


TALKER = textwrap.dedent(
    """
    import subprocess, sys
    print("the command's own line", flush=True)
    print("the command's error line", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-c", "print('a line of a process it started')"], check=True)
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_with_json_stdout_is_the_document_alone_and_the_command_prints_to_stderr(
    tmp_path: Path, backend: str
) -> None:
    # warmenv run --json wrote the command's lines and then its document to stdout.
    talker = tmp_path / "talker.py"
    talker.write_text(TALKER, encoding="utf-8")
    completed = _run(
        tmp_path / "root",
        sys.executable,
        str(talker),
        options=("--cache", "jax", "--json"),
        environ={"WARMENV_CLI_BACKEND": backend},
    )
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)  # the whole of stdout, one document
    assert document["command"] == [sys.executable, str(talker)] and document["exit"] == 0
    assert "jax" in document["tools"]
    for line in (
        "the command's own line",
        "the command's error line",
        "a line of a process it started",
    ):
        assert line in completed.stderr.splitlines()


_OPEN_FILES = textwrap.dedent(
    """
    import json, os
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink("/proc/self/fd/" + fd))
        except FileNotFoundError:  # the listing's own descriptor, closed since
            pass
    print(json.dumps({"open": links}))
    """
)


def test_the_command_holds_its_hooks_lock_so_no_other_warmenv_removes_them(
    tmp_path: Path,
) -> None:
    # A process the command leaves running keeps the hooks' directory in use.
    script = tmp_path / "open_files.py"
    script.write_text(_OPEN_FILES, encoding="utf-8")
    completed = _run(
        tmp_path / "root",
        sys.executable,
        str(script),
        options=("--cache", "jax"),
        environ={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert completed.returncode == 0, completed.stderr
    lock = tmp_path / "cache" / "warmenv" / ".run-hooks" / warmenv.__version__ / ".lock"
    opened = _first_json(completed.stdout)["open"]
    assert isinstance(opened, list) and str(lock) in opened


def test_under_a_directory_others_can_write_the_command_runs_uncounted_said_once(
    tmp_path: Path,
) -> None:
    # warmenv run refused to run the command at all when its hooks had no safe home.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may rename what is in it
    root = tmp_path / "root"
    completed = _run(
        root,
        sys.executable,
        _script(tmp_path),
        "0",
        options=("--cache", "jax"),
        environ={"XDG_CACHE_HOME": str(shared / "cache")},
    )
    assert completed.returncode == 0, completed.stderr
    assert _first_json(completed.stdout)["cache"] == str(root / "default.caches" / "jax")  # it ran
    warnings = [line for line in completed.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, completed.stderr
    hooks = f"{shared}/cache/warmenv/.run-hooks/{warmenv.__version__}/"
    assert warnings[0].startswith(
        f"warmenv: warning: the command's cache hits are not counted: '{hooks}"
    )
    assert warnings[0].endswith(
        f"' lies under '{shared}', which other users can write (mode drwxrwxrwx): they "
        "could swap the files a compiler loads from it; run "
        f"`chmod go-w '{shared}'` or point XDG_CACHE_HOME at a directory of your own"
    )
    assert list(shared.iterdir()) == []  # no hooks written there
    assert "jax: captured 1 file (" in completed.stderr


def test_where_no_hooks_can_be_written_the_command_runs_uncounted(tmp_path: Path) -> None:
    a_file = tmp_path / "cache"
    a_file.write_text("not a directory\n")
    completed = _run(
        tmp_path / "root",
        sys.executable,
        _script(tmp_path),
        "0",
        options=("--cache", "jax", "--json"),
        environ={"XDG_CACHE_HOME": str(a_file)},
    )
    assert completed.returncode == 0, completed.stderr
    warnings = [line for line in completed.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, completed.stderr
    why = json.loads(completed.stdout)["uncounted"]
    assert why.startswith(f"{a_file}/warmenv/") and why.endswith(": Not a directory")
    assert warnings[0] == f"warmenv: warning: the command's cache hits are not counted: {why}"


def test_run_says_nothing_of_jaxs_minimum_when_jax_left_nothing_uncached(tmp_path: Path) -> None:
    # The stand-in compiles nothing: JAX cached every compilation it made (none), so the
    # minimum compile time is not mentioned (test_caches_misses: said when it did leave some).
    root = tmp_path / "root"
    completed = _run(root, sys.executable, _script(tmp_path), "0", options=("--cache", "jax"))
    assert completed.returncode == 0, completed.stderr
    assert "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in completed.stderr, completed.stderr


@pytest.mark.parametrize("seconds", ["0", "1.0"])
def test_run_says_nothing_of_the_minimum_when_the_user_chose_one(
    tmp_path: Path, seconds: str
) -> None:
    completed = _run(
        tmp_path / "root",
        sys.executable,
        _script(tmp_path),
        "0",
        options=("--cache", "jax"),
        environ={"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": seconds},
    )
    assert completed.returncode == 0, completed.stderr
    assert "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in completed.stderr


def test_run_counts_the_refused_entries_it_does_not_list(tmp_path: Path) -> None:
    # Past the tenth, refused entries went unmentioned: 25 refused read as 10.
    root = tmp_path / "root"

    async def plant() -> None:
        async with open_environment("default", root=root) as env:
            storage = env.storage(cached_jax.tree().namespace)
            await storage.insert_many(
                [(b"../escaped-%02d" % i, b"payload") for i in range(25)] + [(b"ok", b"fine")]
            )

    anyio.run(plant)
    completed = _run(root, sys.executable, _script(tmp_path), "0", options=("--cache", "jax"))
    assert completed.returncode == 0, completed.stderr
    lines = completed.stderr.splitlines()
    assert "restored 1 file (" in completed.stderr and ", 25 refused" in completed.stderr
    assert sum(line.startswith("- refused '../escaped-") for line in lines) == 10
    assert "- and 15 more refused" in lines, completed.stderr


def test_run_counts_one_miss_in_the_singular(tmp_path: Path) -> None:
    # One real jit (under a second: left uncached by JAX's minimum compile time).
    program = "import jax; print(jax.jit(lambda x: x + 1)(1.0))"
    completed = _run(tmp_path / "root", sys.executable, "-c", program, options=("--cache", "jax"))
    assert completed.returncode == 0, completed.stderr
    assert "jax: 0 cache hits, 1 miss (its own counters)" in completed.stderr
