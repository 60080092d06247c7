"""Schema 1 to 2 upgrade and gc to a size bound, next to raw SQLite, measured in one run.

Run: python benchmarks/bench_schema.py [--entries 1000000]

Each figure is measured in a fresh child process (so its memory is its own),
on a file built inside SQLite (so building it costs the child nothing). The
upgrade is timed from opening the version-1 file to having it open at
version 2, beside raw sqlite3 copying the same rows into a table of the new
shape; gc to half the size (a tenth of the entries carrying a recency)
beside raw sqlite3 deleting the same rows by rowid. Rates are the file's
entries over the time taken. One run of each: slow on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import MEMORY_PROBE, Row, print_table

V1_DDL = (
    "CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
    "origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))",
)
VALUE_BYTES = 100


def build_v1(path: Path, n: int) -> None:
    """A version-1 environment of `n` entries (100-byte values, 50 namespaces), as 0.1 made it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for statement in V1_DDL:
        conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.execute("BEGIN")
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO entries SELECT 'bench/1/ns' || (i % 50), CAST(printf('%010d', i) AS BLOB), "
        f"randomblob({VALUE_BYTES}), i % 2 FROM n",
        (n - 1,),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def run_child(code: str, *args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE + textwrap.dedent(code), *args],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


_UPGRADE_CHILD = """
import json, sys, time
import anyio
from pathlib import Path
from warmenv.persistence.sqlite.database import open_database

async def main():
    path = Path(sys.argv[1])
    start = time.perf_counter()
    db = await open_database(path)
    elapsed = time.perf_counter() - start
    await db.close()
    print(json.dumps({"seconds": elapsed}))

anyio.run(main)
"""

# The baseline: what rebuilding the table (0.1's drop-and-rebuild, or a copy
# into the new shape) costs for the same file, in raw sqlite3.
_REBUILD_CHILD = """
import json, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
start = time.perf_counter()
conn.execute("BEGIN IMMEDIATE")
conn.execute(
    "CREATE TABLE entries2 (namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
    "origin INTEGER NOT NULL, written_at REAL, cost REAL, bundle INTEGER, last_hit INTEGER, "
    "PRIMARY KEY (namespace, key))"
)
conn.execute(
    "INSERT INTO entries2 (namespace, key, value, origin) "
    "SELECT namespace, key, value, origin FROM entries"
)
conn.execute("DROP TABLE entries")
conn.execute("ALTER TABLE entries2 RENAME TO entries")
conn.execute("COMMIT")
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

_GC_CHILD = """
import json, sys, time
import anyio
from warmenv import open_environment

async def main():
    path, bound = sys.argv[1], int(sys.argv[2])
    async with open_environment(file=path) as env:
        rss = rss_mib()
        start = time.perf_counter()
        purged = await env.gc(max_bytes=bound)
        elapsed = time.perf_counter() - start
        peak = peak_mib()
    print(json.dumps({"seconds": elapsed, "evicted": purged.count, "growth_mib": peak - rss}))

anyio.run(main)
"""

# The baseline: deleting the same rows gc evicted, by rowid, nothing to order
# or sum. Which rows those are is worked out before the clock starts (the
# rowids the gc'd copy no longer holds).
_DELETE_CHILD = """
import json, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("ATTACH ? AS done", (sys.argv[2],))
conn.execute("CREATE TEMP TABLE doomed (r INTEGER PRIMARY KEY)")
conn.execute(
    "INSERT INTO doomed SELECT rowid FROM main.entries EXCEPT SELECT rowid FROM done.entries"
)
conn.execute("DETACH done")
count = conn.execute("SELECT count(*) FROM doomed").fetchone()[0]
start = time.perf_counter()
conn.execute("BEGIN IMMEDIATE")
deleted = conn.execute("DELETE FROM entries WHERE rowid IN (SELECT r FROM doomed)").rowcount
conn.execute("COMMIT")
elapsed = time.perf_counter() - start
assert deleted == count, (deleted, count)
print(json.dumps({"seconds": elapsed, "deleted": deleted}))
"""


def mark_hits(path: Path) -> None:
    """Give a tenth of the entries a recency, so eviction orders by it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE entries SET last_hit = 1000 + rowid % 97 WHERE rowid % 10 = 0")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    args = parser.parse_args()
    n = args.entries
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / "v1.db"
        build_v1(built, n)

        upgraded = Path(tmp) / "upgrade.db"
        shutil.copyfile(built, upgraded)
        up = run_child(_UPGRADE_CHILD, str(upgraded))
        rebuilt = Path(tmp) / "rebuild.db"
        shutil.copyfile(built, rebuilt)
        rebuild = run_child(_REBUILD_CHILD, str(rebuilt))
        rows.append(
            Row(
                f"schema 1 to 2 upgrade, {n:,} entries",
                n / up["seconds"],
                "entries/s",
                "raw sqlite3 INSERT INTO new SELECT FROM old (the table rebuilt), one transaction",
                n / rebuild["seconds"],
                ">= 300,000 entries/s",
            )
        )

        # gc to half the size over the upgraded file.
        mark_hits(upgraded)
        bound = n * (VALUE_BYTES + 10) // 2
        gc_file = Path(tmp) / "gc.db"
        shutil.copyfile(upgraded, gc_file)
        gc = run_child(_GC_CHILD, str(gc_file), str(bound))
        deleted = Path(tmp) / "delete.db"
        shutil.copyfile(upgraded, deleted)
        delete = run_child(_DELETE_CHILD, str(deleted), str(gc_file))
        assert delete["deleted"] == gc["evicted"], (delete, gc)
        rows.append(
            Row(
                f"gc to half the size, {n:,} entries ({int(gc['evicted']):,} evicted)",
                n / gc["seconds"],
                "entries/s",
                "raw sqlite3 DELETE of the same rows by rowid, one transaction",
                n / delete["seconds"],
                ">= 200,000 entries/s",
            )
        )
        rows.append(
            Row(
                "gc: peak RSS growth",
                gc["growth_mib"],
                "MiB",
                "bound",
                32.0,
                "< 32 MiB",
            )
        )
    print_table("Schema upgrade and gc", rows)


if __name__ == "__main__":
    main()
