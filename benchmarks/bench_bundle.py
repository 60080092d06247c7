"""Bundle import and export next to a raw sqlite3 copy, in one run.

Run: python benchmarks/bench_bundle.py [--entries 100000] [--rounds 5] [--large]
                                       [--get-only | --export-only]
Each row is the median of --rounds measurements, its baseline's too, taken in
alternating order in the same rounds; the single figures go to stderr.
--large also measures peak RSS growth importing and exporting a 1 GiB bundle
(about a minute; not run in CI).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import mmap
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _report import MEMORY_PROBE, Row, per_call_us, print_table
from warmenv import Namespace, open_environment
from warmenv.bundle import FlatBundle, _files, export_bundle, import_bundle, open_bundle
from warmenv.bundle.sqlite import schema as bundle_schema

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


def raw_export_per_s(source: Path, target_dir: Path, n: int) -> float:
    """The export's floor: the same copy from the environment file, in raw sqlite3.

    A file of the bundle's table (format 2), written as an export's staging
    file is (no journal, no syncs until the end), filled by one INSERT ...
    SELECT in key order from the attached environment, then switched to
    journal mode DELETE and synced, as a finished bundle is. No digest, no
    manifest: the copy alone.
    """
    target = target_dir / "raw-export.db"
    start = time.perf_counter()
    conn = sqlite3.connect(target, isolation_level=None)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    bundle_schema.create(conn, 2)
    conn.execute("ATTACH DATABASE ? AS s", (f"{source.resolve().as_uri()}?mode=ro",))
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO main.entries (namespace, key, value, origin, written_at, cost) "
        "SELECT namespace, key, value, 1, written_at, cost FROM s.entries "
        "ORDER BY namespace, key"
    )
    conn.execute("COMMIT")
    conn.execute("DETACH DATABASE s")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    with open(target, "rb+") as handle:
        os.fsync(handle.fileno())
    elapsed = time.perf_counter() - start
    target.unlink()
    return n / elapsed


def raw_digested_export_per_s(source: Path, target_dir: Path, n: int) -> float:
    """What a verified export cannot do without: the raw copy, and beside it on a
    second thread every row read back into Python and hashed with blake2b.

    A bundle's digest covers every byte it carries, so an export reads each
    row once more than the copy does and hashes it; here the two run side by
    side on two threads (sqlite3 and hashlib both let go of the GIL), with no
    framing of the digest's input and no manifest: the least such an export does.
    """
    done: list[BaseException] = []

    def digest_rows() -> None:
        try:
            conn = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
            digest = hashlib.blake2b()
            rows = conn.execute(
                "SELECT namespace, key, value, written_at, cost FROM entries "
                "ORDER BY namespace, key"
            )
            while batch := rows.fetchmany(1024):
                for namespace, key, value, _, _ in batch:
                    digest.update(namespace.encode())
                    digest.update(key)
                    digest.update(value)
            conn.close()
        except BaseException as exc:  # re-raised on the main thread
            done.append(exc)

    start = time.perf_counter()
    hashing = threading.Thread(target=digest_rows)
    hashing.start()
    copy_s = n / raw_export_per_s(source, target_dir, n)
    hashing.join()
    elapsed = time.perf_counter() - start
    if done:
        raise done[0]
    assert elapsed >= copy_s
    return n / elapsed


def digest_pass_s(bundle: Path) -> float:
    """Seconds of the digest pass alone over the SQLite bundle (opened, not imported):
    what a digest-checked import must finish before its first commit."""

    async def run() -> float:
        async with open_bundle(bundle) as opened:
            start = time.perf_counter()
            await opened.compute_digest()
            return time.perf_counter() - start

    return anyio.run(run)


async def import_per_s(bundle: Path, root: Path, name: str, n: int, verify: bool) -> float:
    async with open_environment(name, root=root) as env:
        start = time.perf_counter()
        report = await import_bundle(bundle, env, verify=verify)
        elapsed = time.perf_counter() - start
        path = env.path
    assert report.imported == n, report
    # Removed like the baseline's target: every round writes a fresh file, and
    # the disk does not fill with one environment per round.
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)
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


async def sqlite_get_us(source: Path, n: int) -> float:
    """The floor of a flat get: a sqlite3 point lookup on one connection, same rows."""
    ks = keys(n)
    random.shuffle(ks)
    next_key = itertools.cycle(ks).__next__
    conn = sqlite3.connect(source)
    query = "SELECT value FROM entries WHERE namespace = ? AND key = ?"
    namespace = NS.full
    try:

        async def one() -> None:
            conn.execute(query, (namespace, next_key())).fetchone()

        return await per_call_us(one, 20_000)
    finally:
        conn.close()


async def least_async_get_us(n: int) -> float:
    """What no async get can beat: a coroutine that does one dict lookup and one slice.

    The same keys in the same shuffled cycle, each to a 1 KiB value in an
    anonymous mmap; no check of the key, no namespace, no cancellation. It
    shows what part of the sqlite3 lookup an `await bundle.get(...)` can reach
    at all: the coroutine's call and the value's copy are in every get.
    """
    ks = keys(n)
    data = mmap.mmap(-1, n * 1024)
    offsets = {key: i * 1024 for i, key in enumerate(ks)}
    random.shuffle(ks)
    next_key = itertools.cycle(ks).__next__

    async def get(key: bytes) -> bytes | None:
        at = offsets.get(key, -1)
        return None if at < 0 else data[at : at + 1024]

    async def one() -> None:
        await get(next_key())

    try:
        return await per_call_us(one, 20_000)
    finally:
        data.close()


async def flat_get_beside_floors(path: Path, source: Path, n: int) -> tuple[float, float, float]:
    """The flat get, its floor and the least async get, three times, the order turned
    each time; the run whose get-to-floor ratio is the median."""
    measures: list[Callable[[], Awaitable[float]]] = [
        lambda: flat_get_us(path, n),
        lambda: sqlite_get_us(source, n),
        lambda: least_async_get_us(n),
    ]
    runs = []
    for i in range(3):
        timed = {}
        for at in [*range(i, 3), *range(i)]:
            timed[at] = await measures[at]()
        get, floor, least = timed[0], timed[1], timed[2]
        runs.append((get / floor, get, floor, least))
    _, get, floor, least = sorted(runs)[1]
    return get, floor, least


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


def in_child(what: str, *args: object) -> float:
    """One measure (`child`) in a fresh process of this script: its figure."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", what, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


def child(what: str, args: list[str]) -> float:
    """The measure `in_child` asked for, in this process."""
    if what == "raw":
        return raw_copy_per_s(Path(args[0]), Path(args[1]), int(args[2]))
    if what == "raw export":
        return raw_export_per_s(Path(args[0]), Path(args[1]), int(args[2]))
    if what == "raw digested export":
        return raw_digested_export_per_s(Path(args[0]), Path(args[1]), int(args[2]))
    if what == "digest":
        return digest_pass_s(Path(args[0]))
    if what == "export":
        source, out, fmt, n = Path(args[0]), Path(args[1]), args[2], int(args[3])
        return anyio.run(export_per_s, source, out, fmt, n)
    bundle, root, name, n, verify = Path(args[0]), Path(args[1]), args[2], int(args[3]), args[4]
    return anyio.run(import_per_s, bundle, root, name, n, verify == "1")


def rss_growth(root: Path, action: str, bundle: str, fmt: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(root), action, bundle, fmt],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


async def bench_get(root: Path, n: int) -> list[Row]:
    source = await make_source(root, n, 1024)
    flat_bundle = root / "b.flat"
    await export_per_s(source, flat_bundle, "flat", n)
    return flat_get_rows(n, *await flat_get_beside_floors(flat_bundle, source, n))


def flat_get_rows(n: int, get: float, floor: float, least: float) -> list[Row]:
    """The flat get beside its floor, and beside what any async get can reach."""
    point_lookup = "sqlite3 point lookup, one connection, same rows"
    least_get = "the least async get (a coroutine, a dict lookup, a 1 KiB mmap slice)"
    return [
        Row(f"flat get, {n:,} entries", get, "µs", point_lookup, floor, "<= 0.15x"),
        Row(least_get, least, "µs", point_lookup, floor, "no async get is faster"),
        Row(f"flat get, {n:,} entries", get, "µs", least_get, least, ""),
    ]


async def medians(
    measures: Mapping[str, Callable[[], Awaitable[float]]], rounds: int
) -> dict[str, float]:
    """Each measure's median over `rounds`, the measures in one order and then the reverse."""
    runs: dict[str, list[float]] = {}
    for i in range(rounds):
        order = list(measures.items())
        for name, measure in order if i % 2 == 0 else reversed(order):
            # Each measure starts with nothing of the last one left to write back:
            # a copy right after the raw copy's large commit waited several
            # times as long for the disk as the same copy a moment later.
            os.sync()
            runs.setdefault(name, []).append(await measure())
    for name, values in runs.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{name}: {shown} (median {statistics.median(values):,.0f})", file=sys.stderr)
    return {name: statistics.median(values) for name, values in runs.items()}


def export_rows(n: int, median: dict[str, float]) -> list[Row]:
    """The two exports beside their floor, the same copy in raw sqlite3, and beside
    the least a digested export does (that copy, and every row hashed beside it)."""
    unit, floor = "entries/s", median["export baseline"]
    digested = median["digested baseline"]
    raw_export = "raw sqlite3 copy from the environment file"
    raw_digested = "the same copy + every row read back and hashed (blake2b), side by side"
    return [
        Row("export to SQLite", median["export sqlite"], unit, raw_export, floor, ">= 1.0x"),
        Row("export to flat", median["export flat"], unit, raw_export, floor, ">= 1.0x"),
        Row(raw_digested, digested, unit, raw_export, floor, "no digested export is faster"),
        Row("export to SQLite", median["export sqlite"], unit, raw_digested, digested, ""),
        Row("export to flat", median["export flat"], unit, raw_digested, digested, ""),
    ]


async def bench_export(root: Path, n: int, rounds: int) -> list[Row]:
    """The export rows alone (`--export-only`): each export and its floor, in rounds."""
    source = await make_source(root, n, 1024)

    async def export_sqlite() -> float:
        return in_child("export", source, root / "b.sqlite", "sqlite", n)

    async def export_flat() -> float:
        return in_child("export", source, root / "b.flat", "flat", n)

    async def export_baseline() -> float:
        return in_child("raw export", source, root, n)

    async def digested_baseline() -> float:
        return in_child("raw digested export", source, root, n)

    measures = {
        "export sqlite": export_sqlite,
        "export flat": export_flat,
        "export baseline": export_baseline,
        "digested baseline": digested_baseline,
    }
    return export_rows(n, await medians(measures, rounds))


async def bench(root: Path, n: int, rounds: int) -> list[Row]:
    source = await make_source(root, n, 1024)
    sqlite_bundle = root / "b.sqlite"
    flat_bundle = root / "b.flat"
    # Every figure, the baseline included, is measured once per round, each
    # time into a fresh target, and reported as its median over the rounds;
    # a ratio is the ratio of the medians. One measurement of the raw copy
    # alone varied twofold between runs on a quiet machine (its one large
    # transaction waits for the disk twice), so a ratio over single
    # measurements said more about that moment than about the import.
    # Within a round the measures run in one order, and in the reverse
    # order the next round, so that a drift of the machine's load (or of
    # its page cache) reaches the baseline and each figure alike.
    # Each import, export and raw copy runs in a process of its own, as a
    # command would: in one long process the digest-checked import ran 20%
    # slower after the flat import than after the other import (the heap
    # the one before left behind), which no order of rounds evens out.
    counter = itertools.count()

    async def export_sqlite() -> float:
        return in_child("export", source, sqlite_bundle, "sqlite", n)

    async def export_flat() -> float:
        return in_child("export", source, flat_bundle, "flat", n)

    async def baseline() -> float:
        return in_child("raw", sqlite_bundle, root, n)

    async def export_baseline() -> float:
        return in_child("raw export", source, root, n)

    async def digested_baseline() -> float:
        return in_child("raw digested export", source, root, n)

    async def digest_pass() -> float:
        return in_child("digest", sqlite_bundle) * 1e3

    async def no_digest() -> float:
        return in_child("import", sqlite_bundle, root, f"plain{next(counter)}", n, 0)

    async def with_digest() -> float:
        return in_child("import", sqlite_bundle, root, f"checked{next(counter)}", n, 1)

    async def flat_import() -> float:
        return in_child("import", flat_bundle, root, f"flat{next(counter)}", n, 1)

    async def copy_sqlite() -> float:
        # The private copy on its own (it is part of every import above).
        return private_copy_s(sqlite_bundle, root) * 1e3

    async def copy_flat() -> float:
        return private_copy_s(flat_bundle, root) * 1e3

    measures = {
        "export sqlite": export_sqlite,
        "export flat": export_flat,
        "baseline": baseline,
        "export baseline": export_baseline,
        "digested baseline": digested_baseline,
        "digest pass": digest_pass,
        "no digest": no_digest,
        "with digest": with_digest,
        "flat import": flat_import,
        "copy sqlite": copy_sqlite,
        "copy flat": copy_flat,
    }
    # The bundles exist before any round reads them.
    await export_per_s(source, sqlite_bundle, "sqlite", n)
    await export_per_s(source, flat_bundle, "flat", n)
    median = await medians(measures, rounds)
    baseline_m = median["baseline"]
    # The floor of a digest-checked import: the copy, after the digest pass it must
    # finish before its first commit (entries/s of the two one after the other).
    verified_floor = n / (n / baseline_m + median["digest pass"] / 1e3)
    no_digest_m, with_digest_m = median["no digest"], median["with digest"]
    flat_import_m = median["flat import"]
    copy_sqlite_m, copy_flat_m = median["copy sqlite"], median["copy flat"]
    # The floor of any import that reads a file no one can change under it: the
    # copy, after the private copy (copy_file_range) it reads from.
    guarded_floor = n / (n / baseline_m + copy_sqlite_m / 1e3)
    get, get_floor, least = await flat_get_beside_floors(flat_bundle, source, n)
    # The copy beside the import it is part of: the ratio is its share of that import's time.
    unit = "entries/s"
    raw = "raw sqlite3 ATTACH + INSERT OR IGNORE"
    verified = "raw copy after the digest pass alone"
    guarded = "raw copy after the private copy alone"
    return [
        Row("import SQLite bundle, verify=False", no_digest_m, unit, raw, baseline_m, ">= 0.98x"),
        Row("import SQLite bundle, verify=False", no_digest_m, unit, guarded, guarded_floor, ""),
        Row(
            "import SQLite bundle, digest checked", with_digest_m, unit, raw, baseline_m, ">= 0.9x"
        ),
        Row(
            "import SQLite bundle, digest checked",
            with_digest_m,
            unit,
            verified,
            verified_floor,
            "",
        ),
        Row("import flat bundle, digest checked", flat_import_m, unit, raw, baseline_m, ""),
        *export_rows(n, median),
        Row("export to SQLite", median["export sqlite"], unit, raw, baseline_m, ""),
        Row(
            "digest pass of the SQLite bundle",
            median["digest pass"],
            "ms",
            "import SQLite bundle, digest checked",
            n / with_digest_m * 1e3,
            "",
        ),
        *flat_get_rows(n, get, get_floor, least),
        Row(
            "private copy of the SQLite bundle",
            copy_sqlite_m,
            "ms",
            "import SQLite bundle, verify=False",
            n / no_digest_m * 1e3,
            "",
        ),
        Row(
            "private copy of the SQLite bundle",
            copy_sqlite_m,
            "ms",
            "import SQLite bundle, digest checked",
            n / with_digest_m * 1e3,
            "",
        ),
        Row(
            "private copy of the flat bundle",
            copy_flat_m,
            "ms",
            "import flat bundle, digest checked",
            n / flat_import_m * 1e3,
            "",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--large", action="store_true", help="also the 1 GiB memory runs")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of every measure; each row is the median"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--get-only", action="store_true", help="the flat get row alone")
    parser.add_argument(
        "--export-only", action="store_true", help="the two export rows and their floor alone"
    )
    args = parser.parse_args()
    if args.child:
        print(child(args.child[0], args.child[1:]))
        return
    if args.get_only:
        with tempfile.TemporaryDirectory() as tmp:
            print_table("bench_bundle", anyio.run(bench_get, Path(tmp), args.entries))
        return
    if args.export_only:
        with tempfile.TemporaryDirectory() as tmp:
            rows = anyio.run(bench_export, Path(tmp), args.entries, args.rounds)
        print_table("bench_bundle", rows)
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows = anyio.run(bench, Path(tmp), args.entries, args.rounds)
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
