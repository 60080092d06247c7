"""`import_bundle(..., share=)`: a big import leaves the rest of the time to the service.

After each batch the import pauses for `busy * (1 - share) / share`, so it
holds the loop and the environment's connection at most `share` of the
time. The rule is pinned with a clock the test drives; real imports show
the pauses in their report and still import everything, in both formats,
in bulk and by scan, on every backend.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from conftest import sample_entries
from warmenv import open_environment
from warmenv.bundle import import_bundle
from warmenv.bundle.importing import Pace

TOTAL = sum(len(items) for items in sample_entries().values())


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pause_is_the_busy_time_scaled_by_the_share() -> None:
    clock = Clock()
    pace = Pace(0.25, clock)
    clock.now += 0.2  # a batch took 0.2 s
    assert pace.pause() == pytest.approx(0.6)  # so 0.2 s of every 0.8 s is the import's
    assert Pace(1.0, clock).pause() == 0.0


@pytest.mark.anyio
async def test_a_share_of_one_never_pauses() -> None:
    clock = Clock()
    pace = Pace(1.0, clock)
    clock.now += 5.0
    assert await pace.rest() == 0.0


@pytest.mark.anyio
async def test_each_pause_counts_from_the_end_of_the_last_one() -> None:
    clock = Clock()
    pace = Pace(0.5, clock)
    clock.now += 0.01
    await pace.rest()  # paused 0.01 s of real time; the test's clock stood still
    clock.now += 0.002
    assert pace.pause() == pytest.approx(0.002)  # only the batch since then counts


@pytest.mark.anyio
@pytest.mark.parametrize("validate", [None, lambda ns, k, v: True], ids=["bulk", "scan"])
async def test_a_paced_import_imports_everything_and_reports_its_pauses(
    bundle_path: Path, root: Path, validate: object
) -> None:
    async with open_environment("svc", root=root) as env:
        report = await import_bundle(
            bundle_path,
            env,
            batch_size=16,
            share=0.5,
            validate=validate,  # type: ignore[arg-type]
        )
        assert report.imported == TOTAL and report.complete
        assert 0 < report.paused < report.elapsed
        unpaced = await import_bundle(bundle_path, env, batch_size=16)
        assert unpaced.paused == 0.0 and unpaced.skipped == TOTAL


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (0, ValueError),
        (-0.5, ValueError),
        (1.5, ValueError),
        (float("nan"), ValueError),
        (True, TypeError),  # not a number: a wrong type is TypeError, as for version=
        ("half", TypeError),
    ],
)
async def test_a_share_outside_zero_to_one_is_refused(
    bundle_path: Path, root: Path, bad: object, error: type[Exception]
) -> None:
    async with open_environment("svc", root=root) as env:
        with pytest.raises(error, match="share must be"):
            await import_bundle(bundle_path, env, share=bad)  # type: ignore[arg-type]
        assert await env.namespaces() == []


async def _warmenv(*args: str) -> tuple[int, str, str]:
    """`python -m warmenv ARGS`, as a user runs it: exit status, stdout, stderr."""
    done = await anyio.run_process(
        [sys.executable, "-m", "warmenv", *args],
        check=False,
        env={**os.environ, "COLUMNS": "120"},
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.anyio
async def test_the_command_line_import_takes_a_share(bundle_path: Path, root: Path) -> None:
    status, out, err = await _warmenv(
        "import", str(bundle_path), "--share", "0.5", "--env", "svc", "--root", str(root), "--json"
    )
    assert status == 0, err
    report = json.loads(out)
    assert report["imported"] == TOTAL and 0 < report["paused"] < report["elapsed"]


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["0", "half"])
async def test_a_command_line_share_outside_zero_to_one_is_bad_usage(
    bundle_path: Path, tmp_path: Path, bad: str
) -> None:
    root = tmp_path / "svc-root"
    status, _, err = await _warmenv(
        "import", str(bundle_path), "--share", bad, "--env", "svc", "--root", str(root)
    )
    assert status == 2
    assert f"--share: {bad!r} is not a fraction of the time in (0, 1]" in err
    assert not root.exists()  # refused before anything was created
