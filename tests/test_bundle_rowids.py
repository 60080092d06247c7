"""An import does not depend on where a SQLite bundle's rowids lie (issue 22, defect 14).

Export writes rowids without gaps, but a bundle is input: one made otherwise
may space its rows 10^11 apart. The bulk copy went by ranges of `batch_size`
rowids, so such a file took one transaction per entry (20,000 entries: 9.8 s,
about ten times the same entries with dense rowids). These tests count the
work instead of timing it: the batches (one progress step and one transaction
each) of an import of sparse rowids are those of the same entries dense.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from warmenv import Namespace, open_environment
from warmenv.bundle import BundleProgress, export_bundle, importing

pytestmark = pytest.mark.anyio

NS = Namespace("app", "rows", version="1")
ENTRIES = 3_000
BATCH = 100


async def _dense_bundle(root: Path) -> Path:
    async with open_environment("source", root=root) as env:
        await env.storage(NS).insert_many((b"k%06d" % i, b"v%d" % i) for i in range(ENTRIES))
        path = root / "dense.bundle"
        await export_bundle(env, path, name="rows", version="1", format="sqlite")
    return path


def _respaced(dense: Path, out: Path, rowid: str) -> Path:
    """`dense` with each row's rowid set to `rowid` (SQL over the old one, `:r`), its content
    and the order of its rows unchanged."""
    out.write_bytes(dense.read_bytes())
    conn = sqlite3.connect(out)
    try:
        # Descending, so that no new rowid lands on a row not yet moved.
        ids = [r[0] for r in conn.execute("SELECT rowid FROM entries ORDER BY rowid DESC")]
        for old in ids:
            conn.execute(f"UPDATE entries SET rowid = {rowid} WHERE rowid = :r", {"r": old})
        conn.commit()
    finally:
        conn.close()
    return out


async def _batches(bundle: Path, root: Path, name: str, *, verify: bool) -> tuple[int, int]:
    """(batches, entries imported) of importing `bundle` into a fresh environment."""
    async with open_environment(name, root=root) as env:
        async with importing(bundle, env, batch_size=BATCH, verify=verify) as progress:
            steps = [e async for e in progress if isinstance(e, BundleProgress)]
        assert progress.report.complete
        return len(steps), progress.report.imported


@pytest.mark.parametrize("verify", [True, False], ids=["digest checked", "verify=False"])
@pytest.mark.parametrize(
    "spacing",
    ["rowid * 100000000000", "rowid * 100000000000 - 9000000000000000000", "rowid * rowid * 7"],
    ids=["10^11 apart", "negative and 10^11 apart", "ever wider gaps"],
)
async def test_an_import_takes_as_many_batches_whatever_the_rowids_spacing(
    tmp_path: Path, spacing: str, verify: bool
) -> None:
    dense = await _dense_bundle(tmp_path)
    sparse = _respaced(dense, tmp_path / "sparse.bundle", spacing.replace("rowid", ":r"))
    conn = sqlite3.connect(sparse)
    try:
        low, high = conn.execute("SELECT min(rowid), max(rowid) FROM entries").fetchone()
    finally:
        conn.close()
    assert high - low > 1_000 * ENTRIES  # the test's premise: far from dense
    expected = (math.ceil(ENTRIES / BATCH), ENTRIES)
    assert await _batches(dense, tmp_path, "dense", verify=verify) == expected
    assert await _batches(sparse, tmp_path, "sparse", verify=verify) == expected


async def test_a_batch_size_of_one_row_still_copies_every_sparse_row(tmp_path: Path) -> None:
    dense = await _dense_bundle(tmp_path)
    sparse = _respaced(dense, tmp_path / "sparse.bundle", ":r * 100000000000")
    async with open_environment("one", root=tmp_path) as env:
        async with importing(sparse, env, batch_size=1) as progress:
            steps = [e async for e in progress if isinstance(e, BundleProgress)]
        assert progress.report.imported == ENTRIES
        assert len(steps) == ENTRIES
        got = await env.storage(NS).get_many([b"k%06d" % i for i in (0, 1, ENTRIES - 1)])
        assert got == {b"k%06d" % i: b"v%d" % i for i in (0, 1, ENTRIES - 1)}


@pytest.mark.parametrize("verify", [True, False], ids=["digest checked", "verify=False"])
async def test_rows_from_the_lowest_rowid_on_import_whole(tmp_path: Path, verify: bool) -> None:
    # The open reads each row beside the row of the rowid before it (`rowid - 1`), which
    # for the lowest rowid SQLite has overflows (to a REAL): no row, not the row itself.
    dense = await _dense_bundle(tmp_path)
    lowest = _respaced(dense, tmp_path / "lowest.bundle", f":r - 2 - {(1 << 63) - 1}")
    conn = sqlite3.connect(lowest)
    try:
        assert conn.execute("SELECT min(rowid) FROM entries").fetchone() == (-(1 << 63),)
    finally:
        conn.close()
    assert await _batches(lowest, tmp_path, "lowest", verify=verify) == (
        math.ceil(ENTRIES / BATCH),
        ENTRIES,
    )
