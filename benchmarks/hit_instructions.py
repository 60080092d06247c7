"""Machine instructions per store hit, counted by callgrind: a figure load cannot move.

Wall-clock ratios of the hit rows (`bench_storage.py --hits`) drift by 10 to
20 % between runs on a shared machine, and more between the asyncio and the
trio rows of one run (the trio rows run second in the process, over a heap
the first left behind): too much to see what one Python frame more or less
costs. Callgrind counts the instructions a loop of hits runs, the same on
every run. Each child opens an environment, fills an EAGER store of 1,000
keys, hits each once, then `await`s `--hits` hits between two calls of
`time.thread_time()`; callgrind dumps its counts before each such call
(`--dump-before=time_thread_time`), so the second dump is the loop alone.
Only the looping thread's instructions are counted (`--separate-threads`):
what other threads run meanwhile (warmenv.blocking's loop thread draining the
hits' statistics, a timer) depends on how long the loop takes, so on the
load, and would be counted with it otherwise (the blocking `str` row read
4,267 and 5,130 instructions on the same tree, at load 8 and 20).
`--floor` times the benchmark's floor instead (`dict.get` in a coroutine; for
`--backend blocking`, `warmenv.blocking`'s get on a plain thread, `dict.get`
under a `threading.Lock`).

`--flat-get` counts `bench_bundle.py --get-only`'s row instead: `await
bundle.get(namespace, key)` on a flat bundle of `--entries` 1 KiB values, keys
in a shuffled cycle, from a coroutine as that benchmark calls it; its floor
is the benchmark's too, a sqlite3 point lookup on one connection over the
same rows. Most of that lookup's time is the kernel's page reads, which
callgrind does not count: its instructions are a floor of the Python side,
not of the time.

Run (valgrind on PATH; `--tree` as often as there are trees to compare):

    python benchmarks/hit_instructions.py --tree <a tree> --tree <another> \\
        [--backend asyncio --backend trio --backend blocking] \\
        [--shape str --shape bytes --shape dict] [--floor]
    python benchmarks/hit_instructions.py --tree <a tree> --flat-get [--floor]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _report import CHILD, callgrind

KEYS = 1000


def value_of(shape: str, i: int) -> Any:
    """A value of the bench_storage rows' kinds."""
    if shape == "bytes":
        return b"v" * 200 + str(i).encode()
    if shape == "dict":
        return {"name": f"n{i}", "sizes": [i, i + 1, i + 2], "ok": True, "pad": "v" * 150}
    return "v" * 200 + str(i)


def key_of(shape: str, i: int) -> Any:
    return f"key-{i:06d}".encode() if shape == "bytes" else f"key-{i:06d}"


def child(backend: str, shape: str, hits: int, floor: bool) -> None:
    """The process callgrind runs: the marked loop of hits."""
    import anyio

    from warmenv import CacheMode, Namespace, open_environment
    from warmenv.persistence.codec import BytesCodec, JsonCodec

    namespace = Namespace("bench", f"hits-{shape}", version="1")
    codec: Any = BytesCodec() if shape == "bytes" else JsonCodec()

    async def fill(root: str) -> None:
        async with open_environment("hits", root=root) as env:
            await env.storage(namespace).insert_many(
                (codec.encode_key(key_of(shape, i)), codec.encode_value(value_of(shape, i)))
                for i in range(KEYS)
            )

    if backend == "blocking":
        with tempfile.TemporaryDirectory() as root:
            anyio.run(fill, root)
            blocking_hits(root, namespace, codec, shape, hits, floor)
        return

    async def main() -> None:
        with tempfile.TemporaryDirectory() as root:
            await fill(root)
            async with open_environment("hits", root=root) as env:
                store = await env.store(namespace, codec, mode=CacheMode.EAGER)
                keys = [key_of(shape, i) for i in range(KEYS)]
                plain = {key: value_of(shape, i) for i, key in enumerate(keys)}

                async def dict_get(key: Any) -> Any:
                    return plain.get(key)

                get = dict_get if floor else store.get
                for key in keys:  # held, its hot set warm
                    await get(key)
                time.thread_time()  # callgrind dumps here: the set-up
                for _ in range(hits // KEYS):
                    for key in keys:
                        await get(key)
                time.thread_time()  # and here: the loop alone

    anyio.run(main, backend=backend)


def blocking_hits(
    root: str, namespace: Any, codec: Any, shape: str, hits: int, floor: bool
) -> None:
    """The marked loop of `warmenv.blocking` hits on a plain thread (floor: a locked dict.get)."""
    import threading

    from warmenv import CacheMode, blocking

    with blocking.open_environment("hits", root=root) as env:
        store = env.store(namespace, codec, mode=CacheMode.EAGER)
        keys = [key_of(shape, i) for i in range(KEYS)]
        plain = {key: value_of(shape, i) for i, key in enumerate(keys)}
        lock = threading.Lock()

        def locked_get(key: Any) -> Any:
            with lock:
                return plain.get(key)

        get = locked_get if floor else store.get
        for key in keys:  # held, its hot set warm
            get(key)
        time.thread_time()  # callgrind dumps here: the set-up
        for _ in range(hits // KEYS):
            for key in keys:
                get(key)
        time.thread_time()  # and here: the loop alone


def flat_gets(bundle: str, source: str, entries: int, gets: int, floor: bool) -> None:
    """The marked loop of flat gets (floor: sqlite3 point lookups), as bench_bundle times it."""
    import itertools
    import random
    import sqlite3

    import anyio

    from warmenv import Namespace
    from warmenv.bundle import FlatBundle

    namespace = Namespace("bench", "bundle", version="1")  # bench_bundle's
    keys = [b"key-%08d" % i for i in range(entries)]  # bench_bundle's
    random.Random(0).shuffle(keys)
    next_key = itertools.cycle(keys).__next__
    query = "SELECT value FROM entries WHERE namespace = ? AND key = ?"

    async def main() -> None:
        async with FlatBundle.open(bundle) as opened:
            conn = sqlite3.connect(source)

            async def flat_get() -> None:
                await opened.get(namespace, next_key())

            async def sqlite_get() -> None:
                conn.execute(query, (namespace.full, next_key())).fetchone()

            one = sqlite_get if floor else flat_get
            for _ in range(KEYS):  # the code's paths warm
                await one()
            time.thread_time()  # callgrind dumps here: the set-up
            for _ in range(gets):
                await one()
            time.thread_time()  # and here: the loop alone
            conn.close()

    anyio.run(main)


def make_flat(root: Path, entries: int) -> tuple[Path, Path]:
    """bench_bundle's rows: an environment file of `entries` 1 KiB values and its flat bundle."""
    import anyio

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_bundle import export_per_s, make_source

    source = anyio.run(make_source, root, entries, 1024)
    bundle = root / "b.flat"
    anyio.run(export_per_s, source, bundle, "flat", entries)
    return bundle, source


def count(tree: Path, backend: str, shape: str, hits: int, floor: bool) -> float:
    """Instructions per hit of the child's loop under callgrind, over `tree`'s src."""
    args = [backend, shape, str(hits), "floor" if floor else "store"]
    return callgrind_loop(tree, args, hits // KEYS * KEYS)


def callgrind_loop(tree: Path, args: list[str], calls: int) -> float:
    """Instructions per call of the loop the child given `args` runs, over `tree`'s src."""
    return callgrind(__file__, tree, args, loop=True, hash_seed=None).threads[0] / calls


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        if sys.argv[2] == "flat":
            bundle, source, entries, gets, what = sys.argv[3:8]
            flat_gets(bundle, source, int(entries), int(gets), what == "floor")
            return
        backend, shape, hits, what = sys.argv[2:6]
        child(backend, shape, int(hits), what == "floor")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, action="append", required=True)
    parser.add_argument(
        "--backend",
        action="append",
        choices=["asyncio", "trio", "blocking"],
        help="blocking: warmenv.blocking's get on a plain thread, its floor dict.get under a"
        " threading.Lock",
    )
    parser.add_argument("--shape", action="append", choices=["str", "bytes", "dict"])
    parser.add_argument("--hits", type=int, default=20_000)
    parser.add_argument("--floor", action="store_true", help="also count the dict.get floor")
    parser.add_argument(
        "--flat-get",
        action="store_true",
        help="count bench_bundle.py --get-only's flat get instead (its floor: a sqlite3 point"
        " lookup on one connection over the same rows)",
    )
    parser.add_argument("--entries", type=int, default=100_000, help="--flat-get's bundle size")
    args = parser.parse_args()
    if args.flat_get:
        flat_main(args.tree, args.entries, args.hits, args.floor)
        return
    floor_name = "floor (dict.get in a coroutine; blocking: under a threading.Lock)"
    print(f"| tree | backend | shape | instructions per hit | {floor_name} |")
    print("|---|---|---|---:|---:|")
    for backend in args.backend or ["asyncio", "trio"]:
        for shape in args.shape or ["str"]:
            for tree in args.tree:
                hit = count(tree, backend, shape, args.hits, floor=False)
                floor = count(tree, backend, shape, args.hits, floor=True) if args.floor else None
                shown = "" if floor is None else f"{floor:,.0f}"
                print(f"| {tree} | {backend} | {shape} | {hit:,.0f} | {shown} |", flush=True)


def flat_main(trees: list[Path], entries: int, gets: int, floor: bool) -> None:
    """The `--flat-get` table: instructions per flat get of each tree (and the floor's)."""
    print("| tree | flat get, instructions | sqlite3 point lookup, instructions |")
    print("|---|---:|---:|")
    with tempfile.TemporaryDirectory() as root:
        bundle, source = make_flat(Path(root), entries)
        args = ["flat", str(bundle), str(source), str(entries), str(gets)]
        for tree in trees:
            get = callgrind_loop(tree, [*args, "get"], gets)
            lookup = callgrind_loop(tree, [*args, "floor"], gets) if floor else None
            shown = "" if lookup is None else f"{lookup:,.0f}"
            print(f"| {tree} | {get:,.0f} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
