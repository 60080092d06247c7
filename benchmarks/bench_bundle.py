"""Bundle import and export next to a raw sqlite3 copy, in one run.

Run: python benchmarks/bench_bundle.py [--entries 100000] [--large]
--large also measures peak RSS growth importing and exporting a 1 GiB bundle
(about a minute; not run in CI).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _report import MEMORY_PROBE, Row, per_call_us, print_table
from warmenv import Namespace, open_environment
from warmenv.bundle import FlatBundle, _files, export_bundle, import_bundle

NS = Namespace("bench", "bundle", version="1")


def keys(n: int) -> list[bytes]:
    return [b"key-%08d" % i for i in range(n)]


async def make_source(root: Path, n: int, size: int) -> Path:
    async with open_environment("source", root=root) as env:
        storage = env.storage(NS)
        for start in range(0, n, 50_000):
            chunk = keys(n)[start : start + 50_000]
            await storage.insert_many((k, os.urandom(size)) for k in chunk)
        return env.path


def raw_copy_per_s(bundle: Path, target_dir: Path, n: int) -> float:
    """The baseline: ATTACH and INSERT OR IGNORE ... SELECT with a column list."""
    target = target_dir / "raw-target.db"
    conn = sqlite3.connect(target, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,"
        " origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))"
    )
    start = time.perf_counter()
    conn.execute("ATTACH DATABASE ? AS b", (str(bundle),))
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT OR IGNORE INTO main.entries (namespace, key, value, origin) "
        "SELECT namespace, key, value, 1 FROM b.entries"
    )
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    target.unlink()
    return n / elapsed


async def import_per_s(bundle: Path, root: Path, name: str, n: int, verify: bool) -> float:
    async with open_environment(name, root=root) as env:
        start = time.perf_counter()
        report = await import_bundle(bundle, env, verify=verify)
        elapsed = time.perf_counter() - start
    assert report.imported == n, report
    return n / elapsed


def private_copy_s(bundle: Path, near: Path) -> float:
    """Seconds to copy the bundle into a private directory, as every import does first."""
    fd = _files.open_regular(bundle)
    try:
        start = time.perf_counter()
        copy = _files.copy_to_private(fd, near, "bundle")
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    _files.remove_private(copy)
    return elapsed


async def export_per_s(source: Path, out: Path, fmt: str, n: int) -> float:
    start = time.perf_counter()
    report = await export_bundle(source, out, name="bench", version="1", format=fmt)
    elapsed = time.perf_counter() - start
    assert report.entries == n
    return n / elapsed


async def flat_get_us(path: Path, n: int) -> float:
    ks = keys(n)
    random.shuffle(ks)
    # Keys in a shuffled cycle: random order, without timing the RNG with the get.
    next_key = itertools.cycle(ks).__next__
    async with FlatBundle.open(path) as bundle:

        async def one() -> None:
            await bundle.get(NS, next_key())

        return await per_call_us(one, 20_000)


_RSS_CHILD = MEMORY_PROBE + textwrap.dedent(
    """
    import sys, anyio
    from pathlib import Path
    from warmenv import open_environment
    from warmenv.bundle import export_bundle, import_bundle

    async def main():
        root = Path(sys.argv[1])
        before = rss_mib()
        if sys.argv[2] == "export":
            await export_bundle(root / "source.db", root / sys.argv[3], name="large", version="1",
                                format=sys.argv[4])
        else:
            async with open_environment("imported-" + sys.argv[4], root=root) as env:
                await import_bundle(root / sys.argv[3], env)
        print(peak_mib() - before)

    anyio.run(main)
    """
)


def rss_growth(root: Path, action: str, bundle: str, fmt: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(root), action, bundle, fmt],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


async def bench(root: Path, n: int) -> list[Row]:
    source = await make_source(root, n, 1024)
    sqlite_bundle = root / "b.sqlite"
    flat_bundle = root / "b.flat"
    # Every figure is the best of three, like its baseline, so that no figure
    # is the one run that met a cold cache or a busy moment of the machine.
    # The three rounds interleave every measure with the baseline, so that a
    # change of load on a shared machine reaches the baseline and the
    # figures alike instead of whichever block happened to run then.
    runs: dict[str, list[float]] = {}

    def record(measure: str, value: float) -> None:
        runs.setdefault(measure, []).append(value)

    for i in range(3):
        record("export sqlite", await export_per_s(source, sqlite_bundle, "sqlite", n))
        record("export flat", await export_per_s(source, flat_bundle, "flat", n))
        record("baseline", raw_copy_per_s(sqlite_bundle, root, n))
        record("no digest", await import_per_s(sqlite_bundle, root, f"plain{i}", n, verify=False))
        record(
            "with digest", await import_per_s(sqlite_bundle, root, f"checked{i}", n, verify=True)
        )
        record("flat import", await import_per_s(flat_bundle, root, f"flat{i}", n, verify=True))
        # The private copy on its own (it is part of every import above).
        record("copy sqlite", private_copy_s(sqlite_bundle, root) * 1e3)
        record("copy flat", private_copy_s(flat_bundle, root) * 1e3)
    export_sqlite, export_flat = max(runs["export sqlite"]), max(runs["export flat"])
    baseline = max(runs["baseline"])
    no_digest, with_digest = max(runs["no digest"]), max(runs["with digest"])
    flat_import = max(runs["flat import"])
    copy_sqlite, copy_flat = min(runs["copy sqlite"]), min(runs["copy flat"])
    get = await flat_get_us(flat_bundle, n)
    # The copy beside the import it is part of: the ratio is its share of that import's time.
    unit = "entries/s"
    raw = "raw sqlite3 ATTACH + INSERT OR IGNORE"
    return [
        Row("import SQLite bundle, verify=False", no_digest, unit, raw, baseline, ">= 0.9x"),
        Row("import SQLite bundle, digest checked", with_digest, unit, raw, baseline, ">= 0.75x"),
        Row("import flat bundle, digest checked", flat_import, unit, raw, baseline, ""),
        Row("export to SQLite", export_sqlite, unit, raw, baseline, ">= 0.9x"),
        Row("export to flat", export_flat, unit, raw, baseline, ">= 0.5x"),
        Row(f"flat get, {n:,} entries", get, "µs", "target", 4.0, "< 4 µs"),
        Row(
            "private copy of the SQLite bundle",
            copy_sqlite,
            "ms",
            "import SQLite bundle, verify=False",
            n / no_digest * 1e3,
            "",
        ),
        Row(
            "private copy of the SQLite bundle",
            copy_sqlite,
            "ms",
            "import SQLite bundle, digest checked",
            n / with_digest * 1e3,
            "",
        ),
        Row(
            "private copy of the flat bundle",
            copy_flat,
            "ms",
            "import flat bundle, digest checked",
            n / flat_import * 1e3,
            "",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--large", action="store_true", help="also the 1 GiB memory runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = anyio.run(bench, Path(tmp), args.entries)
    if args.large:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            n = 1024 * 1024  # 1 GiB of 1 KiB values
            anyio.run(make_source, root, n, 1024)
            for fmt in ("sqlite", "flat"):
                exported = rss_growth(root, "export", f"large.{fmt}", fmt)
                imported = rss_growth(root, "import", f"large.{fmt}", fmt)
                rows.append(
                    Row(
                        f"export 1 GiB to {fmt}: peak RSS growth",
                        exported,
                        "MiB",
                        "target",
                        64.0,
                        "< 64 MiB",
                    )
                )
                rows.append(
                    Row(
                        f"import 1 GiB {fmt} bundle: peak RSS growth",
                        imported,
                        "MiB",
                        "target",
                        64.0,
                        "< 64 MiB",
                    )
                )
    print_table("bench_bundle", rows)


if __name__ == "__main__":
    main()
