"""A service's get_or_compute latency while a big bundle imports, beside the same run without one.

Run: python benchmarks/bench_serving.py [--entries 20000] [--rounds 3] [--share 1.0]
                                         [--format flat|sqlite] [--no-verify]
     python benchmarks/bench_serving.py --entries 200000      # the issue's 200k-entry import

The service: REQUESTS calls of `get_or_compute` over KEYS keys from
CONCURRENCY tasks, each miss a CPU-bound computation of COMPUTE_MS run on a
worker thread (as a service would). "no bundle" serves a cold environment,
every key computed once. "import running" starts `warm_up` of a bundle (flat,
imported by scan, or `--format sqlite`, copied in bulk)
holding the service's keys (in the namespace sorted last) and `--entries`
others at the same moment the requests start, and serves the same requests
while it runs. Each row is the median over `--rounds` of the p50 and p99 of
every request's latency, the two modes alternated in each round; the
computes column says how many the import saved. Single figures to stderr.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import anyio.to_thread

sys.path.insert(0, str(Path(__file__).parent))
from _report import Row, print_table
from warmenv import Namespace, open_environment
from warmenv.bundle import BundleFormat, export_bundle, warm_up

SERVED = Namespace("svc", "answers", version="1")  # sorted after BULK: imported last
BULK = Namespace("bulk", "entries", version="1")
KEYS = 100
REQUESTS = 2000
CONCURRENCY = 50
COMPUTE_MS = 20.0  # --compute-ms; the service spent 50-200 ms per key


def spin(seconds: float) -> None:
    """CPU work holding the GIL, as a real computation does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def compute(key: str) -> str:
    await anyio.to_thread.run_sync(spin, COMPUTE_MS / 1000)
    return f"answer to {key}"


async def make_bundle(directory: Path, entries: int, format: str = "flat") -> Path:
    async with open_environment(file=directory / "ci.db") as ci:
        bulk = ci.storage(BULK)
        for start in range(0, entries, 50_000):
            await bulk.insert_many(
                (b'"bulk-%08d"' % i, os.urandom(200))
                for i in range(start, min(entries, start + 50_000))
            )
        served = await ci.store(SERVED)
        for i in range(KEYS):
            await served.get_or_compute(f"k{i:03d}", _answer, f"k{i:03d}")
    out = directory / "svc.bundle"
    await export_bundle(directory / "ci.db", out, name="svc", version="1", format=format)
    return out


async def _answer(key: str) -> str:
    return f"answer to {key}"


async def serve(
    env_file: Path, bundle: Path | None, share: float, verify: bool = True
) -> tuple[list[float], int, bool]:
    """Every request's latency (s), how many computed, whether the import still ran at the end."""
    rng = random.Random(7)
    asked = [f"k{rng.randrange(KEYS):03d}" for _ in range(REQUESTS)]
    latencies: list[float] = []
    computes = 0

    async def counted(key: str) -> str:
        nonlocal computes
        computes += 1
        return await compute(key)

    async with open_environment(file=env_file) as env:
        store = await env.store(SERVED)
        handle = None if bundle is None else warm_up(bundle, env, share=share, verify=verify)
        queue = iter(asked)

        async def worker() -> None:
            for key in queue:
                start = time.perf_counter()
                await store.get_or_compute(key, counted, key)
                latencies.append(time.perf_counter() - start)

        async with anyio.create_task_group() as tasks:
            for _ in range(CONCURRENCY):
                tasks.start_soon(worker)
        still_running = handle is not None and not handle.done
        if handle is not None:
            await handle.wait()
            if handle.error is not None:
                raise handle.error
    return latencies, computes, still_running


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    global COMPUTE_MS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--entries", type=int, default=20_000, help="bundle entries besides the service's"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compute-ms", type=float, default=COMPUTE_MS, help="CPU per computed key")
    parser.add_argument("--share", type=float, default=1.0, help="warm_up's share= (default 1)")
    parser.add_argument(
        "--format",
        choices=[f.value for f in BundleFormat],
        default="flat",
        help="the bundle's format: flat (imported by scan) or sqlite (copied in bulk)",
    )
    parser.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="warm_up's verify=False: the first batch lands without the digest pass first",
    )
    args = parser.parse_args()
    COMPUTE_MS = args.compute_ms
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        bundle = await make_bundle(directory, args.entries, args.format)
        figures: dict[str, list[tuple[float, float, int]]] = {"none": [], "import": []}
        for round_ in range(args.rounds):
            order = [("none", None), ("import", bundle)]
            if round_ % 2:
                order.reverse()
            for mode, source in order:
                env_file = directory / f"svc-{mode}-{round_}.db"
                latencies, computes, running = await serve(
                    env_file, source, args.share, args.verify
                )
                p50, p99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
                figures[mode].append((p50, p99, computes))
                print(
                    f"round {round_} {mode}: p50 {p50 * 1e6:.1f} µs, p99 {p99 * 1e3:.1f} ms, "
                    f"{computes} computes" + (", import still running" if running else ""),
                    file=sys.stderr,
                )
    rows = []
    for label, index, scale, unit in (("p50", 0, 1e6, "µs"), ("p99", 1, 1e3, "ms")):
        none = statistics.median(f[index] for f in figures["none"]) * scale
        imported = statistics.median(f[index] for f in figures["import"]) * scale
        rows.append(
            Row(
                f"get_or_compute {label}, {args.entries:,}-entry {args.format} import running "
                f"(share={args.share:g})",
                imported,
                unit,
                f"{label}, no bundle",
                none,
            )
        )
    computes_none = statistics.median(f[2] for f in figures["none"])
    computes_import = statistics.median(f[2] for f in figures["import"])
    rows.append(
        Row("computes, import running", computes_import, "", "computes, no bundle", computes_none)
    )
    print_table(
        f"get_or_compute while a bundle imports ({REQUESTS:,} requests, {KEYS} keys, "
        f"{CONCURRENCY} tasks, {COMPUTE_MS:g} ms computes)",
        rows,
    )


if __name__ == "__main__":
    anyio.run(main)
