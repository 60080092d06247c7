"""Fault injection: kills, cancellation, concurrency, full disks, inert data.

Each scenario runs here in a short form; `nox -s reliability` runs the long
forms (`-m slow`) and, with WARMENV_RELIABILITY_REPORT set, records the
trials for docs/reliability.md: every scenario loop counts its trials through
`helpers.Trials`, so a row holds what was observed (a failing trial is
recorded with its failure, then the test fails), never an assumed count.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle  # only to build a hostile payload; the library never imports it
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import anyio
import pytest

from conftest import env_contents
from helpers import Trials, backend_label, one_trial, reliability_row
from test_cli import first_progress_line
from warmenv import Environment, Failed, Namespace, Store, Stored, open_environment
from warmenv.bundle import BundleFormat, export_bundle, import_bundle, open_bundle

pytestmark = pytest.mark.anyio

WORKLOAD = Path(__file__).with_name("workload.py")
NS = Namespace("reliability", "batches", version="1")
BATCH = 50


def unrecorded(scenario: str) -> Trials:
    """Counts for a short form, which the report never shows."""
    return Trials(scenario, checked="")


def integrity_ok(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()


def keys_in(path: Path) -> list[bytes]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT key FROM entries WHERE namespace = ? ORDER BY key", (str(NS),)
        ).fetchall()
    finally:
        conn.close()
    return [row[0] for row in rows]


def batches_whole(keys: list[bytes], size: int) -> None:
    """Every batch written by insert_many is there completely or not at all."""
    per_batch = Counter(key.split(b"-")[0] for key in keys)
    partial = {batch: n for batch, n in per_batch.items() if n != size}
    assert not partial, f"partial batches: {partial}"


def staging_files(directory: Path) -> list[Path]:
    return list(directory.glob(".*.warmenv-staging"))


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKLOAD), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def duration(process: subprocess.Popen[str]) -> float:
    """How long the operation runs from "started" to its end, when nobody kills it."""
    with process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline().startswith("started"), process.stderr.read()
        begun = last = time.monotonic()
        for line in process.stdout:
            if not line.startswith("done"):
                last = time.monotonic()  # the last batch; closing is not the operation
        process.wait()
    assert process.returncode == 0
    return last - begun


def kill_mid_operation(process: subprocess.Popen[str], rng: random.Random, within: float) -> None:
    """SIGKILL the child at a random moment after it reports the operation started."""
    with process:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        assert line.startswith(("started", "done")), process.stderr.read()
        time.sleep(rng.uniform(0, within))  # the random moment of the kill, not synchronisation
        process.kill()
        process.wait()


# --- 1. killed mid-operation -----------------------------------------------------------


def kill_insert_many(tmp: Path, trials: int, backend: str, row: Trials) -> None:
    rng = random.Random(1)
    within = 0.9 * duration(spawn("insert_many", str(tmp / "timing"), "400", str(BATCH), backend))
    for trial in range(trials):
        with row.trial():
            root = tmp / f"insert-{trial}"
            kill_mid_operation(
                spawn("insert_many", str(root), "400", str(BATCH), backend), rng, within
            )
            path = root / "target.db"
            integrity_ok(path)
            batches_whole(keys_in(path), BATCH)

            async def complete(root: Path) -> None:
                async with open_environment("target", root=root) as env:
                    storage = env.storage(NS)
                    for batch in range(400):
                        items = [(b"b%05d-%05d" % (batch, i), b"v" * 512) for i in range(BATCH)]
                        summary = await storage.insert_many(items)
                        assert summary.failed == 0

            anyio.run(complete, root, backend=backend)
            assert len(keys_in(path)) == 400 * BATCH


async def _make_bundle(tmp: Path, entries: int, fmt: str = BundleFormat.SQLITE) -> Path:
    source = tmp / "source"
    async with open_environment("source", root=source) as env:
        await env.storage(NS).insert_many((b"k%06d" % i, os.urandom(256)) for i in range(entries))
        out = tmp / f"source.{fmt}"
        await export_bundle(env, out, name="source", version="1", format=fmt)
    return out


def kill_import(tmp: Path, trials: int, backend: str, row: Trials) -> None:
    rng = random.Random(2)
    entries, size = 20_000, 200
    bundle = anyio.run(_make_bundle, tmp, entries)
    expected = sorted(b"k%06d" % i for i in range(entries))
    within = 0.9 * duration(spawn("import", str(tmp / "timing"), str(bundle), str(size), backend))
    for trial in range(trials):
        with row.trial():
            root = tmp / f"import-{trial}"
            kill_mid_operation(
                spawn("import", str(root), str(bundle), str(size), backend), rng, within
            )
            path = root / "target.db"
            integrity_ok(path)
            got = keys_in(path)
            assert got == expected[: len(got)], "an import commits whole batches in bundle order"
            assert len(got) % size == 0 or len(got) == entries, f"partial batch: {len(got)}"

            async def rerun(root: Path, already: int) -> None:
                async with open_environment("target", root=root) as env:
                    report = await import_bundle(bundle, env, batch_size=size)
                    assert report.imported + report.skipped == entries
                    assert report.skipped == already

            anyio.run(rerun, root, len(got), backend=backend)
            assert keys_in(path) == expected


def kill_export(tmp: Path, trials: int, backend: str, fmt: str, row: Trials) -> None:
    rng = random.Random(3)
    root = tmp / "export-root"

    async def prepare() -> bytes:
        async with open_environment("target", root=root) as env:
            await env.storage(NS).insert_many(
                (b"k%06d" % i, os.urandom(512)) for i in range(30_000)
            )
            await export_bundle(env, tmp / "out.bundle", name="previous", version="1", format=fmt)
        return (tmp / "out.bundle").read_bytes()

    previous = anyio.run(prepare)
    out = tmp / "out.bundle"
    within = 0.9 * duration(spawn("export", str(root), str(tmp / "timing.bundle"), fmt, backend))
    for _ in range(trials):
        with row.trial():
            kill_mid_operation(spawn("export", str(root), str(out), fmt, backend), rng, within)
            if out.read_bytes() != previous:  # the kill came after the rename: it must be whole

                async def check_whole() -> None:
                    async with open_bundle(out) as bundle:
                        assert bundle.manifest.name == "killed"
                        assert await bundle.compute_digest() == bundle.manifest.digest

                anyio.run(check_whole, backend=backend)

            async def export_again() -> bytes:
                await export_bundle(
                    root / "target.db", out, name="previous", version="1", format=fmt
                )
                return out.read_bytes()

            previous = anyio.run(export_again, backend=backend)
            assert staging_files(tmp) == [], "the next export removes what a killed one left"
            integrity_ok(root / "target.db")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_killed_insert_many_leaves_whole_batches(tmp_path: Path, backend: str) -> None:
    kill_insert_many(tmp_path, 2, backend, unrecorded("SIGKILL during insert_many"))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_killed_import_leaves_whole_batches_and_completes_on_rerun(
    tmp_path: Path, backend: str
) -> None:
    kill_import(tmp_path, 2, backend, unrecorded("SIGKILL during import"))


@pytest.mark.parametrize("fmt", [BundleFormat.SQLITE, BundleFormat.FLAT])
def test_killed_export_leaves_the_previous_bundle_or_a_whole_one(tmp_path: Path, fmt: str) -> None:
    kill_export(tmp_path, 2, "asyncio", fmt, unrecorded("SIGKILL during export"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_long_kills(tmp_path: Path, backend: str) -> None:
    trials = int(os.environ.get("WARMENV_KILL_TRIALS", "20"))
    with reliability_row(
        f"SIGKILL during insert_many ({backend})",
        "integrity_check; every 50-item batch whole or absent; rerun completes",
    ) as row:
        kill_insert_many(tmp_path / "i", trials, backend, row)
    with reliability_row(
        f"SIGKILL during import ({backend})",
        "integrity_check; committed keys a whole-batch prefix of the bundle; rerun imports "
        "the rest",
    ) as row:
        kill_import(tmp_path / "m", trials, backend, row)
    for fmt in (BundleFormat.SQLITE, BundleFormat.FLAT):
        with reliability_row(
            f"SIGKILL during export to {fmt} ({backend})",
            "out is byte-identical to the previous bundle or a whole new one (digest "
            "verified); the next export removes staging files",
        ) as row:
            kill_export(tmp_path / f"e-{fmt}", trials, backend, fmt, row)


# --- 2. cancelled mid-operation -----------------------------------------------------------


async def cancel_insert_many(
    env: Environment, trials: int, rng: random.Random, row: Trials
) -> None:
    storage = env.storage(NS)
    for trial in range(trials):
        with row.trial():
            items = [(b"b%05d-%05d" % (trial, i), b"v" * 512) for i in range(2_000)]
            with anyio.move_on_after(rng.uniform(0, 0.05)):
                await storage.insert_many(items)
            count = sum(1 for key in keys_in(env.path) if key.startswith(b"b%05d-" % trial))
            assert count in (0, 2_000)
    integrity_ok(env.path)


async def cancel_import(
    env: Environment, bundle: Path, trials: int, rng: random.Random, row: Trials
) -> None:
    entries, size = 3_000, 100
    expected = sorted(b"k%06d" % i for i in range(entries))
    for _ in range(trials):
        with row.trial():
            await env.storage(NS).purge()
            with anyio.move_on_after(rng.uniform(0, 0.1)):
                await import_bundle(bundle, env, batch_size=size)
            got = keys_in(env.path)
            assert got == expected[: len(got)]
            assert len(got) % size == 0 or len(got) == entries
            report = await import_bundle(bundle, env, batch_size=size)
            assert report.skipped == len(got)
            assert keys_in(env.path) == expected


async def cancel_export(
    env: Environment, out: Path, trials: int, rng: random.Random, row: Trials
) -> None:
    await env.storage(NS).insert_many((b"e%06d" % i, os.urandom(256)) for i in range(5_000))
    for fmt in (BundleFormat.SQLITE, BundleFormat.FLAT):
        await export_bundle(env, out, name="previous", version="1", format=fmt)
        previous = out.read_bytes()
        for _ in range(trials):
            with row.trial():
                with anyio.move_on_after(rng.uniform(0, 0.1)):
                    await export_bundle(env, out, name="new", version="1", format=fmt)
                assert staging_files(out.parent) == []
                if out.read_bytes() != previous:
                    async with open_bundle(out) as bundle:
                        assert bundle.manifest.name == "new"
                    await export_bundle(env, out, name="previous", version="1", format=fmt)
                    previous = out.read_bytes()


async def cancel_purge(env: Environment, trials: int, rng: random.Random, row: Trials) -> None:
    storage = env.storage(Namespace("reliability", "purge", version="1"))
    for _ in range(trials):
        with row.trial():
            await storage.insert_many((b"p%06d" % i, b"v" * 256) for i in range(3_000))
            with anyio.move_on_after(rng.uniform(0, 0.02)):
                await storage.purge()
            assert (await storage.summary()).entries in (0, 3_000)
            await storage.purge()


async def run_cancellations(tmp: Path, trials: int, rows: dict[str, Trials]) -> None:
    rng = random.Random(4)
    bundle = await _make_bundle(tmp, 3_000)
    async with open_environment("cancel", root=tmp / "root") as env:
        await cancel_insert_many(env, trials, rng, rows["insert_many"])
        await cancel_import(env, bundle, trials, rng, rows["import"])
        out_dir = tmp / "out"
        out_dir.mkdir()
        await cancel_export(env, out_dir / "b.bundle", trials, rng, rows["export (both formats)"])
        await cancel_purge(env, trials, rng, rows["purge"])


CANCELLATION_CHECKS = {
    "insert_many": "each 2,000-item call wholly present or absent; integrity_check",
    "import": "committed keys a whole-batch prefix of the bundle; the next import skips "
    "exactly those and completes",
    "export (both formats)": "out byte-identical to the previous bundle or a whole new "
    "one; no staging file left",
    "purge": "the namespace holds all 3,000 entries or none",
}


async def test_cancelled_writes_leave_all_or_nothing(tmp_path: Path) -> None:
    rows = {operation: unrecorded(operation) for operation in CANCELLATION_CHECKS}
    await run_cancellations(tmp_path, 4, rows)


@pytest.mark.slow
async def test_long_cancellations(tmp_path: Path, anyio_backend: object) -> None:
    trials = int(os.environ.get("WARMENV_CANCEL_TRIALS", "50"))
    name = backend_label(anyio_backend)
    with ExitStack() as stack:
        rows = {
            operation: stack.enter_context(
                reliability_row(f"cancelled {operation} ({name})", checked)
            )
            for operation, checked in CANCELLATION_CHECKS.items()
        }
        await run_cancellations(tmp_path, trials, rows)


# --- 3. concurrency soak --------------------------------------------------------------------


def soak(tmp: Path, seconds: float, backend: str) -> dict[str, int]:
    root = tmp / "soak"
    bundle = anyio.run(_make_bundle, tmp, 500)

    async def create() -> None:
        async with open_environment("target", root=root):
            pass

    anyio.run(create)
    workers = [
        spawn("soak", str(root), str(seconds), str(me), str(bundle), backend) for me in range(4)
    ]
    exporter = spawn("soak_export", str(root), str(seconds), str(tmp / "soak.bundle"), backend)
    reports = []
    for process in [*workers, exporter]:
        out, err = process.communicate(timeout=seconds + 120)
        assert process.returncode == 0, err
        assert "locked" not in err
        reports.append(json.loads(out))
    *views, exported = reports
    conn = sqlite3.connect(root / "target.db")
    stored = dict(conn.execute("SELECT key, value FROM entries").fetchall())
    conn.close()
    for view in views:
        assert view["errors"] == []
        for key in view["own"]:
            assert key.encode() in stored, f"lost {key}"
        for key, value in view["shared"].items():
            assert stored[key.encode()] == value.encode(), "two winners for one key"
    for i in range(500):
        assert b"k%06d" % i in stored, "an imported entry was lost"
    assert exported["errors"] == []
    assert exported["exports"] >= 1
    integrity_ok(root / "target.db")
    return {
        "inserts": sum(v["counts"]["inserts"] for v in views),
        "imports": sum(v["counts"]["imports"] for v in views),
        "exports": exported["exports"],
    }


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_short_soak_of_four_writers_and_an_exporter(tmp_path: Path, backend: str) -> None:
    soak(tmp_path, 3, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_long_soak(tmp_path: Path, backend: str) -> None:
    seconds = float(os.environ.get("WARMENV_SOAK_SECONDS", "60"))
    checked = (
        "every own key present, one winner per shared key, every export valid, no error escaped"
    )
    with one_trial(f"soak {seconds:.0f}s: 4 processes + exporter ({backend})", checked) as row:
        counts = soak(tmp_path, seconds, backend)
        row.checked = (
            f"{counts['inserts']} inserts, {counts['imports']} imports, {counts['exports']} "
            f"exports: {checked}"
        )


# --- 4. full disk -----------------------------------------------------------------------------


async def _limit_pages(env: Environment, extra: int | None) -> None:
    db = env.database
    assert db is not None
    if extra is None:
        await db.run(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
        return
    pages = await db.run(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
    await db.run(lambda c: c.execute(f"PRAGMA max_page_count = {pages + extra}"))


@pytest.mark.parametrize("fmt", [BundleFormat.SQLITE, BundleFormat.FLAT])
async def test_a_full_disk_fails_imports_with_counts_and_recovers(tmp_path: Path, fmt: str) -> None:
    with one_trial(
        f"full disk (max_page_count) during import of a {fmt} bundle",
        "failed counts reported, no exception; reads served; after space returns the "
        "insert and a re-import complete; integrity_check",
    ):
        bundle = await _make_bundle(tmp_path, 2_000, fmt)
        async with open_environment("full", root=tmp_path / "root") as env:
            await env.storage(NS).insert(b"before", b"kept")
            await _limit_pages(env, 20)
            report = await import_bundle(bundle, env, batch_size=100)
            assert report.failed > 0
            assert report.imported + report.skipped + report.failed == 2_000
            assert await env.storage(NS).get(b"before") == b"kept"
            result = await env.storage(NS).insert(b"more", b"x" * 200_000)
            assert isinstance(result, Failed) and "full" in result.reason
            await _limit_pages(env, None)
            again = await import_bundle(bundle, env, batch_size=100)
            assert again.failed == 0
            assert again.imported + again.skipped == 2_000
            assert await env.storage(NS).insert(b"more", b"x" * 200_000) == Stored()
        integrity_ok(tmp_path / "root" / "full.db")


# --- 6. read-only everywhere --------------------------------------------------------------------


_READ_ONLY_IMPORT = """
import json, sys, warnings, anyio
from warmenv import open_environment
from warmenv.bundle import import_bundle
warnings.simplefilter("ignore")

async def main():
    async with open_environment("ro", root=sys.argv[1]) as env:
        report = await import_bundle(sys.argv[2], env)
        print(json.dumps({"read_only": env.read_only, "imported": report.imported,
                          "failed": report.failed, "skipped": report.skipped}))

anyio.run(main, backend=sys.argv[3])
"""


async def test_importing_into_a_read_only_environment_reports_failures(
    shared_tmp: Path, backend_name: str, anyio_backend: object
) -> None:
    from helpers import json_lines, run_python, unprivileged_user

    with one_trial(
        f"import into a read-only environment, as nobody ({backend_label(anyio_backend)})",
        "500 of 500 reported failed, no exception, the database untouched",
    ):
        bundle = await _make_bundle(shared_tmp, 500)
        bundle.chmod(0o444)
        root = shared_tmp / "ro"
        async with open_environment("ro", root=root) as env:
            await env.storage(NS).insert(b"x", b"y")
        (root / "ro.db").chmod(0o444)
        root.chmod(0o555)
        child = run_python(
            _READ_ONLY_IMPORT, str(root), str(bundle), backend_name, user=unprivileged_user()
        )
        [report] = json_lines(child)
        assert report == {"read_only": True, "imported": 0, "failed": 500, "skipped": 0}


# --- 7. no code execution from data ---------------------------------------------------------------


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (Path(self.marker),))  # type: ignore[return-value]


async def test_a_pickle_payload_is_imported_as_inert_bytes(tmp_path: Path) -> None:
    with one_trial(
        "bundle carrying a pickle payload",
        "stored as the same inert bytes; a JSON Store reads a miss; the payload's side "
        "effect (a marker file) never happens",
    ):
        marker = tmp_path / "pwned"
        payload = pickle.dumps(_Boom(str(marker)))
        async with open_environment("evil", root=tmp_path / "src") as env:
            await env.storage(NS).insert(b"payload", payload)
            await env.storage(NS).insert(b'"payload"', payload)
            out = tmp_path / "evil.bundle"
            await export_bundle(env, out, name="evil\u202e", version="1", format=BundleFormat.FLAT)
        async with open_environment("victim", root=tmp_path / "dst") as env:
            await import_bundle(out, env)
            assert await env.storage(NS).get(b"payload") == payload
            store: Store[str, object] = await env.store(NS)
            assert await store.get("payload") is None  # not JSON: a miss, never unpickled
            assert (await env_contents(env))[str(NS)][b"payload"] == payload
        assert not marker.exists()


def test_the_library_never_imports_pickle_or_evaluates_data() -> None:
    src = Path(__file__).parent.parent / "src" / "warmenv"
    for module in src.rglob("*.py"):
        text = module.read_text()
        for forbidden in ("import pickle", "from pickle", "marshal.loads", "eval(", "exec("):
            assert forbidden not in text, f"{module} uses {forbidden}"


# --- the report counts what it observed ------------------------------------------------------


def _recorded(report: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in report.read_text().splitlines()]


def test_a_failing_trial_is_recorded_with_its_failure_before_the_test_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "rows.jsonl"
    monkeypatch.setenv("WARMENV_RELIABILITY_REPORT", str(report))
    with pytest.raises(AssertionError, match="trial 3 lost a batch"):
        with reliability_row("flaky scenario", "batches whole") as row:
            for trial in range(1, 6):
                with row.trial():
                    assert trial != 3, f"trial {trial} lost a batch"
    [recorded] = _recorded(report)
    assert recorded["scenario"] == "flaky scenario"
    assert (recorded["trials"], recorded["failures"]) == (3, 1)  # the 4th and 5th never ran
    assert "trial 3: AssertionError: trial 3 lost a batch" in str(recorded["failure"])


async def test_a_real_scenario_counts_the_trial_a_planted_fault_breaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "rows.jsonl"
    monkeypatch.setenv("WARMENV_RELIABILITY_REPORT", str(report))
    async with open_environment("planted", root=tmp_path / "root") as env:
        # A stray key in trial 2's batch makes it look partial: that trial must fail.
        await env.storage(NS).insert(b"b00002-99999", b"stray")
        with pytest.raises(AssertionError):
            with reliability_row("cancelled insert_many", "all or nothing") as row:
                await cancel_insert_many(env, 6, random.Random(4), row)
    [recorded] = _recorded(report)
    assert (recorded["trials"], recorded["failures"]) == (3, 1)
    assert str(recorded["failure"]).startswith("trial 3: AssertionError")


def test_a_failure_outside_the_trials_counts_as_a_failed_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "rows.jsonl"
    monkeypatch.setenv("WARMENV_RELIABILITY_REPORT", str(report))
    with pytest.raises(OSError, match="no space"):
        with ExitStack() as stack:
            first = stack.enter_context(reliability_row("first", "x"))
            second = stack.enter_context(reliability_row("second", "y"))
            with first.trial():
                pass
            with second.trial():
                pass
            raise OSError("no space left for the set-up")
    rows = {str(r["scenario"]): r for r in _recorded(report)}
    # Counted once, by the innermost row; never by both.
    assert (rows["second"]["trials"], rows["second"]["failures"]) == (2, 1)
    assert (rows["first"]["trials"], rows["first"]["failures"]) == (1, 0)
    assert "outside the trials: OSError: no space" in str(rows["second"]["failure"])


def test_the_report_shows_failed_trials_and_sums_backends(tmp_path: Path) -> None:
    rows = [
        {"scenario": "s (trio)", "trials": 20, "failures": 0, "checked": "c", "failure": None},
        {
            "scenario": "s (trio)",
            "trials": 7,
            "failures": 1,
            "checked": "c",
            "failure": "trial 7: X",
        },
        {"scenario": "t", "trials": 1, "failures": 0, "checked": "d | e", "failure": None},
    ]
    report = tmp_path / "rows.jsonl"
    report.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = tmp_path / "reliability.md"
    marker = "<!-- table: written by benchmarks/reliability_report.py -->"
    page.write_text(f"# Reliability\n\nprose\n\n{marker}\n\nold table\n")
    script = Path(__file__).parent.parent / "benchmarks" / "reliability_report.py"
    subprocess.run([sys.executable, str(script), str(report), str(page)], check=True)
    text = page.read_text()
    assert text.startswith("# Reliability\n\nprose\n\n")
    assert "old table" not in text
    assert "| s (trio) | 27 | 1 | c |" in text
    assert "| t | 1 | 0 | d \\| e |" in text
    assert "**1 trials failed:**" in text
    assert "- s (trio): trial 7: X" in text


def test_a_merged_report_replaces_its_scenarios_rows_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    def run(rows: list[dict[str, object]], *merge: str) -> str:
        report = tmp_path / "rows.jsonl"
        report.write_text("".join(json.dumps(r) + "\n" for r in rows))
        subprocess.run([sys.executable, str(script), *merge, str(report), str(page)], check=True)
        return page.read_text()

    def row(scenario: str, trials: int, failure: str | None = None) -> dict[str, object]:
        failures = 1 if failure else 0
        return {
            "scenario": scenario,
            "trials": trials,
            "failures": failures,
            "checked": "c | d",
            "failure": failure,
        }

    script = Path(__file__).parent.parent / "benchmarks" / "reliability_report.py"
    page = tmp_path / "reliability.md"
    marker = "<!-- table: written by benchmarks/reliability_report.py -->"
    page.write_text(f"# Reliability\n\n{marker}\n\nold table\n")
    run([row("kept", 1_000, "trial 9: X"), row("rerun", 5, "trial 2: Y"), row("also kept", 3)])
    text = run([row("rerun", 20), row("new", 4, "trial 4: Z")], "--merge")
    table = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert table == [
        "| kept | 1,000 | 1 | c \\| d |",
        "| rerun | 20 | 0 | c \\| d |",
        "| also kept | 3 | 0 | c \\| d |",
        "| new | 4 | 1 | c \\| d |",
    ]
    assert "- kept: trial 9: X" in text and "- new: trial 4: Z" in text
    assert "trial 2: Y" not in text and "**2 trials failed:**" in text
    assert text.count("_Long run of") == 1 and "_Rows rerun on " in text


def test_a_full_report_names_the_rows_of_the_old_table_it_did_not_produce(
    tmp_path: Path,
) -> None:
    script = Path(__file__).parent.parent / "benchmarks" / "reliability_report.py"
    page = tmp_path / "reliability.md"
    marker = "<!-- table: written by benchmarks/reliability_report.py -->"
    page.write_text(f"# Reliability\n\n{marker}\n\nold table\n")
    report = tmp_path / "rows.jsonl"

    def run(*scenarios: str) -> str:
        rows = [{"scenario": s, "trials": 1, "failures": 0, "checked": "c"} for s in scenarios]
        report.write_text("".join(json.dumps(r) + "\n" for r in rows))
        done = subprocess.run(
            [sys.executable, str(script), str(report), str(page)],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stderr

    assert run("kept", "gone (trio)", "also gone") == ""
    said = run("kept")
    assert "2 rows of" in said and "gone (trio); also gone" in said, said
    assert "RELIABILITY_RUNS" in said
    assert "gone" not in page.read_text()


def test_a_report_without_rows_leaves_the_page_alone(tmp_path: Path) -> None:
    page = tmp_path / "reliability.md"
    page.write_text("unchanged\n")
    script = Path(__file__).parent.parent / "benchmarks" / "reliability_report.py"
    empty = tmp_path / "rows.jsonl"
    empty.write_text("")
    done = subprocess.run(
        [sys.executable, str(script), str(empty), str(page)], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "holds no rows" in done.stderr
    assert page.read_text() == "unchanged\n"


# --- 8. the file under an import changes: swapped, rewritten, truncated ------------------------

_MUTATE_DURING_IMPORT = """
import json, os, random, sys, threading, time, anyio
from warmenv import open_environment
from warmenv.bundle import BundleError, importing

path, other, root, backend, how, seed, within = sys.argv[1:8]
rng = random.Random(int(seed))
delay = rng.uniform(0, float(within))
marks = {}

def mutate():
    time.sleep(delay)  # the random moment of the change, not synchronisation
    if how == "swap":
        os.replace(other, path)
    elif how == "truncate":
        os.truncate(path, rng.randrange(os.path.getsize(path)))
    elif how == "rewrite":
        size = os.path.getsize(path)
        start = rng.randrange(size)
        with open(path, "r+b") as handle:
            handle.seek(start)
            handle.write(os.urandom(rng.randint(1, size - start)))
    marks["mutated"] = time.monotonic()

async def main():
    async with open_environment("target", root=root) as env:
        outcome = {}
        started = time.monotonic()
        changer = threading.Thread(target=mutate, daemon=True)
        if how != "none":
            changer.start()
        try:
            async with importing(path, env, batch_size=500) as progress:
                marks["entered"] = time.monotonic()
                outcome["open_seconds"] = marks["entered"] - started
                async for _ in progress:
                    pass
            outcome["imported"] = progress.report.imported
        except BundleError as exc:
            outcome["rejected"] = type(exc).__name__
        outcome["seconds"] = time.monotonic() - started
        if how != "none":
            changer.join()  # the change must have happened before we judge the outcome
    outcome["after_open"] = marks.get("mutated", 0.0) > marks.get("entered", float("inf"))
    print(json.dumps(outcome))

anyio.run(main, backend=backend)
"""

MUTATIONS = ("swap", "rewrite", "truncate")
CHILD_BACKENDS = ["asyncio", "trio"]
MUTATION_ENTRIES = 20_000


def _stored(path: Path) -> dict[bytes, bytes]:
    if not path.exists():
        return {}
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT key, value FROM entries").fetchall())
    finally:
        conn.close()


async def _bundle_pair(
    tmp: Path, fmt: str, entries: int
) -> tuple[Path, dict[bytes, bytes], dict[bytes, bytes]]:
    """A bundle, and beside it another with the same keys and other values."""
    original = {b"k%06d" % i: os.urandom(200) for i in range(entries)}
    other = {key: b"OTHER" + value for key, value in original.items()}
    for name, content in (("original", original), ("other", other)):
        async with open_environment(name, root=tmp / name) as env:
            await env.storage(NS).insert_many(content.items())
            await export_bundle(env, tmp / f"{name}.{fmt}", name=name, version="1", format=fmt)
    return tmp / f"original.{fmt}", original, other


def mutate_mid_import(
    tmp: Path, fmt: str, how: str, trials: int, row: Trials, entries: int = MUTATION_ENTRIES
) -> Counter[str]:
    """Trials of one change to the bundle file at random moments of an import, in children.

    Each trial imports into a fresh environment in a child process (a crash,
    SIGBUS from a mapping, is a failed trial) while a thread in that child
    changes the file after a random delay. Whatever the moment, the child
    exits 0 and the environment holds exactly one verified bundle's entries or
    nothing (the import refused with a BundleError); a change made once the
    import had opened the bundle must not reach it at all.
    """
    from helpers import run_python

    bundle, original, other = anyio.run(_bundle_pair, tmp, fmt, entries)
    seen: Counter[str] = Counter()
    pristine = bundle.read_bytes()
    swap_in = tmp / f"other.{fmt}"
    other_bytes = swap_in.read_bytes()
    timing = run_python(
        _MUTATE_DURING_IMPORT, str(bundle), "-", str(tmp / "timing"), "asyncio", "none", "0", "0"
    )
    assert timing.returncode == 0, timing.stderr[-2000:]
    measured = json.loads(timing.stdout)
    # Half the changes fall while the import opens (and copies) the file, half anywhere.
    windows = (2 * measured["open_seconds"], 1.2 * measured["seconds"])
    for trial in range(trials):
        with row.trial():
            bundle.write_bytes(pristine)
            swap_in.write_bytes(other_bytes)
            root = tmp / f"{how}-{trial}"
            backend = CHILD_BACKENDS[trial % len(CHILD_BACKENDS)]
            child = run_python(
                _MUTATE_DURING_IMPORT,
                *(str(bundle), str(swap_in), str(root), backend, how, str(trial)),
                str(windows[trial % 2]),
            )
            assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-1500:]}"
            assert "Traceback" not in child.stderr, child.stderr[-1500:]
            outcome = json.loads(child.stdout)
            stored = _stored(root / "target.db")
            if "rejected" in outcome:
                assert how != "swap", f"a swap between two valid bundles was refused: {outcome}"
                assert not outcome["after_open"], f"a change after the open reached it: {outcome}"
                assert stored == {}, f"a refused import wrote {len(stored)} entries"
                seen["refused"] += 1
                continue
            assert outcome["imported"] == entries, outcome
            if outcome["after_open"]:
                assert stored == original, "a change after the open reached the import"
                seen["changed after the open, imported the original"] += 1
            else:
                assert stored in (original, other), "the import mixed or changed entries"
                seen["original" if stored == original else "swapped-in"] += 1
            integrity_ok(root / "target.db")
            shutil.rmtree(root)  # keep the disk use of a long run flat
    return seen


@pytest.mark.parametrize("how", MUTATIONS)
def test_a_bundle_changed_at_random_moments_of_an_import_imports_only_what_was_verified(
    tmp_path: Path, bundle_format: str, how: str
) -> None:
    mutate_mid_import(tmp_path, bundle_format, how, 2, unrecorded(f"{how} mid-import"), 4_000)


@pytest.mark.slow
@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("fmt", [BundleFormat.SQLITE, BundleFormat.FLAT])
def test_long_mutations_mid_import(tmp_path: Path, fmt: str, how: str) -> None:
    trials = int(os.environ.get("WARMENV_MUTATION_TRIALS", "30"))
    checked = (
        "changed at a random moment (half of them while the import opens the file); "
        "child exits 0 with no traceback (no crash, no SIGBUS); the environment holds one "
        "verified bundle's entries exactly, or nothing and a BundleError; a change made after "
        "the import opened the file never reaches it; integrity_check"
    )
    with reliability_row(
        f"bundle file {how} at a random moment of its import, {fmt} (child; asyncio, trio)",
        checked,
    ) as row:
        seen = mutate_mid_import(tmp_path, fmt, how, trials, row)
        row.checked = f"{checked} (outcomes: {', '.join(f'{n} {k}' for k, n in seen.items())})"


# --- 9. SIGTERM and SIGHUP mid-command (`python -m warmenv`) ------------------------------------

STOP_SIGNALS = {"SIGTERM": 143, "SIGHUP": 129}
CLI_BACKENDS = ["asyncio", *(["uvloop"] if importlib.util.find_spec("uvloop") else []), "trio"]
CLI_ENTRIES = 40_000


def _command(*args: str, backend: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "warmenv", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WARMENV_CLI_BACKEND": backend},
    )


def _first_progress(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None and process.stderr is not None
    return first_progress_line(process.stdout, process.stderr)  # under way


def command_duration(*args: str) -> float:
    """How long the command runs after its first progress line, when nobody stops it."""
    process = _command(*args, backend="asyncio")
    _first_progress(process)
    begun = time.monotonic()
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return time.monotonic() - begun


def signal_at_random(
    args: list[str], rng: random.Random, within: float, signum: int, backend: str
) -> tuple[int, str]:
    """Run the command; send `signum` at a random moment after its first progress line."""
    process = _command(*args, backend=backend)
    _first_progress(process)
    time.sleep(rng.uniform(0, within))  # the random moment of the signal, not synchronisation
    process.send_signal(signum)
    _, err = process.communicate(timeout=300)
    return process.returncode, err


def _one_line(err: str, says: str) -> None:
    assert "Traceback" not in err, err[-1500:]
    assert err.startswith("warmenv: ") and err.count("\n") == 1, err[-1500:]
    assert says in err, err


async def _cli_source(tmp: Path) -> Path:
    async with open_environment("source", root=tmp / "source") as env:
        await env.storage(NS).insert_many(
            (b"k%06d" % i, os.urandom(512)) for i in range(CLI_ENTRIES)
        )
        return env.path


def signal_exports(tmp: Path, fmt: str, trials: int, row: Trials, share: float) -> Counter[str]:
    """Trials of SIGTERM/SIGHUP at random moments of `warmenv export` over a previous bundle.

    The signal comes within `share` of the command's run after its first
    progress line: the short form stays within the export, the long form
    reaches its exit (a signal as the command ends must be handled as well).
    """
    rng = random.Random(7)
    source = anyio.run(_cli_source, tmp)
    out_dir = tmp / "out"
    out_dir.mkdir()
    out = out_dir / "b.bundle"

    def export(name: str) -> list[str]:
        return [
            *("export", str(out), "--name", name, "--app-version", "1", "--format", fmt),
            *(str(source), "--root", str(tmp / "r")),
        ]

    within = share * command_duration(*export("previous"))
    previous = out.read_bytes()  # the manifest records its time: read after the last export
    seen: Counter[str] = Counter()
    for trial in range(trials):
        with row.trial():
            name = sorted(STOP_SIGNALS)[trial % 2]
            backend = CLI_BACKENDS[trial % len(CLI_BACKENDS)]
            code, err = signal_at_random(export("new"), rng, within, getattr(signal, name), backend)
            assert sorted(p.name for p in out_dir.iterdir()) == ["b.bundle"], "staging left"

            async def check_whole() -> None:
                async with open_bundle(out) as bundle:
                    assert bundle.manifest.name == "new"
                    await bundle.verify()

            if code == 0:  # the signal came after the export had finished: a whole new bundle
                anyio.run(check_whole)
                out.write_bytes(previous)
                seen["finished first"] += 1
                continue
            assert code == STOP_SIGNALS[name], (code, err[-1500:])
            if "but the export had completed" in err:
                # The signal came during the last, uninterruptible step (publishing): the
                # step finished, the exit still says the signal (docs/cli.md).
                _one_line(err, f"{out} is published")
                anyio.run(check_whole)
                out.write_bytes(previous)
                seen[f"{name} while publishing"] += 1
                continue
            _one_line(err, "no bundle was written")
            assert out.read_bytes() == previous, "the previous bundle changed"
            seen[f"stopped by {name}"] += 1
    return seen


def signal_imports(tmp: Path, trials: int, row: Trials, share: float) -> Counter[str]:
    """Trials of SIGTERM/SIGHUP at random moments of `warmenv import` (see `signal_exports`)."""
    rng = random.Random(8)
    source = anyio.run(_cli_source, tmp)
    bundle = tmp / "in.bundle"
    made = subprocess.run(
        [
            *(sys.executable, "-m", "warmenv", "export", str(bundle), "--name", "in"),
            *("--app-version", "1", "--format", "flat", str(source), "--root", str(tmp / "r")),
        ],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    before = bundle.read_bytes()

    def into(root: Path) -> list[str]:
        return ["import", str(bundle), "--env", "t", "--root", str(root)]

    within = share * command_duration(*into(tmp / "timing"))
    seen: Counter[str] = Counter()
    for trial in range(trials):
        with row.trial():
            name = sorted(STOP_SIGNALS)[trial % 2]
            backend = CLI_BACKENDS[trial % len(CLI_BACKENDS)]
            root = tmp / f"import-{trial}"
            code, err = signal_at_random(into(root), rng, within, getattr(signal, name), backend)
            assert bundle.read_bytes() == before, "the import changed its bundle"
            assert sorted(p.name for p in root.iterdir()) == ["t.db"], "a private copy was left"
            integrity_ok(root / "t.db")
            conn = sqlite3.connect(root / "t.db")
            (count,) = conn.execute("SELECT count(*) FROM entries").fetchone()
            conn.close()
            if code == 0:
                assert count == CLI_ENTRIES
                seen["finished first"] += 1
            elif "but the import had completed" in err:
                # The signal came as the command ended (docs/cli.md): everything is in.
                assert code == STOP_SIGNALS[name], (code, err[-1500:])
                _one_line(err, "but the import had completed into environment 't'")
                assert count == CLI_ENTRIES, count
                seen[f"{name} as it ended"] += 1
            else:
                assert code == STOP_SIGNALS[name], (code, err[-1500:])
                _one_line(err, "whole batches")
                assert count % 1024 == 0 and count < CLI_ENTRIES, count
                seen[f"stopped by {name}"] += 1
            shutil.rmtree(root)
    return seen


def test_sigterm_or_sighup_at_random_moments_of_an_export_leaves_the_previous_bundle(
    tmp_path: Path, bundle_format: str
) -> None:
    signal_exports(tmp_path, bundle_format, 2, unrecorded("signalled export"), share=0.5)


def test_sigterm_or_sighup_at_random_moments_of_an_import_leaves_whole_batches(
    tmp_path: Path,
) -> None:
    signal_imports(tmp_path, 2, unrecorded("signalled import"), share=0.5)


def _outcomes(seen: Counter[str]) -> str:
    return ", ".join(f"{n} {what}" for what, n in sorted(seen.items()))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [BundleFormat.SQLITE, BundleFormat.FLAT])
def test_long_signals_mid_export(tmp_path: Path, fmt: str) -> None:
    trials = int(os.environ.get("WARMENV_SIGNAL_TRIALS", "20"))
    checked = (
        "signal at a random moment from the first progress line to the exit; "
        "exit 143/129 with one line on stderr, no traceback; out byte-identical to the previous "
        "bundle and no staging file (or, signalled after the end, a whole verified new bundle)"
    )
    with reliability_row(
        f"SIGTERM/SIGHUP during `warmenv export --format {fmt}` (asyncio, uvloop, trio)", checked
    ) as row:
        seen = signal_exports(tmp_path, fmt, trials, row, share=1.0)
        row.checked = f"{checked} ({_outcomes(seen)})"


@pytest.mark.slow
def test_long_signals_mid_import(tmp_path: Path) -> None:
    trials = int(os.environ.get("WARMENV_SIGNAL_TRIALS", "20"))
    checked = (
        "signal at a random moment from the first progress line to the exit; "
        "exit 143/129 with one line on stderr, no traceback; integrity_check; whole 1,024-entry "
        "batches; no private copy left; the bundle unchanged"
    )
    with reliability_row(
        "SIGTERM/SIGHUP during `warmenv import` (asyncio, uvloop, trio)", checked
    ) as row:
        seen = signal_imports(tmp_path, trials, row, share=1.0)
        row.checked = f"{checked} ({_outcomes(seen)})"


# --- 10. COMMIT fails ------------------------------------------------------------------------

BAD_KEY = b"bad"


async def _arm_failing_commit(env: Environment) -> None:
    """Make every transaction that writes the key b"bad" fail at COMMIT, not before.

    A trigger inserts a row breaking a deferred foreign key, which SQLite
    checks only when the transaction commits.
    """
    db = env.database
    assert db is not None

    def arm(conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE child (id INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.execute(
            "CREATE TRIGGER fail_commit AFTER INSERT ON entries "
            f"WHEN new.key = X'{BAD_KEY.hex()}' BEGIN INSERT INTO child VALUES (42); END"
        )

    await db.run(arm)


async def _bundles_carrying_the_bad_key(tmp: Path) -> dict[str, Path]:
    async with open_environment("bad-source", root=tmp / "bad-source") as env:
        await env.storage(NS).insert_many([(b"i%05d" % i, b"v" * 64) for i in range(299)])
        await env.storage(NS).insert(BAD_KEY, b"v")
        paths = {str(fmt): tmp / f"bad.{fmt}" for fmt in BundleFormat}
        for fmt, path in paths.items():
            await export_bundle(env, path, name="bad", version="1", format=fmt)
    return paths


async def fail_commits(tmp: Path, trials: int, rng: random.Random, row: Trials) -> Counter[str]:
    """Trials of a write whose COMMIT fails; after each the connection must work normally."""
    bundles = await _bundles_carrying_the_bad_key(tmp)
    seen: Counter[str] = Counter()
    async with open_environment("commit", root=tmp / "root") as env:
        await _arm_failing_commit(env)
        storage = env.storage(NS)
        operations = ["insert", "insert_many", "import sqlite", "import flat"]
        for trial in range(trials):
            with row.trial():
                operation = rng.choice(operations)
                if operation == "insert":
                    failed = await storage.insert(BAD_KEY, b"value")
                    assert isinstance(failed, Failed) and "FOREIGN KEY" in failed.reason, failed
                elif operation == "insert_many":
                    items = [(b"m%05d" % i, b"v") for i in range(rng.randrange(1, 200))]
                    items.insert(rng.randrange(len(items) + 1), (BAD_KEY, b"v"))
                    summary = await storage.insert_many(items)
                    assert summary.failed == len(items), summary  # one transaction: all fail
                    assert await storage.get(items[0][0]) is None
                else:
                    bundle = bundles[operation.split()[1]]
                    report = await import_bundle(bundle, env, batch_size=rng.choice([50, 100]))
                    assert report.failed > 0, report
                    assert report.imported + report.skipped + report.failed == 300, report
                assert await storage.get(BAD_KEY) is None
                # The connection is out of the failed transaction and holds no lock:
                # the next transactions commit, and a reader in another process sees them.
                good = b"good-%05d" % trial
                assert await storage.insert(good, b"value") == Stored()
                summary = await storage.insert_many([(good + b"-a", b"v"), (good + b"-b", b"v")])
                assert summary.failed == 0, summary
                assert set(keys_in(env.path)) >= {good, good + b"-a", good + b"-b"}
                await storage.purge()
                seen[operation] += 1
    integrity_ok(tmp / "root" / "commit.db")
    return seen


async def test_commits_failing_again_and_again_leave_the_connection_usable(tmp_path: Path) -> None:
    seen = await fail_commits(tmp_path, 8, random.Random(9), unrecorded("failed COMMIT"))
    assert sum(seen.values()) == 8


@pytest.mark.slow
async def test_long_commit_failures(tmp_path: Path, anyio_backend: object) -> None:
    trials = int(os.environ.get("WARMENV_COMMIT_TRIALS", "200"))
    checked = (
        "the write reported failed (Failed, failed counts), no exception, nothing of it "
        "stored; then inserts commit and another connection sees them; integrity_check"
    )
    with reliability_row(
        f"COMMIT fails (deferred foreign key) in insert, insert_many, import of both formats "
        f"({backend_label(anyio_backend)})",
        checked,
    ) as row:
        seen = await fail_commits(tmp_path, trials, random.Random(10), row)
        row.checked = f"{checked} ({_outcomes(seen)})"
