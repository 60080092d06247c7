"""A SQLite bundle copied in bulk imports the namespaces of the application's open stores first.

Issue 21, item 6: the keys a service needed sorted last, so they were computed
before the import reached them. The entry-by-entry import already took the
open stores' namespaces first; the bulk copy of a SQLite bundle (INSERT ...
SELECT over rowid ranges) followed row order. Now it copies those namespaces'
rows first, then the others, each row in one pass only (so the report counts
each entry once), whether the namespace's rows are one run of rowids (as
export writes them) or spread through the file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio.to_thread
import pytest

from warmenv import Namespace, open_environment
from warmenv.blocking import export_bundle as export_blocking
from warmenv.blocking import open_environment as open_blocking
from warmenv.bundle import ImportReport, importing
from warmenv.bundle.events import Progress

pytestmark = pytest.mark.anyio

BEFORE = Namespace("aaa", "early", version="1")
SERVED = Namespace("mmm", "served", version="1")
AFTER = Namespace("zzz", "late", version="1")
ENTRIES = 20


def three(tmp_path: Path, interleaved: bool) -> Path:
    """A SQLite bundle of three namespaces; the service asks for the middle one."""
    with open_blocking(file=tmp_path / "ci.db") as ci:
        for namespace in (BEFORE, SERVED, AFTER):
            store = ci.store(namespace)
            for i in range(ENTRIES):
                store.insert(f"k{i:02d}", i)
    out = tmp_path / "three.bundle"
    export_blocking(tmp_path / "ci.db", out, name="three", version="1", format="sqlite")
    if interleaved:  # each namespace's rows spread through the file
        with sqlite3.connect(out) as conn:
            rows = conn.execute("SELECT * FROM entries ORDER BY key, namespace").fetchall()
            conn.execute("DELETE FROM entries")
            conn.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?)", rows)
        conn.close()
    return out


@pytest.fixture(params=["in key order", "interleaved"])
def bundle(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return three(tmp_path, request.param == "interleaved")


async def imported_in_order(
    bundle: Path, env_file: Path, opened: list[Namespace]
) -> tuple[list[str], ImportReport]:
    """The namespaces in the order the import's batches reached them, and its report."""
    async with open_environment(file=env_file) as env:
        for namespace in opened:
            await env.store(namespace)
        async with importing(bundle, env, batch_size=5) as progress:
            seen = [e.namespace async for e in progress if isinstance(e, Progress)]
        return list(dict.fromkeys(seen)), progress.report


async def test_a_bulk_copy_takes_the_namespaces_of_open_stores_first(
    bundle: Path, tmp_path: Path
) -> None:
    order, report = await imported_in_order(bundle, tmp_path / "serving.db", [SERVED])
    assert order[0] == str(SERVED)
    assert report.imported == 3 * ENTRIES and report.skipped == 0
    assert {s.namespace: s.entries for s in report.namespaces} == {
        str(n): ENTRIES for n in (BEFORE, SERVED, AFTER)
    }


async def test_a_bulk_copy_without_open_stores_keeps_row_order(tmp_path: Path) -> None:
    made = await anyio.to_thread.run_sync(three, tmp_path, False)
    order, _ = await imported_in_order(made, tmp_path / "cold.db", [])
    assert order == [str(BEFORE), str(SERVED), str(AFTER)]


async def test_a_bulk_copy_run_again_counts_each_entry_once(bundle: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "serving.db"
    await imported_in_order(bundle, env_file, [SERVED])
    _, again = await imported_in_order(bundle, env_file, [SERVED, AFTER])
    assert again.imported == 0 and again.skipped == 3 * ENTRIES
