"""Project automation: `nox -s tests` is what CI and the README run."""

from __future__ import annotations

from pathlib import Path

import nox
import nox.command

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = None  # the interpreter nox itself runs on (3.11+)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite, every async test on asyncio, asyncio+uvloop and trio.

    On every core (pytest-xdist, `-n auto`): most tests wait on child
    processes, servers and files, so two workers on two cores nearly halve
    the wall time. `--dist worksteal` lets an idle worker take tests queued
    on a busy one, as the tests' durations differ by a thousandfold.
    `nox -s tests -- -n 0` runs them in one process.
    """
    session.install("-e", ".[test]")
    parallel = ["--numprocesses", "auto", "--dist", "worksteal"]
    session.run("pytest", "-m", "not slow", *parallel, *session.posargs)


@nox.session(python=PYTHON)
def compilers(session: nox.Session) -> None:
    """The compiler-cache tests on the real compilers (tests/compilers), apart from `tests`.

    A compiler that is missing fails its tests with the install hint; the
    extras installed here are the ones they need.
    """
    session.install("-e", ".[test,jax,numba,triton,torch]")
    session.run("pytest", "tests/compilers", *session.posargs)


@nox.session(python=PYTHON)
def caches_demo(session: nox.Session) -> None:
    """A real compiler's cold start skipped: JAX cold, a plain copy of its cache, warm."""
    session.install("-e", ".[jax]")
    session.run("python", "benchmarks/bench_caches_cpu.py", "--tool", "jax", "--rounds", "1")


# The runs of `nox -s reliability`, each one pytest command's arguments: every test that
# records a row of docs/reliability.md must be in one of them, or the next full run drops
# its row (tests/test_reliability_runs.py checks it).
RELIABILITY_RUNS: list[list[str]] = [
    ["-m", "slow"],
    # The deterministic scenarios (full disk, read-only, inert data) add their rows too.
    [
        "tests/test_reliability.py",
        "tests/test_bundle.py",
        "-k",
        "full_disk or read_only or pickle",
    ],
    # Files that are not warmenv's, refused and left as they were (issue 22).
    ["tests/test_ownership.py", "tests/test_busy.py"],
    # The other classes of issue 22, each row counted by its regression tests: lying
    # HTTP servers and URLs, secrets in logs, staging across PID namespaces, settings
    # and cache paths, schema tricks, signatures, index edits, a hostile Redis.
    [
        "tests/test_download_hostile.py",
        "tests/test_download_logs.py",
        "tests/test_private_directories.py",
        "tests/test_config.py",
        "tests/test_cli_errors.py",
        "tests/test_cache_paths.py",
        "tests/test_signing.py",
        "tests/test_bundle_schema_tricks.py",
        "tests/test_bundle_index.py",
        "tests/test_remote_bounds.py",
    ],
    ["tests/test_store_flight.py", "tests/test_lease.py", "-k", "itself or renewed_forever"],
    # A purge by a name two bundles share, and vacuum under a reader (issue 22, 13 and 15).
    [
        "tests/test_cli_stats.py",
        "tests/test_provenance.py",
        "-k",
        "two_bundles_share or vacuum_under_a_reader",
    ],
]


@nox.session(python=PYTHON)
def reliability(session: nox.Session) -> None:
    """The long forms of the fault-injection scenarios; rewrites docs/reliability.md's table.

    The table is written even when trials failed (each row counts what it
    observed, failures included); the session fails afterwards. With
    arguments (`nox -s reliability -- -k lease`), which select some of the
    scenarios, the rows those rerun replace theirs and every other row is kept
    (`reliability_report.py --merge`): a partial run never drops the rest.
    """
    session.install("-e", ".[test]")
    report = Path(session.create_tmp()) / "reliability.jsonl"
    report.unlink(missing_ok=True)
    # create_tmp points TMPDIR into .nox/, inside the clone: the tests' own files go where
    # `nox -s tests` puts them instead, outside any project (under the clone, a test that no
    # pyproject.toml is found above its tmp_path found this repository's).
    session.env.pop("TMPDIR", None)
    env = {"WARMENV_RELIABILITY_REPORT": str(report)}
    # A selection may match nothing in one of the runs (pytest's exit code 5).
    selected = [0, 5] if session.posargs else [0]
    failed = []
    # The slowest tests, so that a run says what its time went to (CI budgets it).
    timed = ["--durations", "12", "--durations-min", "5"]
    for args in RELIABILITY_RUNS:
        try:
            session.run("pytest", *timed, *args, *session.posargs, env=env, success_codes=selected)
        except nox.command.CommandFailed:
            failed.append(" ".join(args))
    merging = ["--merge"] if session.posargs else []
    session.run(
        "python", "benchmarks/reliability_report.py", *merging, str(report), "docs/reliability.md"
    )
    if failed:
        session.error(f"trials failed in: pytest {'; pytest '.join(failed)} (see the table)")


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """Fuzz the bundle readers and the manifest parser; `-- --minutes N` (default 10).

    Prints a summary (inputs tried, outcomes, findings) and fails if anything
    but a BundleError/OSError, a hang or a crash was found; findings (each
    input's bytes and the exception) are kept under .nox/fuzz/tmp/fuzz-run.
    """
    session.install("-e", ".[test]")
    out = Path(session.create_tmp()) / "fuzz-run"
    session.run("python", "benchmarks/fuzz_bundles.py", "--out", str(out), *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Style, and the house's own rules (docs/architecture.md).

    ruff (with SLF001: no reach-ins into private names), import-linter's
    contracts in pyproject.toml (the layers, the forbidden imports, no cycles),
    and tests/test_architecture.py (module size, each rule written once).
    """
    session.install("-e", ".[test]", "ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")
    session.run("pytest", "-p", "no:cacheprovider", "tests/test_architecture.py")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", "mypy>=1.11")
    session.run("mypy")


# The compiler caches' benchmarks: they need the compilers, so `bench_caches` runs them.
CACHE_BENCHMARKS = ("bench_caches.py", "bench_caches_cpu.py")
# Needs them too, but compares trees, so it runs by name only: `nox -s bench_caches --
# bench_restore_fresh.py --fixtures DIR --tree OLD --tree NEW`.
COMPILER_SCRIPTS = (*CACHE_BENCHMARKS, "bench_restore_fresh.py")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks next to their baselines; prints ratios (see docs/benchmarks.md).

    `nox -s bench -- bench_bundle.py --large` runs one script with its options.
    The compiler caches' scripts (`CACHE_BENCHMARKS`) need the compilers:
    `nox -s bench_caches` runs them.
    """
    scripts = (
        "bench_sync.py",
        "bench_storage.py",
        "bench_bundle.py",
        "bench_serving.py",  # --entries 200000 for the 200k-entry import
        "bench_schema.py",
        "bench_statistics.py",
        "bench_explain.py",
        "bench_download.py",
        "bench_remote.py",
        "bench_restore.py",  # a compiler-cache restore beside cp -r, no compiler needed
        "bench_import_vs_0_1.py",  # 0.1's reader from the clone's history: a full clone
    )
    if session.posargs[:1] and session.posargs[0] in COMPILER_SCRIPTS:
        session.error(
            f"{session.posargs[0]} needs the compilers: run "
            f"nox -s bench_caches -- {' '.join(session.posargs)}"
        )
    session.install("-e", ".[test]")
    _benchmarks(session, scripts)


@nox.session(python=PYTHON)
def bench_caches(session: nox.Session) -> None:
    """The compiler caches' benchmarks: each tool cold beside warm, our restore beside `cp -r`.

    Installs the compilers (the jax, numba, triton and torch extras; torch is
    pinned to its CPU wheel) and runs `CACHE_BENCHMARKS` (docs/benchmarks.md's
    compiler rows; minutes, not seconds). `nox -s bench_caches --
    bench_caches_cpu.py --tool jax` runs one script with its options.
    """
    session.install("-e", ".[jax,numba,triton,torch]")
    _benchmarks(session, CACHE_BENCHMARKS)


def _benchmarks(session: nox.Session, scripts: tuple[str, ...]) -> None:
    """Run `scripts`, or the one script the arguments name (with the options after it)."""
    args = list(session.posargs)
    if args and args[0].endswith(".py"):  # one script, with its own options after it
        scripts, args = (args[0],), args[1:]
    for script in scripts:
        session.run("python", f"benchmarks/{script}", *args)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation with warnings as errors (mkdocs --strict)."""
    session.install("-e", ".", "mkdocs>=1.6", "mkdocstrings[python]>=0.26")
    session.run("mkdocs", "build", "--strict", "--site-dir", "site")


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: `warmenv demo`."""
    session.install(".[cli]")
    session.run("warmenv", "demo", *session.posargs)
