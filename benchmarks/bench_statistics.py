"""What counting costs: a store hit with statistics on and off, and a flush of 10,000 namespaces.

Run: python benchmarks/bench_statistics.py [--backend trio] [--namespaces 10000]

Targets: a counted hit <= 1.1x the same hit uncounted (same store contents,
keys and loop, rounds alternated, best of each); a flush of every
namespace's counters (hits resolved against their entries, recency
recorded, UPSERT increments, one transaction) < 50 ms for 10,000
namespaces, beside the floor of those UPSERTs alone in raw sqlite3.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _report import Row, print_table
from warmenv import CacheMode, JsonCodec, Store, open_environment

HITS = 100_000


async def per_key_us(store: Store[str, object], keys: list[str]) -> float:
    start = time.perf_counter()
    for key in keys:
        await store.get(key)
    return (time.perf_counter() - start) / len(keys) * 1e6


async def hit_cost(root: Path, backend: str) -> list[Row]:
    namespace = "bench/1/hits"
    codec: JsonCodec[str, object] = JsonCodec()
    rows = []
    async with open_environment("hits", root=root) as env:
        await env.storage(namespace).insert_many(
            (codec.encode_key(f"key-{i:06d}"), codec.encode_value(i)) for i in range(HITS)
        )
        counted: Store[str, object] = await env.store(namespace, mode=CacheMode.EAGER)
        uncounted: Store[str, object] = await Store.open(
            env.storage(namespace), mode=CacheMode.EAGER
        )
        keys = [f"key-{i:06d}" for i in range(0, HITS, 7)] * 3
        best = {"on": float("inf"), "off": float("inf")}
        keys = keys[: len(keys) // 3]
        # Many short rounds, alternated: on a shared machine the best of each
        # is the figure least disturbed by other work.
        for _ in range(40):
            best["off"] = min(best["off"], await per_key_us(uncounted, keys))
            best["on"] = min(best["on"], await per_key_us(counted, keys))
            await env.flush_statistics()  # as the background task would, between rounds
    rows.append(
        Row(
            f"Store.get hit, statistics on ({backend})",
            best["on"],
            "µs",
            "the same hit, statistics off",
            best["off"],
            "<= 1.1x",
        )
    )
    return rows


async def flush_cost(root: Path, namespaces: int, backend: str) -> list[Row]:
    names = [f"app{i % 100}/{i // 100}/kernels" for i in range(namespaces)]
    async with open_environment("flush", root=root) as env:
        stores: list[Store[str, int]] = []
        for name in names:
            await env.storage(name).insert_many([(b'"k"', b"1"), (b'"j"', b"2")])
            stores.append(await env.store(name))
        await env.flush_statistics()
        times = []
        for _ in range(5):
            for store in stores:  # every namespace: 3 hits on 2 keys and a miss
                await store.get("k")
                await store.get("k")
                await store.get("j")
                await store.get("absent")
            start = time.perf_counter()
            assert await env.flush_statistics()
            times.append(time.perf_counter() - start)
        stats = await env.statistics()
        assert sum(n.hits for n in stats.namespaces) == namespaces * 3 * 5
        path = env.path

    def raw_upserts() -> float:
        with sqlite3.connect(path, isolation_level=None) as conn:
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(
                    "INSERT INTO statistics (namespace, origin, misses) VALUES (?, 0, 1) "
                    "ON CONFLICT (namespace, origin) DO UPDATE SET "
                    "misses = misses + excluded.misses",
                    ((n,) for n in names),
                )
                conn.execute("COMMIT")
                best = min(best, time.perf_counter() - start)
        return best

    floor = await anyio.to_thread.run_sync(raw_upserts)
    return [
        Row(
            f"flush of {namespaces:,} namespaces' counters ({backend})",
            min(times) * 1000,
            "ms",
            "raw sqlite3: one UPSERT per namespace, one transaction",
            floor * 1000,
            "< 50 ms",
        )
    ]


async def measure(namespaces: int, backend: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        rows = await hit_cost(Path(directory), backend)
        rows += await flush_cost(Path(directory), namespaces, backend)
    print_table("Statistics", rows)
    hit, flush = rows
    if hit.ratio > 1.1 or flush.value >= 50:
        raise SystemExit("a statistics target was missed (the machine may be shared: rerun)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=10_000)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "uvloop", "trio"])
    args = parser.parse_args()
    backend, options = (
        ("asyncio", {"use_uvloop": True}) if args.backend == "uvloop" else (args.backend, {})
    )
    anyio.run(measure, args.namespaces, args.backend, backend=backend, backend_options=options)


if __name__ == "__main__":
    main()
