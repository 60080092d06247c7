"""`env.explain` over an environment of 1,000 namespaces; the target is < 20 ms.

Run: python benchmarks/bench_explain.py [--namespaces 1000] [--entries 20] [--backend trio]

The environment holds NAMESPACES namespaces of ENTRIES entries each, spread
over 100 applications, 5 versions and 2 paths, so the asked namespace has
10 near neighbours (its 5 versions under both paths) to look the key up in.
The baseline is what no explanation can do without: listing the file's
namespaces, as a raw sqlite3 `SELECT DISTINCT namespace` over the same file
(on the calling thread, no hop). The two alternate over the runs, and each
keeps its best and its median; the environment's own listing
(`env.namespaces()`, counts and sizes) is shown beside them too.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _report import Row, print_table
from warmenv import open_environment


async def measure(namespaces: int, entries: int, runs: int, backend: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        async with open_environment("bench", root=Path(directory)) as env:
            made = 0
            for app in range(100):
                for version in range(1, 6):
                    for path in ("kernels", "tuned"):
                        if made == namespaces:
                            break
                        await env.storage(f"app{app}/{version}/{path}").insert_many(
                            (b'"k%d"' % i, b"x" * 64) for i in range(entries)
                        )
                        made += 1
            asked = "app7/9/kernels"  # a version nobody has: every neighbour is a miss cause
            explanation = await env.explain(asked, "k1")
            assert len(explanation.nearby) == 10, explanation
            raw = sqlite3.connect(env.path)
            try:
                assert len(raw.execute("SELECT DISTINCT namespace FROM entries").fetchall()) == made
                explain_times, distinct_times, list_times = [], [], []
                for _ in range(runs):
                    start = time.perf_counter()
                    await env.explain(asked, "k1")
                    explain_times.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    raw.execute("SELECT DISTINCT namespace FROM entries").fetchall()
                    distinct_times.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    await env.namespaces()
                    list_times.append(time.perf_counter() - start)
            finally:
                raw.close()
    ms = 1000.0
    what = f"{made:,} namespaces x {entries:,} entries"
    rows = [
        Row(
            f"explain(namespace, key), {what}, best ({backend})",
            min(explain_times) * ms,
            "ms",
            "raw sqlite3 SELECT DISTINCT namespace, same file, best",
            min(distinct_times) * ms,
            "< 20 ms",
        ),
        Row(
            f"explain(namespace, key), {what}, median ({backend})",
            statistics.median(explain_times) * ms,
            "ms",
            "raw sqlite3 SELECT DISTINCT namespace, same file, median",
            statistics.median(distinct_times) * ms,
            "< 20 ms",
        ),
        Row(
            f"explain(namespace, key), {what}, median ({backend})",
            statistics.median(explain_times) * ms,
            "ms",
            "env.namespaces() (counts and sizes), median",
            statistics.median(list_times) * ms,
        ),
    ]
    print_table("Explanations", rows)
    if min(explain_times) * ms >= 20:  # the best run: the machine may be shared
        raise SystemExit("explain is slower than its 20 ms target")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=20)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "uvloop", "trio"])
    args = parser.parse_args()
    backend, options = (
        ("asyncio", {"use_uvloop": True}) if args.backend == "uvloop" else (args.backend, {})
    )
    anyio.run(
        measure,
        args.namespaces,
        args.entries,
        args.runs,
        args.backend,
        backend=backend,
        backend_options=options,
    )


if __name__ == "__main__":
    main()
