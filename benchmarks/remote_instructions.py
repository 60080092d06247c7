"""Machine instructions per remote hit, counted by callgrind: a figure load cannot move.

`bench_remote.py --hits-only` times issue 23's remote hit (`get_or_compute`
of a key this host lacks and Redis holds: a local miss, a Redis hit, the
local back-fill) beside its floor (a raw coredis GET + a raw sqlite3 INSERT)
in wall-clock time, which a loaded machine moves by 2x between runs.
Callgrind counts instructions instead, the same on every run. The
redis-server runs outside callgrind (started here, on a free port); each
child fills Redis with `--keys` + 20 values of 256 bytes (as bench_remote
does), asks for the first 20 untimed (connections, subscription,
statements), then for the rest between two calls of `time.thread_time()`,
where callgrind dumps its counts (`--dump-before=time_thread_time`): the
second dump is the timed loop alone. Values queued to be written behind the
caller are written before the second mark (`Backfill.settle`), so their
write is counted, as the floor's INSERT is.

Only the event loop's thread is counted (`--separate-threads=yes`): its
instructions are the latency a caller waits for on a quiet machine, while
what other threads run meanwhile (the SQLite worker that reads the local
tier and writes the local copy) depends on the load. (Callgrind dumps only
the thread that reaches the mark, so another thread's part of the loop
cannot be told from its set-up.) The floor runs its INSERT on the loop's
thread, so it is counted whole; neither side's kernel work (sockets, page
writes) nor Redis's own is counted.

Run (valgrind and redis-server on PATH; `--tree` as often as there are trees):

    python benchmarks/remote_instructions.py --tree <a tree> --tree <another> \\
        [--backend asyncio --backend trio] [--keys 500] [--floor]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _report import CHILD, callgrind

UNTIMED = 20
SIZE = 256
SLOWDOWN = 50.0
"""About how much slower a remote hit runs under callgrind than natively, here."""


def child(backend: str, url: str, keys: int, floor: bool, slowdown: float) -> None:
    """The process callgrind runs: the marked loop of remote hits (or of the floor)."""
    import sqlite3

    import anyio
    import coredis

    from warmenv import Namespace, RemoteSettings, open_environment
    from warmenv.persistence import BytesCodec
    from warmenv.remote import backfill, lag

    # Wall-time periods, stretched as callgrind stretches the hits (see the module).
    lag.TICK *= slowdown  # type: ignore[misc]
    backfill.LINGER *= slowdown  # type: ignore[misc]

    namespace = Namespace("bench", "remote", version="1")
    ks = [b"k-%08d" % i for i in range(keys + UNTIMED)]
    # Callgrind runs the child 50x slower: a round trip must not count as an outage.
    settings = RemoteSettings(url, timeout=30.0, lease_ttl=120.0)

    async def never() -> bytes:
        raise AssertionError("expected a remote hit, not a computation")

    async def main() -> None:
        with tempfile.TemporaryDirectory() as root:
            async with open_environment("bench", root=f"{root}/pub", remote=settings) as env:
                await env.storage(namespace).insert_many((k, os.urandom(SIZE)) for k in ks)
                assert env.remote is not None
                rkeys = [env.remote.redis_key(namespace.full, k) for k in ks]
            if floor:
                await raw(f"{root}/raw", rkeys)
                return
            async with open_environment("bench", root=f"{root}/env", remote=settings) as env:
                assert env.remote is not None
                store = await env.store(namespace, BytesCodec())
                for key in ks[:UNTIMED]:
                    await store.get_or_compute(key, never)
                time.thread_time()  # callgrind dumps here: the set-up
                start = time.perf_counter()
                for key in ks[UNTIMED:]:
                    await store.get_or_compute(key, never)
                await env.remote.backfill.settle()  # the local copies' writes counted too
                time.thread_time()  # and here: the loop alone
                print(f"{(time.perf_counter() - start) / keys * 1e6:.0f}")
                assert env.remote.statistics().hits == len(ks)

    async def raw(root: str, rkeys: list[bytes]) -> None:
        async with open_environment("bench", root=root, remote="") as env:
            path = env.path  # an environment-shaped file, its schema made by warmenv
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        insert = (
            "INSERT INTO entries (namespace, key, value, origin, written_at, cost)"
            " VALUES (?, ?, ?, 2, ?, NULL)"
        )
        try:
            async with coredis.Redis.from_url(url, decode_responses=False) as client:
                for i, (rkey, key) in enumerate(zip(rkeys, ks, strict=True)):
                    if i == UNTIMED:
                        time.thread_time()  # callgrind dumps here: the set-up
                    value = await client.get(rkey)
                    assert value is not None
                    conn.execute(insert, (namespace.full, key, value, time.time()))
                time.thread_time()  # and here: the loop alone
        finally:
            conn.close()

    anyio.run(main, backend=backend)


def count(
    tree: Path, backend: str, url: str, keys: int, floor: bool, slowdown: float
) -> tuple[float, str]:
    """Instructions per hit of the child's timed loop over `tree`'s src, the loop's thread,
    and the microseconds a hit took under callgrind (warmenv's; the floor prints none)."""
    args = [backend, url, str(keys), "floor" if floor else "warmenv", str(slowdown)]
    counted = callgrind(__file__, tree, args, loop=True)
    return counted.threads[0] / keys, counted.stdout.strip()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        backend, url, keys, what, slowdown = sys.argv[2:7]
        child(backend, url, int(keys), what == "floor", float(slowdown))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, action="append", required=True)
    parser.add_argument("--backend", action="append", choices=["asyncio", "trio"])
    parser.add_argument("--keys", type=int, default=500, help="remote hits in the timed loop")
    parser.add_argument("--floor", action="store_true", help="also count GET + sqlite3 INSERT")
    parser.add_argument(
        "--slowdown",
        type=float,
        default=SLOWDOWN,
        help="the factor the tier's ticker and the back-fill's linger are stretched by in the"
        " child (1: as shipped; see the module docstring)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from redis_server import RedisServer

    server = RedisServer()
    server.start()
    try:
        print(
            "| tree | backend | remote hit, instructions | floor (GET + INSERT) | ratio"
            " | us per hit under callgrind |"
        )
        print("|---|---|---:|---:|---:|---:|")
        for backend in args.backend or ["asyncio", "trio"]:
            floor = None
            if args.floor:
                floor, _ = count(args.tree[0], backend, server.url, args.keys, True, args.slowdown)
            for tree in args.tree:
                hit, us = count(tree, backend, server.url, args.keys, False, args.slowdown)
                shown = ("", "") if floor is None else (f"{floor:,.0f}", f"{hit / floor:.2f}x")
                print(
                    f"| {tree} | {backend} | {hit:,.0f} | {shown[0]} | {shown[1]} | {us} |",
                    flush=True,
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
