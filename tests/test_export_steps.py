"""An export's step holds at most a few MiB of entries, whatever their size (issue 23).

A step is one hop to a worker thread, one batch for the digest's thread and
one progress event. By entries alone (1,024 a step), 1,024 entries of 10 MiB
put 10 GiB in memory in one step. These tests count the steps (progress
events) instead of measuring memory: large entries take several steps, each
of at most `STEP_BYTES` (one entry larger than that is a step of its own),
in both formats and from one source or several.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from warmenv import Environment, Namespace, open_environment
from warmenv.bundle import BundleProgress, exporting, open_bundle

pytestmark = pytest.mark.anyio

NS = Namespace("app", "steps", version="1")
STEP_BYTES = 4 << 20  # warmenv.bundle.exporting's
LARGE = 1 << 20  # bytes of each large value
FORMATS = ["sqlite", "flat"]


async def _steps(sources: Environment | list[Environment], out: Path, fmt: str) -> list[int]:
    """The bytes of keys and values each step of the export wrote."""
    async with exporting(sources, out, name="steps", version="1", format=fmt) as progress:
        steps = [e async for e in progress if isinstance(e, BundleProgress)]
    assert progress.report.entries == steps[-1].entries_done
    done = [0, *(step.bytes_done for step in steps)]
    return [after - before for before, after in itertools.pairwise(done)]


async def _entries(out: Path) -> int:
    async with open_bundle(out) as bundle:
        return sum(s.entries for s in await bundle.namespaces())


@pytest.mark.parametrize("fmt", FORMATS)
async def test_an_export_of_large_entries_takes_a_step_per_few_mib(
    tmp_path: Path, fmt: str
) -> None:
    count = 4 * STEP_BYTES // LARGE  # four steps' worth, in far fewer than 1,024 entries
    async with open_environment("large", root=tmp_path) as env:
        await env.storage(NS).insert_many((b"k%04d" % i, bytes([i]) * LARGE) for i in range(count))
        steps = await _steps(env, tmp_path / f"large.{fmt}", fmt)
    assert len(steps) >= 4
    assert max(steps) <= STEP_BYTES
    assert await _entries(tmp_path / f"large.{fmt}") == count


async def test_an_export_of_several_sources_steps_by_bytes_too(tmp_path: Path) -> None:
    count = 2 * STEP_BYTES // LARGE
    async with (
        open_environment("one", root=tmp_path) as one,
        open_environment("two", root=tmp_path) as two,
    ):
        await one.storage(NS).insert_many((b"a%04d" % i, b"1" * LARGE) for i in range(count))
        await two.storage(NS).insert_many((b"b%04d" % i, b"2" * LARGE) for i in range(count))
        steps = await _steps([one, two], tmp_path / "both.bundle", "sqlite")
    assert len(steps) >= 4
    assert max(steps) <= STEP_BYTES
    assert await _entries(tmp_path / "both.bundle") == 2 * count
