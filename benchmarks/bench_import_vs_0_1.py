"""Bundle import beside warmenv 0.1's, on the same machine and the same bundle.

Run: python benchmarks/bench_import_vs_0_1.py [--rounds 7] [--entries 100000]
Extracts 0.1's src/ from the repository's history (git archive 0b00651),
has 0.1 write one bundle (format 1, which both versions read), then in
alternating rounds times the raw ATTACH copy, 0.1's import and this code's
import (verify=False and digest checked), each in a fresh process after a
sync. Rows are medians of the ratios to the raw copy of the same round:
whether the trust boundary's private copy and checks cost an import speed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE_0_1 = "0b00651"

_CHILD = textwrap.dedent(
    """
    import json, os, sqlite3, sys, time, anyio
    from pathlib import Path
    from warmenv import Namespace, open_environment
    from warmenv.bundle import export_bundle, import_bundle

    where, mode, entries = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    bundle = where / "b.sqlite"

    def forget(path):
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(str(path) + suffix)
            except FileNotFoundError:
                pass

    def raw():
        target = where / "raw.db"
        conn = sqlite3.connect(target, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL,"
                     " value BLOB NOT NULL, origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))")
        start = time.perf_counter()
        conn.execute("ATTACH DATABASE ? AS b", (str(bundle),))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR IGNORE INTO main.entries (namespace, key, value, origin)"
                     " SELECT namespace, key, value, 1 FROM b.entries")
        conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        conn.close()
        forget(target)
        return elapsed

    async def main():
        if mode == "raw":
            return raw()
        if mode == "make":  # run by 0.1: Namespace's version is optional there
            ns = Namespace("bench", "bundle", version="1")
            async with open_environment("source", root=where) as env:
                storage = env.storage(ns)
                for start in range(0, entries, 50_000):
                    stop = min(start + 50_000, entries)
                    await storage.insert_many(
                        (b"key-%08d" % i, os.urandom(1024)) for i in range(start, stop)
                    )
                source = env.path
            await export_bundle(source, bundle, name="vs 0.1")
            forget(source)
            return 0.0
        async with open_environment(f"target-{os.getpid()}", root=where) as env:
            start = time.perf_counter()
            report = await import_bundle(bundle, env, verify=mode == "digest")
            elapsed = time.perf_counter() - start
            path = env.path
        assert report.imported == entries, report
        forget(path)
        return elapsed

    print(json.dumps(anyio.run(main)))
    """
)


def extract_0_1(into: Path) -> Path:
    archived = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", RELEASE_0_1, "src"],
        capture_output=True,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(archived.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def timed(where: Path, mode: str, entries: int, src: Path) -> float:
    os.sync()
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(where), mode, str(entries)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        old_src = extract_0_1(Path(tmp) / "0.1")
        new_src = ROOT / "src"
        where = Path(tmp) / "run"
        where.mkdir()
        timed(where, "make", args.entries, old_src)
        ratios: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            base = timed(where, "raw", args.entries, new_src)
            for version, src in (("0.1", old_src), ("this code", new_src)):
                for mode in ("nodigest", "digest"):
                    seconds = timed(where, mode, args.entries, src)
                    ratios.setdefault(f"{version} {mode}", []).append(base / seconds)
    print(f"\n### bench_import_vs_0_1 ({args.rounds} rounds, {args.entries:,} entries)\n")
    print("| measure | 0.1 (median; range) | this code (median; range) |")
    print("|---|---:|---:|")
    for mode, label in (("nodigest", "verify=False"), ("digest", "digest checked")):
        cells = []
        for version in ("0.1", "this code"):
            runs = ratios[f"{version} {mode}"]
            cells.append(f"{statistics.median(runs):.2f}x ({min(runs):.2f}x to {max(runs):.2f}x)")
        print(f"| import, {label}, vs the raw copy | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
