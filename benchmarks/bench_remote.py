"""The shared tier next to raw coredis, measured in one run against a redis-server of its own.

A remote hit (local miss, Redis hit, local backfill) is compared with what it
cannot avoid: a raw coredis GET of the same key plus a local insert. A local
hit is compared with the same hit in an environment without a remote.

Run: python benchmarks/bench_remote.py [--keys 2000] [--size 256] [--backend asyncio]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import anyio
import coredis

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from _report import Row, per_call_us, print_table
from redis_server import RedisServer
from warmenv import Namespace, Origin, open_environment

NS = Namespace("bench", "remote", version="1")


def keys(n: int, tag: str) -> list[bytes]:
    return [b"%s-%08d" % (tag.encode(), i) for i in range(n)]


async def remote_hits_us(root: Path, url: str, ks: list[bytes]) -> float:
    async with open_environment("bench", root=root, remote=url) as env:
        storage = env.storage(NS)
        await storage.get(b"warm-up")  # the first connection
        start = time.perf_counter()
        for key in ks:
            if await storage.get(key) is None:
                raise AssertionError("expected a remote hit")
        return (time.perf_counter() - start) / len(ks) * 1e6


async def raw_get_and_insert_us(root: Path, url: str, rkeys: list[bytes], ks: list[bytes]) -> float:
    async with (
        coredis.Redis.from_url(url, decode_responses=False) as client,
        open_environment("bench", root=root, remote="") as env,
    ):
        storage = env.storage(NS)
        await client.get(b"warm-up")
        start = time.perf_counter()
        for rkey, key in zip(rkeys, ks, strict=True):
            value = await client.get(rkey)
            assert value is not None
            await storage.insert(key, value, Origin.REMOTE)
        return (time.perf_counter() - start) / len(ks) * 1e6


async def main(args: argparse.Namespace) -> None:
    server = RedisServer()
    server.start()
    try:
        rows = await measure(server.url, args.keys, args.size)
    finally:
        server.stop()
    print_table(f"The shared tier (Redis), {args.backend}", rows)


async def measure(url: str, n: int, size: int) -> list[Row]:
    payload = os.urandom(size)
    tmp = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    remote_best = raw_best = float("inf")
    for trial in range(3):
        tag = f"t{trial}"
        ks = keys(n, tag)
        async with open_environment("bench", root=tmp / f"publisher-{tag}", remote=url) as env:
            await env.storage(NS).insert_many((k, payload) for k in ks)
            assert env.remote is not None
            rkeys = [env.remote.redis_key(NS.full, k) for k in ks]
        # Alternate which side goes first so neither profits from a warmer machine.
        raw_root, remote_root = tmp / f"raw-{tag}", tmp / f"remote-{tag}"
        if trial % 2:
            raw_best = min(raw_best, await raw_get_and_insert_us(raw_root, url, rkeys, ks))
            remote_best = min(remote_best, await remote_hits_us(remote_root, url, ks))
        else:
            remote_best = min(remote_best, await remote_hits_us(remote_root, url, ks))
            raw_best = min(raw_best, await raw_get_and_insert_us(raw_root, url, rkeys, ks))

    hot = keys(200, "hot")
    async with (
        open_environment("bench", root=tmp / "local-with", remote=url) as with_remote,
        open_environment("bench", root=tmp / "local-without", remote="") as without,
    ):
        a, b = with_remote.storage(NS), without.storage(NS)
        await a.insert_many((k, payload) for k in hot)
        await b.insert_many((k, payload) for k in hot)
        sa = await with_remote.store(NS, None)
        sb = await without.store(NS, None)
        await sa.insert("k", {"v": 1})
        await sb.insert("k", {"v": 1})
        cycle = iter(range(1 << 62))

        async def hit_with() -> object:
            return await a.get(hot[next(cycle) % 200])

        async def hit_without() -> object:
            return await b.get(hot[next(cycle) % 200])

        storage_with = storage_without = float("inf")
        store_with = store_without = float("inf")
        for _ in range(3):
            storage_without = min(storage_without, await per_call_us(hit_without, 2000))
            storage_with = min(storage_with, await per_call_us(hit_with, 2000))
            store_without = min(store_without, await per_call_us(lambda: sb.get("k"), 200_000))
            store_with = min(store_with, await per_call_us(lambda: sa.get("k"), 200_000))
    return [
        Row(
            "remote hit (local miss, Redis hit, backfill)",
            remote_best,
            "us",
            "raw coredis GET + local insert",
            raw_best,
            "<= 1.3x",
        ),
        Row(
            "local hit, storage.get, with a remote",
            storage_with,
            "us",
            "the same without a remote",
            storage_without,
            "<= 1.05x",
        ),
        Row(
            "local hit, store.get, with a remote",
            store_with,
            "us",
            "the same without a remote",
            store_without,
            "<= 1.05x",
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio", "uvloop"])
    args = parser.parse_args()
    if args.backend == "uvloop":
        anyio.run(main, args, backend="asyncio", backend_options={"use_uvloop": True})
    else:
        anyio.run(main, args, backend=args.backend)
