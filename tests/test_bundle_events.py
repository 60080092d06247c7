"""The streaming forms of import and export: their events, types and reports."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

import warmenv.bundle
from conftest import env_contents, sample_entries
from helpers import mypy_strict
from warmenv import Environment, WarmenvError, open_environment
from warmenv.bundle import (
    BundleEvent,
    BundleFinished,
    BundleProgress,
    BundleStarted,
    Event,
    ExportEvent,
    ExportReport,
    Finished,
    ImportEvent,
    ImportReport,
    NotFinishedError,
    Progress,
    Started,
    Verifying,
    export_bundle,
    exporting,
    import_bundle,
    importing,
    open_bundle,
)

pytestmark = pytest.mark.anyio

TOTAL = sum(len(items) for items in sample_entries().values())
BATCH = 16  # several batches out of the sample's 151 entries


async def entry_count(env: Environment) -> int:
    return sum(len(items) for items in (await env_contents(env)).values())


# --- the application's version in the manifest (issue 10, item 6) ------------------


async def test_an_export_without_the_applications_version_is_refused(
    warm_env: Environment, out_dir: Path
) -> None:
    out = out_dir / "b.bundle"
    with pytest.raises(TypeError, match="version"):
        await export_bundle(warm_env, out, name="b")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="application's own version"):
        await export_bundle(warm_env, out, name="b", version=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="version"):
        await export_bundle(warm_env, out, name="b", version="")
    assert list(out_dir.iterdir()) == []


async def test_the_manifest_carries_the_applications_version_never_warmenvs(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    out = out_dir / "b.bundle"
    report = await export_bundle(warm_env, out, name="b", version="7.3", format=bundle_format)
    assert report.manifest.version == "7.3"
    async with open_bundle(out) as bundle:
        assert bundle.manifest.version == "7.3"
        assert bundle.manifest.version != warmenv.__version__


def _warmenv_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warmenv", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "120"},
    )


@pytest.fixture
def source_db(tmp_path: Path) -> Path:
    root = tmp_path / "root"

    async def fill() -> None:
        async with open_environment("warm", root=root) as env:
            for namespace, items in sample_entries().items():
                await env.storage(namespace).insert_many(items.items())

    anyio.run(fill)
    return root / "warm.db"


def test_cli_export_without_app_version_is_bad_usage_and_writes_nothing(
    source_db: Path, tmp_path: Path
) -> None:
    out = tmp_path / "b.bundle"
    completed = _warmenv_cli("export", str(out), "--name", "n", str(source_db))
    assert completed.returncode == 2, completed.stderr
    assert "--app-version" in completed.stderr
    assert not out.exists()
    empty = _warmenv_cli("export", str(out), "--name", "n", "--app-version", "", str(source_db))
    assert empty.returncode == 2, empty.stderr
    assert "--app-version must not be empty" in empty.stderr
    assert not out.exists()


def test_cli_export_records_the_app_version_in_the_manifest(
    source_db: Path, tmp_path: Path
) -> None:
    out = tmp_path / "b.bundle"
    completed = _warmenv_cli(
        "export", str(out), "--name", "n", "--app-version", "2.5", str(source_db)
    )
    assert completed.returncode == 0, completed.stderr

    async def version() -> str:
        async with open_bundle(out) as bundle:
            return bundle.manifest.version

    assert anyio.run(version) == "2.5"


# --- unambiguous names (item 14) ---------------------------------------------------


async def test_the_bundle_names_are_the_classes_the_old_names_denote(
    bundle_path: Path, cold_env: Environment
) -> None:
    assert (Started, Progress, Finished) == (BundleStarted, BundleProgress, BundleFinished)
    assert Event == BundleEvent
    for name in ("BundleStarted", "BundleProgress", "BundleFinished", "BundleEvent"):
        assert name in warmenv.bundle.__all__
    async with importing(bundle_path, cold_env, batch_size=BATCH) as progress:
        kinds = [type(event) async for event in progress]
    assert kinds[0] is BundleStarted
    # The digest's steps, then the batches: each kind at least once, never mixed.
    verified = kinds[1:-1].count(Verifying)
    assert verified >= 1
    assert kinds[1 : 1 + verified] == [Verifying] * verified
    assert set(kinds[1 + verified : -1]) == {BundleProgress}
    assert kinds[-1] is BundleFinished


# --- leaving the block (item 13) ---------------------------------------------------


async def test_leaving_importing_without_reading_an_event_runs_the_whole_import(
    bundle_path: Path, cold_env: Environment
) -> None:
    async with importing(bundle_path, cold_env) as progress:
        pass
    assert progress.report.imported == TOTAL
    assert progress.report.complete
    assert await env_contents(cold_env) == sample_entries()


async def test_leaving_an_import_early_reports_what_was_committed(
    bundle_path: Path, cold_env: Environment
) -> None:
    async with importing(bundle_path, cold_env, batch_size=BATCH) as progress:
        async for event in progress:
            if isinstance(event, BundleProgress):
                break
    report = progress.report
    assert not report.complete
    assert 0 < report.imported < TOTAL
    assert report.imported == await entry_count(cold_env)
    assert report.bytes == sum(s.bytes for s in report.namespaces)
    again = await import_bundle(bundle_path, cold_env)
    assert again.complete
    assert (again.imported, again.skipped) == (TOTAL - report.imported, report.imported)


async def test_a_cancelled_import_reports_what_was_committed(
    bundle_path: Path, cold_env: Environment
) -> None:
    with anyio.CancelScope() as scope:
        async with importing(bundle_path, cold_env, batch_size=BATCH) as progress:
            async for event in progress:
                if isinstance(event, BundleProgress):
                    scope.cancel()
    assert scope.cancelled_caught
    report = progress.report
    assert not report.complete
    assert 0 < report.imported < TOTAL
    assert report.imported == await entry_count(cold_env)


async def test_a_finished_import_reports_complete(bundle_path: Path, cold_env: Environment) -> None:
    report = await import_bundle(bundle_path, cold_env, batch_size=BATCH)
    assert report.complete
    assert report.imported == TOTAL


async def test_an_import_left_with_an_error_before_any_event_runs_nothing_and_says_so(
    bundle_path: Path, cold_env: Environment
) -> None:
    with pytest.raises(KeyError):
        async with importing(bundle_path, cold_env) as progress:
            raise KeyError("the caller's own error")
    with pytest.raises(NotFinishedError, match="the import did not run") as caught:
        progress.report  # noqa: B018
    assert isinstance(caught.value, WarmenvError)
    assert await entry_count(cold_env) == 0


async def test_leaving_exporting_without_reading_an_event_publishes_the_bundle(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    out = out_dir / "b.bundle"
    async with exporting(warm_env, out, name="b", version="1", format=bundle_format) as progress:
        pass
    assert progress.report.entries == TOTAL
    assert sorted(p.name for p in out_dir.iterdir()) == ["b.bundle"]
    async with open_bundle(out) as bundle:
        await bundle.verify()


async def test_an_export_left_early_publishes_nothing_and_says_so(
    warm_env: Environment, out_dir: Path, bundle_format: str
) -> None:
    out = out_dir / "b.bundle"
    async with exporting(warm_env, out, name="b", version="1", format=bundle_format) as progress:
        async for event in progress:
            if isinstance(event, BundleStarted):
                break
    assert list(out_dir.iterdir()) == []
    with pytest.raises(NotFinishedError, match="nothing was published") as caught:
        progress.report  # noqa: B018
    assert isinstance(caught.value, WarmenvError)


# --- typed reports (item 12) ---------------------------------------------------------


async def test_events_carry_the_report_of_their_direction(
    warm_env: Environment, cold_env: Environment, out_dir: Path
) -> None:
    out = out_dir / "b.bundle"
    async with exporting(warm_env, out, name="b", version="1") as export_progress:
        exported: list[ExportEvent] = [event async for event in export_progress]
    async with importing(out, cold_env) as import_progress:
        imported: list[ImportEvent] = [event async for event in import_progress]
    last_export, last_import = exported[-1], imported[-1]
    assert isinstance(last_export, BundleFinished)
    assert isinstance(last_export.report, ExportReport)
    assert isinstance(last_import, BundleFinished)
    assert isinstance(last_import.report, ImportReport)


TYPED_IMPORT_LOOP = """
from pathlib import Path

from warmenv import Environment
from warmenv.bundle import BundleFinished, Finished, importing


async def imported(path: Path, env: Environment) -> int:
    count = 0
    async with importing(path, env) as progress:
        async for event in progress:
            if isinstance(event, BundleFinished):
                count += event.report.imported
            if isinstance(event, Finished):
                count += event.report.skipped
    return count + progress.report.imported
"""

WRONG_DIRECTION = """
from pathlib import Path

from warmenv import Environment
from warmenv.bundle import BundleFinished, exporting, importing


async def wrong(path: Path, env: Environment) -> None:
    async with importing(path, env) as progress:
        async for event in progress:
            if isinstance(event, BundleFinished):
                print(event.report.manifest)
    async with exporting(env, path, name="n", version="1") as out:
        async for done in out:
            if isinstance(done, BundleFinished):
                print(done.report.imported)
"""


def test_mypy_strict_types_the_report_by_direction(tmp_path: Path) -> None:
    report = mypy_strict(
        {
            "typed_import_loop": textwrap.dedent(TYPED_IMPORT_LOOP),
            "wrong_direction": textwrap.dedent(WRONG_DIRECTION),
        },
        tmp_path,
    )
    output = "\n".join(report["typed_import_loop"] + report["wrong_direction"])
    errors = [line for line in output.splitlines() if ": error:" in line]
    assert not [e for e in errors if "typed_import_loop.py" in e], output
    wrong = [e for e in errors if "wrong_direction.py" in e]
    assert len(wrong) == 2, output
    assert '"ImportReport" has no attribute "manifest"' in wrong[0]
    assert '"ExportReport" has no attribute "imported"' in wrong[1]
