"""What counting costs: a store hit with statistics on and off, and a flush of 10,000 namespaces.

Run: python benchmarks/bench_statistics.py [--backend trio] [--namespaces 10000] [--wait]

Targets: a counted hit <= 1.1x the same hit uncounted (same store contents,
keys and loop, rounds alternated, best of each); a flush of every
namespace's counters (hits resolved against their entries, recency
recorded, UPSERT increments, in slices of `statistics.SLICE_ROWS` rows, one
transaction each) < 50 ms for 10,000 namespaces (3 hits on 2 keys and a
miss each), beside raw sqlite3 writing the same 10,000 statistics rows by
executemany UPSERT in one transaction (what the flush writes, without
resolving a hit). Flushes and baseline alternate over seven rounds, best of
each.

`--wait` measures instead how long a read-through miss waits while such a
flush runs (a reader task misses back to back through the flush; the
longest of its reads, per flush), beside the same read with no flush, and
the flush's time as above.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _report import Row, print_table
from bench_storage import compare_us
from warmenv import CacheMode, JsonCodec, Store, open_environment
from warmenv.persistence import statistics

# Hold off the background flusher: every flush is then one the script times,
# carrying a whole round's counts (a background flush in the middle of a round
# would leave the timed one less to write), and none runs during a timed hit.
statistics.FLUSH_INTERVAL = 1e9

HITS = 100_000


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
        # Timed as bench_storage times store hits: chunk by chunk, the two
        # stores taking turns, each chunk's best of seven passes, the bests
        # added up. Each store gets its own stream of keys (drawn alike), so
        # neither finds the other's keys in the CPU caches.
        streams = {
            name: [f"key-{i:06d}" for i in range(start, HITS, 7)]
            for name, start in (("off", 0), ("on", 3))
        }
        for stream in streams.values():
            random.shuffle(stream)
        repeat = 7
        best = await compare_us({"off": uncounted.get, "on": counted.get}, streams, repeat=repeat)
        assert await env.flush_statistics()
        (stats,) = (await env.statistics()).namespaces
        # Every pass of the counted store, the untimed first one too, counted.
        assert stats.hits == len(streams["on"]) * (repeat + 1), stats.hits
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


ROUNDS = 7


async def flush_cost(root: Path, namespaces: int, backend: str) -> list[Row]:
    names = [f"app{i % 100}/{i // 100}/kernels" for i in range(namespaces)]
    async with open_environment("flush", root=root) as env:
        stores: list[Store[str, int]] = []
        for name in names:
            await env.storage(name).insert_many([(b'"k"', b"1"), (b'"j"', b"2")])
            stores.append(await env.store(name))
        await env.flush_statistics()
        path = env.path
        raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # The baseline writes what the flush writes, without resolving any hit:
        # the same 10,000 statistics rows (every column the flush adds to), one
        # UPSERT each by executemany, in one transaction, into a table of the
        # same shape in the same file, on another connection.
        (ddl,) = raw.execute("SELECT sql FROM sqlite_master WHERE name = 'statistics'").fetchone()
        raw.execute(ddl.replace("statistics", "baseline_statistics", 1))
        rows = [(name, 3, 0.0, 1, 0, 0.0) for name in names]

        def raw_upserts() -> float:
            start = time.perf_counter()
            raw.execute("BEGIN IMMEDIATE")
            raw.executemany(
                "INSERT INTO baseline_statistics (namespace, origin, hits, saved_seconds, misses, "
                "computes, compute_seconds) VALUES (?, 0, ?, ?, ?, ?, ?) "
                "ON CONFLICT (namespace, origin) DO UPDATE SET hits = hits + excluded.hits, "
                "saved_seconds = saved_seconds + excluded.saved_seconds, "
                "misses = misses + excluded.misses, computes = computes + excluded.computes, "
                "compute_seconds = compute_seconds + excluded.compute_seconds",
                rows,
            )
            raw.execute("COMMIT")
            return time.perf_counter() - start

        times, floors = [], []
        try:
            # Rounds alternate the flush and the baseline, so that a change of
            # the machine's load reaches both; each keeps its best round.
            for _ in range(ROUNDS):
                for store in stores:  # every namespace: 3 hits on 2 keys and a miss
                    await store.get("k")
                    await store.get("k")
                    await store.get("j")
                    await store.get("absent")
                start = time.perf_counter()
                assert await env.flush_statistics()
                times.append(time.perf_counter() - start)
                floors.append(await anyio.to_thread.run_sync(raw_upserts))
        finally:
            raw.close()
        stats = await env.statistics()
        assert sum(n.hits for n in stats.namespaces) == namespaces * 3 * ROUNDS
        assert sum(n.misses for n in stats.namespaces) == namespaces * ROUNDS
    return [
        Row(
            f"flush of {namespaces:,} namespaces' counters ({backend})",
            min(times) * 1000,
            "ms",
            "raw sqlite3 executemany UPSERT of the same statistics rows, one transaction",
            min(floors) * 1000,
            "< 50 ms",
        )
    ]


async def flush_wait(root: Path, namespaces: int, backend: str) -> list[Row]:
    """The longest a read-through miss waits while a flush of `namespaces` runs.

    A reader task looks up keys its store does not hold (each one storage
    read, one hop to the connection's worker) back to back for as long as
    the flush runs; the longest of those reads is how long a live service's
    miss can be held up by a flush. Its baseline is the median of the same
    read with no flush running.
    """
    names = [f"app{i % 100}/{i // 100}/kernels" for i in range(namespaces)]
    async with open_environment("wait", root=root) as env:
        stores: list[Store[str, int]] = []
        for name in names:
            await env.storage(name).insert_many([(b'"k"', b"1"), (b'"j"', b"2")])
            stores.append(await env.store(name))
        reader: Store[str, int] = await env.store("bench/1/reader")
        await env.flush_statistics()
        alone = []
        for i in range(200):
            start = time.perf_counter()
            await reader.get(f"alone-{i}")
            alone.append(time.perf_counter() - start)
        longest, totals, counts = [], [], []
        for round_ in range(ROUNDS):
            for store in stores:  # every namespace: 3 hits on 2 keys and a miss
                await store.get("k")
                await store.get("k")
                await store.get("j")
                await store.get("absent")
            done = anyio.Event()
            waits: list[float] = []

            async def read_through(
                round_: int = round_, waits: list[float] = waits, done: anyio.Event = done
            ) -> None:
                n = 0
                while not done.is_set():
                    start = time.perf_counter()
                    await reader.get(f"absent-{round_}-{n}")
                    waits.append(time.perf_counter() - start)
                    n += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(read_through)
                await anyio.wait_all_tasks_blocked()  # the reader's first read is in flight
                start = time.perf_counter()
                assert await env.flush_statistics()
                totals.append(time.perf_counter() - start)
                done.set()
            longest.append(max(waits))
            counts.append(len(waits))
        stats = await env.statistics()
        assert sum(n.hits for n in stats.namespaces) == namespaces * 3 * ROUNDS
    print(
        f"  reads during each flush: {counts}; longest waits (ms): "
        f"{[round(w * 1000, 2) for w in longest]}; flush with the reader (ms): "
        f"{[round(t * 1000, 2) for t in totals]}"
    )
    return [
        Row(
            f"longest read-through miss during a flush of {namespaces:,} namespaces, "
            f"median of {ROUNDS} flushes ({backend})",
            sorted(longest)[ROUNDS // 2] * 1000,
            "ms",
            "the same read with no flush running, median",
            sorted(alone)[len(alone) // 2] * 1000,
        ),
        Row(
            f"longest read-through miss during a flush, worst of {ROUNDS} ({backend})",
            max(longest) * 1000,
            "ms",
            "same",
            sorted(alone)[len(alone) // 2] * 1000,
        ),
    ]


async def measure(namespaces: int, backend: str, wait: bool) -> None:
    with tempfile.TemporaryDirectory() as directory:
        if wait:
            rows = await flush_wait(Path(directory), namespaces, backend)
            rows += await flush_cost(Path(directory), namespaces, backend)
            print_table("Statistics: a read during a flush", rows)
            return
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
    parser.add_argument(
        "--wait",
        action="store_true",
        help="measure how long a read-through miss waits during a flush, and the flush",
    )
    args = parser.parse_args()
    backend, options = (
        ("asyncio", {"use_uvloop": True}) if args.backend == "uvloop" else (args.backend, {})
    )
    anyio.run(
        measure, args.namespaces, args.backend, args.wait, backend=backend, backend_options=options
    )


if __name__ == "__main__":
    main()
