"""Fetched values are written to the local tier behind the caller: bounded, flushed, never lost.

Real Redis servers of the tests' own (`redis_server`), real SQLite files,
real child processes for the crash.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio

from helpers import run_python
from redis_server import COREDIS_UNCLOSED_STREAMS, RedisServer
from warmenv import CacheMode, Namespace, open_environment
from warmenv.persistence import BytesCodec, Origin
from warmenv.remote import RemoteSettings, RemoteStorage
from warmenv.remote.backfill import Backfill

pytestmark = [pytest.mark.anyio, *COREDIS_UNCLOSED_STREAMS]

NS = Namespace("app", "backfill", version="1")


@pytest.fixture(autouse=True)
def _collect_here() -> Iterator[None]:
    yield
    gc.collect()


async def never() -> bytes:
    raise AssertionError("the fleet holds this key: nothing is computed")


async def _publish(root: Path, url: str, keys: list[bytes]) -> None:
    async with open_environment("fleet", root=root, remote=url) as env:
        await env.storage(NS).insert_many((k, b"v-" + k) for k in keys)


def _local_rows(db: Path) -> dict[bytes, int]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT key, origin FROM entries WHERE namespace = ?", (NS.full,))
        return {bytes(k): int(o) for k, o in rows}


async def test_closing_writes_every_fetched_value_still_queued(
    tmp_path: Path, server: RedisServer
) -> None:
    keys = [b"k%04d" % i for i in range(300)]
    await _publish(tmp_path / "a", server.url, keys)
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as env:
        store = await env.store(NS, BytesCodec())
        for key in keys:
            assert await store.get_or_compute(key, never) == b"v-" + key
        path = env.path
    assert _local_rows(path) == {key: int(Origin.REMOTE) for key in keys}


async def test_a_queued_value_is_served_and_seen_by_every_operation(
    tmp_path: Path, server: RedisServer
) -> None:
    keys = [b"k%04d" % i for i in range(50)]
    await _publish(tmp_path / "a", server.url, keys)
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as env:
        storage = env.storage(NS)
        assert isinstance(storage, RemoteStorage) and env.remote is not None
        for key in keys:
            assert await storage.get(key) == b"v-" + key
        # Served from the queue (or the file) without asking Redis again.
        hits = env.remote.statistics().hits
        assert [await storage.get(key) for key in keys] == [b"v-" + k for k in keys]
        assert storage.get_blocking(keys[0]) == b"v-" + keys[0]
        assert env.remote.statistics().hits == hits
        # Every other operation first waits for the queue: the file holds them all.
        assert (await storage.summary()).entries == len(keys)
        assert [k async for k, _ in storage.scan()] == keys
        assert env.remote.statistics().backfill_pending == 0


async def test_a_purged_key_does_not_come_back_from_the_queue(
    tmp_path: Path, server: RedisServer
) -> None:
    await _publish(tmp_path / "a", server.url, [b"gone"])
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as env:
        storage = env.storage(NS)
        assert await storage.get(b"gone") == b"v-gone"
        await storage.purge_key(b"gone")
        assert await storage.get(b"gone") is None
        path = env.path
    assert _local_rows(path) == {}


async def test_the_queue_never_holds_more_than_its_bound(
    tmp_path: Path, server: RedisServer
) -> None:
    keys = [b"k%04d" % i for i in range(40)]
    settings = RemoteSettings(server.url, max_backfill=8)
    async with open_environment("fleet", root=tmp_path, remote=settings, lock_timeout=5) as env:
        storage = env.storage(NS)
        assert isinstance(storage, RemoteStorage) and env.remote is not None
        backfill = env.remote.backfill
        # Another connection holds the write lock for a while: the flushes wait for
        # it, and so do the callers that find the queue full.
        locker = sqlite3.connect(env.path, isolation_level=None, check_same_thread=False)
        locker.execute("BEGIN IMMEDIATE")
        seen: list[int] = []

        async def fetched(key: bytes) -> None:
            await backfill.put(storage.local, key, (key, b"v-" + key, None, None))
            seen.append(len(backfill))

        async def release_later() -> None:
            await anyio.sleep(0.3)
            seen.append(len(backfill))
            locker.execute("COMMIT")

        async with anyio.create_task_group() as tg:
            tg.start_soon(release_later)
            for key in keys:
                tg.start_soon(fetched, key)
        locker.close()
        await backfill.settle()
        stats = env.remote.statistics()
        path = env.path
    assert max(seen) <= 8 and len(seen) == len(keys) + 1
    assert stats.backfill_waits > 0 and stats.backfill_failed == 0
    assert _local_rows(path) == {key: int(Origin.REMOTE) for key in keys}


CRASHING_CHILD = """
import os, signal, sys, anyio
from warmenv import Namespace, open_environment
from warmenv.persistence import BytesCodec, Stored

async def never():
    raise AssertionError("not computed")

async def main():
    async with open_environment("fleet", root=sys.argv[1], remote=sys.argv[2]) as env:
        store = await env.store(Namespace("app", "backfill", version="1"), BytesCodec())
        for i in range(200):
            await store.get_or_compute(b"k%04d" % i, never)
        assert isinstance(await store.insert(b"mine", b"computed here"), Stored)
        print(env.remote.statistics().backfill_pending, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

anyio.run(main, backend=sys.argv[3])
"""


async def test_a_crash_loses_nothing_the_caller_was_promised(
    tmp_path: Path, server: RedisServer, anyio_backend_name: str
) -> None:
    keys = [b"k%04d" % i for i in range(200)]
    await _publish(tmp_path / "a", server.url, keys)
    backend = "trio" if anyio_backend_name == "trio" else "asyncio"
    child = await anyio.to_thread.run_sync(
        lambda: run_python(CRASHING_CHILD, str(tmp_path / "b"), server.url, backend)
    )
    assert child.returncode == -9, child.stderr
    # What the child inserted was written before insert returned: it survives the kill.
    async with open_environment("fleet", root=tmp_path / "b", remote="") as env:
        assert await env.storage(NS).get(b"mine") == b"computed here"
    # A fetched copy the kill cut short is fetched again: the fleet still holds it.
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as env:
        store = await env.store(NS, BytesCodec())
        for key in keys:
            assert await store.get_or_compute(key, never) == b"v-" + key


async def test_closing_the_environment_itself_writes_every_fetched_value_first(
    tmp_path: Path, server: RedisServer
) -> None:
    """`env.close()` inside the block: what is queued is written before the database closes."""
    keys = [b"k%04d" % i for i in range(100)]
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        storage = env.storage(NS)
        assert isinstance(storage, RemoteStorage) and env.remote is not None
        backfill = env.remote.backfill
        for key in keys:
            await backfill.put(storage.local, key, (key, b"v-" + key, None, None))
        assert len(backfill) == len(keys)  # all still queued as the close begins
        await env.close()
        assert backfill.failed == 0
        path = env.path
    assert _local_rows(path) == {key: int(Origin.REMOTE) for key in keys}


@contextmanager
def spawned_tasks() -> Iterator[list[object]]:
    """Every task spawned on the running event loop while the block runs.

    trio's instruments see each spawn; asyncio (and uvloop) make every task
    through the loop's task factory, which is wrapped for the block.
    """
    spawned: list[object] = []
    if sniffio.current_async_library() == "trio":
        import trio

        class Spawns(trio.abc.Instrument):
            def task_spawned(self, task: trio.lowlevel.Task) -> None:
                spawned.append(task)

        instrument = Spawns()
        trio.lowlevel.add_instrument(instrument)
        try:
            yield spawned
        finally:
            trio.lowlevel.remove_instrument(instrument)
        return
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        if previous is None:
            task: Any = asyncio.Task(coro, loop=loop, **kwargs)
        else:
            task = previous(loop, coro, **kwargs)
        spawned.append(task)
        return task

    loop.set_task_factory(factory)
    try:
        yield spawned
    finally:
        loop.set_task_factory(previous)


async def test_a_remote_hit_spawns_no_task(tmp_path: Path, server: RedisServer) -> None:
    """A local miss and a Redis hit (the local read begun beside the Redis one, as an
    EAGER store asks), the local copy queued: all on the caller's task."""
    keys = [b"k%04d" % i for i in range(60)]
    await _publish(tmp_path / "a", server.url, keys)
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as env:
        store = await env.store(NS, BytesCodec(), mode=CacheMode.EAGER)
        for key in keys[:10]:  # the connections, the subscription, the tier's ticker
            assert await store.get_or_compute(key, never) == b"v-" + key
        with spawned_tasks() as spawned:
            for key in keys[10:]:
                assert await store.get_or_compute(key, never) == b"v-" + key
        assert env.remote is not None and env.remote.statistics().hits == len(keys)
    assert spawned == []


async def test_a_cancelled_environment_block_still_writes_every_fetched_value(
    tmp_path: Path, server: RedisServer
) -> None:
    """The block is cancelled with values queued: its close writes them all first."""
    keys = [b"k%04d" % i for i in range(100)]
    with anyio.CancelScope() as scope:
        async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
            storage = env.storage(NS)
            assert isinstance(storage, RemoteStorage) and env.remote is not None
            backfill = env.remote.backfill
            for key in keys:
                await backfill.put(storage.local, key, (key, b"v-" + key, None, None))
            assert len(backfill) == len(keys)  # all still queued as the cancellation comes
            path = env.path
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught and backfill.failed == 0 and len(backfill) == 0
    assert _local_rows(path) == {key: int(Origin.REMOTE) for key in keys}


async def test_a_flush_that_finds_its_lock_free_takes_it_without_yielding(
    tmp_path: Path, server: RedisServer
) -> None:
    """The flush is shielded: a checkpoint taking its lock could only yield, per batch."""
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        storage = env.storage(NS)
        assert isinstance(storage, RemoteStorage)
        backfill = Backfill(8)  # a queue of the test's own: no flusher takes its lock meanwhile
        others_ran: list[bool] = []

        async def other() -> None:
            others_ran.append(True)

        async with anyio.create_task_group() as tg:
            await backfill.put(storage.local, b"k", (b"k", b"v-k", None, None))
            tg.start_soon(other)
            await backfill.flush()  # takes the free lock, then writes (that yields)
            assert others_ran == [True]
            tg.start_soon(other)
            await backfill.flush()  # nothing queued: the free lock taken and given back
            assert others_ran == [True]
        assert await storage.get(b"k") == b"v-k"
