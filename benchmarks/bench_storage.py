"""Storage next to raw sqlite3 and aiosqlite, measured in one run.

Run: python benchmarks/bench_storage.py [--entries 100000]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.lowlevel
import attrs

HERE = str(Path(__file__).parent)
sys.path.insert(0, HERE)
from _report import MEMORY_PROBE, Row, per_call_us, print_table
from warmenv import (
    BytesCodec,
    CacheMode,
    Environment,
    JsonCodec,
    Namespace,
    Store,
    blocking,
    open_environment,
)
from warmenv.persistence.codec import scan_canonical

NS = Namespace("bench", "storage", version="1")
GET_SQL = "SELECT value FROM entries WHERE namespace = ? AND key = ?"
SMALL = 10_000  # entries in the point-lookup database


def keys(n: int) -> list[bytes]:
    return [b"key-%08d" % i for i in range(n)]


async def fill(root: Path, name: str, n: int, size: int) -> Path:
    payload = os.urandom(size)
    async with open_environment(name, root=root) as env:
        await env.storage(NS).insert_many((k, payload) for k in keys(n))
        return env.path


def raw_lookup_us(path: Path, n: int) -> float:
    conn = sqlite3.connect(path)
    ks = keys(SMALL)
    pick = [random.choice(ks) for _ in range(n)]
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for k in pick:
            conn.execute(GET_SQL, (str(NS), k)).fetchone()
        best = min(best, time.perf_counter() - start)
    conn.close()
    return best / n * 1e6


async def aiosqlite_get_us(path: Path, n: int) -> float:
    ks = keys(SMALL)
    async with aiosqlite.connect(path) as conn:

        async def one() -> None:
            await conn.execute_fetchall(GET_SQL, (str(NS), random.choice(ks)))

        return await per_call_us(one, n)


async def storage_get_us(root: Path, n: int) -> float:
    ks = keys(SMALL)
    async with open_environment("small", root=root) as env:
        storage = env.storage(NS)

        async def one() -> None:
            await storage.get(random.choice(ks))

        return await per_call_us(one, n)


async def aiosqlite_concurrent(path: Path, per_task: int) -> float:
    ks = keys(SMALL)
    async with aiosqlite.connect(path) as conn:

        async def worker() -> None:
            for _ in range(per_task):
                await conn.execute_fetchall(GET_SQL, (str(NS), random.choice(ks)))

        return await _throughput(worker, per_task)


async def storage_concurrent(root: Path, per_task: int) -> float:
    ks = keys(SMALL)
    async with open_environment("small", root=root) as env:
        storage = env.storage(NS)

        async def worker() -> None:
            for _ in range(per_task):
                await storage.get(random.choice(ks))

        return await _throughput(worker, per_task)


async def _throughput(worker: object, per_task: int, tasks: int = 8) -> float:
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(tasks):
                tg.start_soon(worker)  # type: ignore[arg-type]
        best = max(best, tasks * per_task / (time.perf_counter() - start))
    return best


def raw_executemany_per_s(dir: Path, n: int, size: int) -> float:
    path = dir / "raw-bulk.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE entries (namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,"
        " origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))"
    )
    payload = os.urandom(size)
    rows = [(str(NS), k, payload, 0) for k in keys(n)]
    start = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("INSERT INTO entries VALUES (?, ?, ?, ?)", rows)
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


async def insert_many_per_s(root: Path, n: int, size: int) -> float:
    payload = os.urandom(size)
    items = [(k, payload) for k in keys(n)]
    async with open_environment("bulk", root=root) as env:
        start = time.perf_counter()
        summary = await env.storage(NS).insert_many(items)
        elapsed = time.perf_counter() - start
    assert summary.stored == n, summary
    return n / elapsed


HITS = 100_000  # entries in the EAGER store whose hits are measured


def shaped_value(shape: str, i: int) -> object:
    """A value whose encoding is about 256 bytes: a str, bytes, or a nested dict.

    Each differs from the others (by `i`), as real values do: nothing can be
    shared between two values' decoded forms but the dict keys. A `bytes`
    shape is a `BytesCodec` store's (bytes keys, see `shaped_key`).
    """
    if shape == "str":
        return f"{'y' * 240}-{i:06d}"
    if shape == "bytes":
        return f"{'y' * 248}-{i:06d}".encode()
    return {
        "block": 128 + i % 7,
        "choice": "blocked",
        "ms": 1.5 + i,
        "note": f"{'x' * 153}-{i:06d}",
        "tiles": [16, 32, 64 + i % 3],
    }


# How the hits of a benchmark pick their keys (each a stream of draws).
PATTERNS = {
    "uniform": "uniform over all keys",
    "zipf": "Zipf 1.0 over all keys",
    "few": "uniform over 1,000 keys",
}
STREAM = 10_000  # draws per run; every run gets a stream of its own


def key_stream(pattern: str, n: int, count: int, rng: random.Random) -> list[str]:
    """`count` keys of the `n` in a store, drawn as `pattern` says.

    Zipf: the key of rank r is drawn with weight 1/r, and the ranks are
    shuffled over the table (a service's hot keys are not its first ones).
    """
    if pattern == "uniform":
        picks = [rng.randrange(n) for _ in range(count)]
    elif pattern == "zipf":
        order = list(range(n))
        random.Random(1).shuffle(order)  # the same ranking for every stream
        weights = list(itertools.accumulate(1 / rank for rank in range(1, n + 1)))
        picks = [order[r] for r in rng.choices(range(n), cum_weights=weights, k=count)]
    else:
        few = random.Random(2).sample(range(n), 1000)
        picks = [rng.choice(few) for _ in range(count)]
    return [f"key-{i:06d}" for i in picks]


def shaped_key(shape: str, key: str) -> Any:
    """The key a store of `shape` is asked with: a `BytesCodec` store's are bytes."""
    return key.encode() if shape == "bytes" else key


def shaped_codec(shape: str) -> Any:
    return BytesCodec() if shape == "bytes" else JsonCodec()


async def fill_store(env: Environment, shape: str, n: int) -> Namespace:
    namespace = Namespace("bench", f"hits-{shape}", version="1")
    codec = shaped_codec(shape)
    items = [
        (
            codec.encode_key(shaped_key(shape, f"key-{i:06d}")),
            codec.encode_value(shaped_value(shape, i)),
        )
        for i in range(n)
    ]
    await env.storage(namespace).insert_many(items)
    return namespace


CHUNK = 500  # keys timed together; each chunk keeps its best time over the repeats


def _chunks(keys: list[Any]) -> list[list[Any]]:
    return [keys[i : i + CHUNK] for i in range(0, len(keys), CHUNK)]


async def per_key_us(
    fn: Callable[[Any], Awaitable[object]], keys: list[Any], repeat: int = 5
) -> float:
    """Mean time of `await fn(key)` over `keys`, in microseconds.

    Each chunk of keys keeps its best time over `repeat` passes, and the
    chunks' bests are added up: a pass that the (shared) machine interrupted
    spoils one chunk's figure, not the whole pass's.
    """
    chunks = _chunks(keys)
    best = [float("inf")] * len(chunks)
    for _ in range(repeat):
        for i, chunk in enumerate(chunks):
            start = time.perf_counter()
            for key in chunk:
                await fn(key)
            best[i] = min(best[i], time.perf_counter() - start)
    return sum(best) / len(keys) * 1e6


async def store_hits(root: Path, shape: str, n: int, patterns: list[str]) -> list[Row]:
    """`get` and `get_or_compute` hits in a 100k-entry EAGER store, beside a dict."""
    rows = []
    async with open_environment("hits", root=root) as env:
        namespace = await fill_store(env, shape, n)
        codec = shaped_codec(shape)
        store: Store[Any, object] = await env.store(namespace, codec, mode=CacheMode.EAGER)
        assert len(store) == n
        # The same store without a hot set: every hit decodes (only dict values decode).
        cold: Store[Any, object] | None = None
        if shape == "dict":
            cold = await Store.open(env.storage(namespace), hot_bytes=0)
        plain = {shaped_key(shape, f"key-{i:06d}"): shaped_value(shape, i) for i in range(n)}

        async def dict_get(key: str) -> object:
            return plain.get(key)

        async def never(key: str) -> object:
            raise AssertionError(f"{key} was loaded; a hit must not compute")

        async def dict_get_copy(key: str) -> object:
            return copy.deepcopy(plain.get(key))

        def compute_hit(key: str) -> Awaitable[object]:
            return store.get_or_compute(key, never, key)

        for pattern in patterns:
            runs: dict[str, Callable[[Any], Any]] = {
                "dict": dict_get,
                "get": store.get,
                "compute": compute_hit,
            }
            if shape == "bytes":
                runs["loop"] = plain.get  # called, not awaited (see `compare_us`)
            if cold is not None:
                runs["cold"] = cold.get
            if shape == "dict" and pattern == "uniform":
                runs["copy"] = dict_get_copy
            best = await compare_us(runs, streams(runs, pattern, n, shape), plain={"loop"})
            label = f"{n // 1000}k EAGER, {shape} values, {PATTERNS[pattern]}"
            baseline = "dict.get in a coroutine"
            # Issue 23: a dict value's hit over 100k keys (most decode) within 3.5x.
            target = "<= 3.5x" if shape == "dict" and pattern == "uniform" else "<= 3x"
            rows += [
                Row(f"Store.get hit ({label})", best["get"], "µs", baseline, best["dict"], target),
                Row(
                    f"get_or_compute hit ({label})",
                    best["compute"],
                    "µs",
                    baseline,
                    best["dict"],
                    "<= 3x",
                ),
            ]
            if "loop" in best:
                rows.append(
                    Row(
                        f"Store.get hit ({label})",
                        best["get"],
                        "µs",
                        "dict.get in a loop (no coroutine)",
                        best["loop"],
                        "<= 2x",
                    )
                )
            if "cold" in best:
                rows.append(
                    Row(
                        f"Store.get hit ({label})",
                        best["get"],
                        "µs",
                        "Store.get with hot_bytes=0 (each hit decodes)",
                        best["cold"],
                        "",
                    )
                )
            if "copy" in best:
                # A mutable value needs a fresh copy per caller; beside the copy a
                # hand-written cache would make to give the same guarantee.
                rows.append(
                    Row(
                        f"Store.get hit ({label})",
                        best["get"],
                        "µs",
                        "dict.get + copy.deepcopy in a coroutine",
                        best["copy"],
                        "",
                    )
                )
    return rows


def streams(
    runs: Mapping[str, object], pattern: str, n: int, shape: str = "str"
) -> dict[str, list[Any]]:
    """A stream of keys per run, all drawn alike (see `compare_us`)."""
    rng = random.Random(3)
    return {
        name: [shaped_key(shape, key) for key in key_stream(pattern, n, STREAM, rng)]
        for name in runs
    }


async def hits_under_load(root: Path, askers: int = 200, keys: int = 10) -> Row:
    """p99 of hits while `askers` tasks ask for `keys` missing keys, beside a dict."""
    rounds = 50
    async with open_environment("load", root=root) as env:
        store: Store[str, str] = await env.store(Namespace("bench", "load", version="1"))
        computes: list[str] = []

        async def tune(key: str) -> str:
            computes.append(key)
            await anyio.sleep(0.005)  # the computation: long enough for every asker to arrive
            return f"tuned {key}"

        plain: dict[str, str] = {}

        async def dict_get(key: str) -> str:
            found = plain.get(key)
            if found is None:
                await anyio.sleep(0.005)
                found = plain[key] = f"tuned {key}"
            return found

        async def run(ask: Callable[[str], Awaitable[str]]) -> list[float]:
            hits: list[float] = []

            async def asker(i: int) -> None:
                key = f"k{i % keys}"
                await ask(key)  # the first call waits for the shared computation
                for _ in range(rounds):
                    await anyio.lowlevel.checkpoint()  # interleave with every other asker
                    start = time.perf_counter_ns()
                    await ask(key)
                    hits.append((time.perf_counter_ns() - start) / 1000)

            async with anyio.create_task_group() as tg:
                for i in range(askers):
                    tg.start_soon(asker, i)
            return hits

        ours = await run(lambda key: store.get_or_compute(key, tune, key))
        theirs = await run(dict_get)
    if sorted(computes) != sorted(f"k{i}" for i in range(keys)):
        raise AssertionError(f"{len(computes)} computes for {keys} keys: {sorted(computes)}")
    return Row(
        f"p99 get_or_compute hit, {askers} askers for {keys} missing keys ({len(computes)}"
        " computes)",
        percentile(ours, 99),
        "µs",
        "p99 dict.get in a coroutine, same load",
        percentile(theirs, 99),
        "",
    )


async def compare_us(
    runs: dict[str, Callable[[Any], Any]],
    keys: dict[str, list[Any]],
    repeat: int = 5,
    plain: set[str] = frozenset(),  # type: ignore[assignment]
) -> dict[str, float]:
    """Mean µs per `await run(key)` of each run over its own stream of keys.

    Each run first goes over its whole stream untimed: the store reaches the
    state the pattern leaves it in (its hot set filled) and the CPU caches
    hold what they would. Then the runs take turns chunk by chunk, so that a
    change of load on the (shared) machine reaches a figure and its
    baseline alike; each (run, chunk) keeps its best time over the passes,
    and a run's figure adds up its chunks' bests. The streams are drawn
    alike but differ: a run timed right after another over the same keys
    would find them in the CPU caches and look faster. Times are the
    thread's CPU time: on a shared machine, the moments another process
    held the CPU are not counted against either (its use of the caches is).
    The runs named in `plain` are plain functions, called in a loop.
    """
    chunks = {name: _chunks(keys[name]) for name in runs}
    best = {name: [float("inf")] * len(chunks[name]) for name in runs}
    for name, run in runs.items():
        for key in keys[name]:
            if name in plain:
                run(key)
            else:
                await run(key)
    for _ in range(repeat):
        for i in range(len(best[next(iter(runs))])):
            for name, run in runs.items():
                chunk = chunks[name][i]
                if name in plain:
                    start = time.thread_time()
                    for key in chunk:
                        run(key)
                else:
                    start = time.thread_time()
                    for key in chunk:
                        await run(key)
                best[name][i] = min(best[name][i], time.thread_time() - start)
    return {name: sum(times) / len(keys[name]) * 1e6 for name, times in best.items()}


def compare_sync_us(
    runs: dict[str, Callable[[str], object]], keys: dict[str, list[str]], repeat: int = 5
) -> dict[str, float]:
    """`compare_us` for plain functions."""
    chunks = {name: _chunks(keys[name]) for name in runs}
    best = {name: [float("inf")] * len(chunks[name]) for name in runs}
    for name, run in runs.items():
        for key in keys[name]:
            run(key)
    for _ in range(repeat):
        for i in range(len(best[next(iter(runs))])):
            for name, run in runs.items():
                chunk = chunks[name][i]
                start = time.thread_time()
                for key in chunk:
                    run(key)
                best[name][i] = min(best[name][i], time.thread_time() - start)
    return {name: sum(times) / len(keys[name]) * 1e6 for name, times in best.items()}


def per_key_sync_us(fn: Callable[[Any], object], keys: list[Any], repeat: int = 5) -> float:
    """Mean time of `fn(key)` over `keys`, in microseconds, timed as `per_key_us` does."""
    chunks = _chunks(keys)
    best = [float("inf")] * len(chunks)
    for _ in range(repeat):
        for i, chunk in enumerate(chunks):
            start = time.perf_counter()
            for key in chunk:
                fn(key)
            best[i] = min(best[i], time.perf_counter() - start)
    return sum(best) / len(keys) * 1e6


def blocking_hits(root: Path, shape: str, n: int, patterns: list[str]) -> list[Row]:
    """warmenv.blocking hits in the EAGER store `store_hits` filled, beside a locked dict."""
    rows = []
    with blocking.open_environment("hits", root=root) as env:
        store: blocking.BlockingStore[Any, object] = env.store(
            Namespace("bench", f"hits-{shape}", version="1"), codec=shaped_codec(shape)
        )
        assert len(store) == n
        plain = {shaped_key(shape, f"key-{i:06d}"): shaped_value(shape, i) for i in range(n)}
        lock = threading.Lock()

        def locked_get(key: str) -> object:
            with lock:
                return plain.get(key)

        def locked_copy(key: str) -> object:
            with lock:
                return copy.deepcopy(plain.get(key))

        def locked_least_copy(key: str) -> object:
            # The least a cache handing out copies of these values can do: copy
            # the dict and its list, share the rest (and hold every value decoded).
            with lock:
                found: Any = plain.get(key)
            mine = found.copy()
            mine["tiles"] = mine["tiles"].copy()
            return mine

        # The store's held form of a dict value (its JSON), decoded as its hit does.
        codec = shaped_codec(shape)
        encoded = {key: codec.encode_value(value) for key, value in plain.items()}

        def locked_decode(key: str) -> object:
            with lock:
                found: Any = encoded.get(key)
            return scan_canonical(found.decode(), 0)[0]

        for pattern in patterns:
            runs: dict[str, Callable[[str], object]] = {"dict": locked_get, "get": store.get}
            if shape == "dict":
                runs["least"] = locked_least_copy
                runs["decode"] = locked_decode
            if shape == "dict" and pattern == "uniform":
                runs["copy"] = locked_copy
            best = compare_sync_us(runs, streams(runs, pattern, n, shape))
            name = f"warmenv.blocking get hit ({n // 1000}k EAGER, {shape} values,"
            name += f" {PATTERNS[pattern]})"
            baseline = "dict.get under a threading.Lock"
            # Issue 23: a value that needs no copy within 1.2x of the locked dict;
            # a dict value within 1.2x of that plus its least copy (the row below).
            rows += [
                Row(
                    name,
                    best["get"],
                    "µs",
                    baseline,
                    best["dict"],
                    "" if "least" in best else "<= 1.2x",
                ),
                Row(name, best["get"], "µs", "absolute target", 2.0, "< 2 µs"),
            ]
            if "least" in best:
                least = "dict.get under a Lock + the least copy (dict.copy, list.copy)"
                rows += [
                    Row(name, best["get"], "µs", least, best["least"], "<= 1.2x"),
                    Row(
                        f"{least} ({pattern})",
                        best["least"],
                        "µs",
                        baseline,
                        best["dict"],
                        "the floor for any copy",
                    ),
                ]
            if "decode" in best:
                # What the rest over the least copy is: the decode itself (see held_forms.py).
                decode = "dict.get under a Lock + the decode of its JSON (no store)"
                rows.append(Row(name, best["get"], "µs", decode, best["decode"], ""))
            if "copy" in best:
                rows.append(
                    Row(
                        name,
                        best["get"],
                        "µs",
                        "dict.get + copy.deepcopy under a Lock",
                        best["copy"],
                    )
                )
    return rows


def blocking_misses(root: Path, per_round: int = 2000) -> Row:
    """A warmenv.blocking miss that reads through, beside the async `Store.get` doing so."""
    every = keys(SMALL)

    def sync_round(chosen: list[bytes]) -> float:
        with blocking.open_environment("small", root=root) as env:
            store: blocking.BlockingStore[bytes, bytes] = env.store(
                NS, codec=BytesCodec(), mode=CacheMode.LAZY
            )
            return per_key_sync_us(store.get, chosen, repeat=1)

    async def async_round(chosen: list[bytes]) -> float:
        async with open_environment("small", root=root) as env:
            store = await env.store(NS, codec=BytesCodec(), mode=CacheMode.LAZY)
            return await per_key_us(store.get, chosen, repeat=1)

    best = {"sync": float("inf"), "async": float("inf")}
    for _ in range(5):  # alternate: neither gets a quieter moment of the machine
        chosen = random.sample(every, per_round)  # each key once: every call is a miss
        best["sync"] = min(best["sync"], sync_round(chosen))
        best["async"] = min(best["async"], anyio.run(async_round, chosen))
    return Row(
        "warmenv.blocking get miss, read through (LAZY, 10k x 256 B)",
        best["sync"],
        "µs",
        "await Store.get miss, read through, on asyncio",
        best["async"],
        "<= 1.3x",
    )


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


_STORE_RSS_CHILD = MEMORY_PROBE + textwrap.dedent(
    """
    import gc, json, random, sys, anyio
    from warmenv import CacheMode, Namespace, open_environment

    sys.path.insert(0, sys.argv[4])
    from bench_storage import key_stream

    async def main():
        async with open_environment("hits", root=sys.argv[1]) as env:
            namespace = Namespace("bench", "hits-" + sys.argv[2], version="1")
            storage = env.storage(namespace)
            raw = (await storage.summary()).bytes
            if sys.argv[3] == "store":
                keys = key_stream("zipf", 100_000, 300_000, random.Random(4))
                gc.collect()
                before = rss_mib()
                held = await env.store(namespace, mode=CacheMode.EAGER)
            else:
                gc.collect()
                before = rss_mib()
                held = {key: json.loads(value) async for key, value in storage.scan()}
            await storage.get(b"-")  # the worker thread lets go of the last page
            gc.collect()
            loaded = rss_mib() - before
            if sys.argv[3] == "store":
                for key in keys:  # fills the hot set as a service's hits would
                    await held.get(key)
                gc.collect()
            print(len(held), raw / 2**20, loaded, rss_mib() - before)

    anyio.run(main)
    """
)


def store_rss(root: Path, shape: str) -> list[Row]:
    """RSS growth of loading an EAGER store, beside the raw size and a dict of the values."""

    def measure(what: str) -> tuple[int, float, float, float]:
        out = subprocess.run(
            [sys.executable, "-c", _STORE_RSS_CHILD, str(root), shape, what, HERE],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return int(out[0]), float(out[1]), float(out[2]), float(out[3])

    entries, raw, loaded, used = measure("store")
    _, _, plain, _ = measure("dict")
    name = f"RSS of an EAGER store, {entries:,} {shape} entries of ~256 B"
    # Issue 23: Python's own objects (the floor) take 1.52x to 1.56x of the raw size.
    rows = [Row(name, loaded, "MiB", "raw size (keys + values)", raw, "<= 1.7x")]
    if shape == "dict":  # only containers are ever held decoded (the hot set)
        rows.append(
            Row(name + ", after 300k Zipf hits", used, "MiB", "raw size (keys + values)", raw)
        )
    rows.append(Row(name, loaded, "MiB", "a dict of the decoded values", plain, ""))
    return rows


_RSS_CHILD = MEMORY_PROBE + textwrap.dedent(
    """
    import sys, sqlite3, anyio
    from warmenv import Namespace, open_environment

    async def scan():
        async with open_environment("big", root=sys.argv[1]) as env:
            before = rss_mib()
            n = 0
            async for _ in env.storage(Namespace("bench", "storage", version="1")).scan():
                n += 1
            print(n, peak_mib() - before)

    def fetchall():
        conn = sqlite3.connect(sys.argv[1] + "/big.db")
        before = rss_mib()
        rows = conn.execute("SELECT key, value FROM entries").fetchall()
        print(len(rows), peak_mib() - before)

    if sys.argv[2] == "scan":
        anyio.run(scan, backend=sys.argv[3])
    else:
        fetchall()
    """
)


def rss_growth_mib(root: Path, mode: str, backend: str = "asyncio") -> float:
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(root), mode, backend],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[1])


async def bench(root: Path, entries: int, backend: str) -> list[Row]:
    small = await fill(root, "small", SMALL, 256)
    n = 3000
    aio = await aiosqlite_get_us(small, n) if backend == "asyncio" else float("nan")
    get = await storage_get_us(root, n)
    rows = []
    if backend == "asyncio":
        raw = raw_lookup_us(small, n * 5)
        rows += [
            Row("Storage.get hit", get, "µs", "aiosqlite execute_fetchall", aio, "<= 1.15x"),
            Row("Storage.get hit", get, "µs", "raw sqlite3 (sync)", raw),
        ]
        per_task = 500
        aio_tp = await aiosqlite_concurrent(small, per_task)
        our_tp = await storage_concurrent(root, per_task)
        rows.append(
            Row("8 tasks of gets", our_tp, "gets/s", "aiosqlite, 8 tasks", aio_tp, ">= 0.9x")
        )
    else:
        rows.append(Row("Storage.get hit", get, "µs", "(see asyncio figure)", get, ""))
    rows += await store_hits(root / backend, "str", HITS, ["uniform"])
    rows += await store_hits(root / backend, "bytes", HITS, ["uniform"])
    rows += await store_hits(root / backend, "dict", HITS, list(PATTERNS))
    rows.append(await hits_under_load(root / backend))
    if backend == "asyncio":
        raw_bulk = raw_executemany_per_s(root, entries, 1024)
        ours = await insert_many_per_s(root, entries, 1024)
        rows.append(
            Row(
                f"insert_many {entries:,} x 1 KiB",
                ours,
                "entries/s",
                "raw sqlite3 executemany",
                raw_bulk,
                ">= 0.8x",
            )
        )
    return rows


def hit_rows(root: Path) -> list[Row]:
    """The rows of `--hits`, measured as in a full run."""

    async def hits(backend: str) -> list[Row]:
        rows = await store_hits(root / backend, "str", HITS, ["uniform"])
        rows += await store_hits(root / backend, "bytes", HITS, ["uniform"])
        return rows + await store_hits(root / backend, "dict", HITS, list(PATTERNS))

    rows = anyio.run(hits, "asyncio")
    rows += [
        attrs.evolve(row, name=row.name + " on trio")
        for row in anyio.run(hits, "trio", backend="trio")
    ]
    rows += blocking_hits(root / "asyncio", "str", HITS, ["uniform"])
    rows += blocking_hits(root / "asyncio", "bytes", HITS, ["uniform"])
    rows += blocking_hits(root / "asyncio", "dict", HITS, list(PATTERNS))
    for shape in ("str", "dict"):
        rows += store_rss(root / "asyncio", shape)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument(
        "--hits",
        action="store_true",
        help="only the rows of Store hits, warmenv.blocking hits and a store's RSS: quick"
        " enough to alternate runs of two versions of the code (PYTHONPATH=old/src)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.hits:
            print_table("bench_storage --hits", hit_rows(root))
            return
        rows = anyio.run(bench, root, args.entries, "asyncio")
        trio_rows = anyio.run(bench, root, args.entries, "trio", backend="trio")
        # The two backends' gets alternate, best of three each, so that
        # neither gets a quieter moment of the machine than the other.
        gets = {"asyncio": float("inf"), "trio": float("inf")}
        for _ in range(3):
            for backend in gets:
                us = anyio.run(storage_get_us, root, 3000, backend=backend)
                gets[backend] = min(gets[backend], us)
        rows.insert(
            2,
            Row(
                "Storage.get hit on trio",
                gets["trio"],
                "µs",
                "Storage.get on asyncio",
                gets["asyncio"],
                "<= 1.3x",
            ),
        )
        rows += [
            attrs.evolve(row, name=row.name + " on trio")
            for row in trio_rows
            if row.name.startswith(("Store.get", "get_or_compute", "p99"))
        ]
        rows += blocking_hits(root / "asyncio", "str", HITS, ["uniform"])
        rows += blocking_hits(root / "asyncio", "bytes", HITS, ["uniform"])
        rows += blocking_hits(root / "asyncio", "dict", HITS, list(PATTERNS))
        rows.append(blocking_misses(root))
        for shape in ("str", "dict"):
            rows += store_rss(root / "asyncio", shape)
        big = root / "bigroot"
        anyio.run(fill, big, "big", args.entries, 1024)
        scan_growth = rss_growth_mib(big, "scan")
        fetch_growth = rss_growth_mib(big, "fetchall")
        rows.append(
            Row(
                f"scan {args.entries:,} x 1 KiB: peak RSS growth",
                scan_growth,
                "MiB",
                "sqlite3 fetchall of the same rows",
                fetch_growth,
                "< 32 MiB",
            )
        )
        print_table("bench_storage", rows)


if __name__ == "__main__":
    main()
