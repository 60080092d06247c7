"""The shared tier: hosts (roots) sharing values through a real redis-server of the test's own."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import re
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import coredis
import pytest
from coredis.retry import NoRetryPolicy

from helpers import Trials, backend_label, reliability_row, run_python
from redis_server import COREDIS_UNCLOSED_STREAMS, RedisServer, free_port, redis_server
from test_blocking import TracingCodec
from warmenv import ClosedError, Namespace, open_environment
from warmenv._url import check_redis_url, redact
from warmenv.blocking import open_environment as open_blocking
from warmenv.persistence import (
    CacheMode,
    Conflict,
    Failed,
    MemoryStorage,
    Origin,
    Purged,
    Store,
    Stored,
)
from warmenv.persistence.storage import EntryInfo, may_replace
from warmenv.remote import RemoteError, RemoteSettings, RemoteStatistics, RemoteStorage, RemoteTier
from warmenv.remote.lag import TICK

pytestmark = [
    pytest.mark.anyio,
    *COREDIS_UNCLOSED_STREAMS,
]

NS = Namespace("app", "kernels", version="1")
PASSWORD = "s3cret-Pa55word"


@pytest.fixture(autouse=True)
def _collect_here() -> Iterator[None]:
    yield
    gc.collect()


async def compute(value: object) -> object:
    await anyio.lowlevel.checkpoint()
    return value


def test_the_insert_rules_for_fetched_values() -> None:
    assert not may_replace(Origin.LOCAL, Origin.REMOTE)
    assert not may_replace(Origin.IMPORTED, Origin.REMOTE)
    assert not may_replace(Origin.REMOTE, Origin.REMOTE)
    assert not may_replace(Origin.REMOTE, Origin.IMPORTED)
    assert may_replace(Origin.REMOTE, Origin.LOCAL)
    assert may_replace(Origin.IMPORTED, Origin.LOCAL)


async def test_a_local_value_replaces_a_fetched_one_and_a_fetched_one_replaces_nothing(
    tmp_path: Path,
) -> None:
    async with open_environment("h", root=tmp_path) as env:
        storages = [env.storage(NS), MemoryStorage(NS)]
        for storage in storages:
            assert isinstance(await storage.insert(b"k", b"1", Origin.IMPORTED), Stored)
            assert isinstance(await storage.insert(b"k", b"2", Origin.REMOTE), Conflict)
            assert isinstance(await storage.insert(b"r", b"2", Origin.REMOTE), Stored)
            assert isinstance(await storage.insert(b"r", b"3", Origin.LOCAL), Stored)
            assert await storage.get(b"r") == b"3"


async def test_a_value_computed_on_one_host_is_a_hit_on_another(
    tmp_path: Path, server: RedisServer
) -> None:
    calls = 0

    async def expensive() -> dict[str, int]:
        nonlocal calls
        calls += 1
        return {"kernel": 42}

    async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
        store: Store[str, Any] = await a.store(NS)
        assert await store.get_or_compute("k", expensive) == {"kernel": 42}
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
        store = await b.store(NS)
        assert await store.get_or_compute("k", expensive) == {"kernel": 42}
        storage = b.storage(NS)
        assert isinstance(storage, RemoteStorage)
        assert b.remote is not None
        await b.remote.backfill.settle()  # the local copy is written behind the caller
        info = await storage.local.info(b'"k"')
        assert info is not None and info.origin is Origin.REMOTE
        assert b.remote is not None and b.remote.statistics().hits == 1
    assert calls == 1


async def test_a_store_opened_over_a_shared_storage_holds_nothing_once_closed(
    tmp_path: Path, server: RedisServer
) -> None:
    # Store.open(env.storage(ns)) over the shared tier answered from memory after close.
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        storage = env.storage(NS)
        assert isinstance(storage, RemoteStorage)
        store: Store[str, int] = await Store.open(storage)
        await store.insert("m", 1)
        assert await store.get("m") == 1
    with pytest.raises(ClosedError, match="closed"):
        await store.get("m")


async def test_keys_are_prefixed_by_environment_and_namespace(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes]
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        await env.storage(NS).insert(b"\x00key", b"v")
    keys = [key async for key in raw.scan_iter()]
    assert keys == [b"warmenv:fleet:" + NS.full.encode() + b":" + b"\x00key".hex().encode()]
    async with open_environment("other", root=tmp_path, remote=server.url) as env:
        assert await env.storage(NS).get(b"\x00key") is None


async def test_the_first_writer_fleet_wide_wins(tmp_path: Path, server: RedisServer) -> None:
    async with (
        open_environment("fleet", root=tmp_path / "a", remote=server.url) as a,
        open_environment("fleet", root=tmp_path / "b", remote=server.url) as b,
        open_environment("fleet", root=tmp_path / "c", remote=server.url) as c,
    ):
        assert isinstance(await a.storage(NS).insert(b"k", b"first"), Stored)
        assert isinstance(await b.storage(NS).insert(b"k", b"second"), Stored)
        assert await c.storage(NS).get(b"k") == b"first"
        assert a.remote is not None and b.remote is not None
        assert a.remote.statistics().published == 1
        assert b.remote.statistics().already_published == 1
        assert b.remote.statistics().publish_blocked == 0


@pytest.mark.parametrize("kind", ["hash", "list", "garbage", "empty", "short", "old-short"])
async def test_something_not_warmenv_s_under_a_key_is_counted_as_blocking_its_publication(
    tmp_path: Path,
    server: RedisServer,
    raw: coredis.Redis[bytes],
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        assert env.remote is not None
        rkey = env.remote.redis_key(NS.full, b"k")
        if kind == "hash":
            await raw.hset(rkey, {b"a": b"b"})
        elif kind == "list":
            await raw.rpush(rkey, [b"a", b"b"])
        elif kind == "garbage":
            await raw.set(rkey, os.urandom(64))
        elif kind == "empty":
            await raw.set(rkey, b"")
        elif kind == "short":  # the marker, too short for a frame
            await raw.set(rkey, b"warmenv2" + b"x" * 31)
        else:
            await raw.set(rkey, b"warmenv1" + b"x" * 15)
        storage = env.storage(NS)
        with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
            for _ in range(3):
                await storage.replace(b"k", b"v")
        stats = env.remote.statistics()
        assert (stats.publish_blocked, stats.already_published, stats.published) == (3, 0, 0)
        assert stats.failures == stats.outages == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, warned  # once per key
    assert repr(rkey) in warned[0] and "delete it (DEL)" in warned[0]


async def test_a_value_over_the_cap_stays_local_and_is_counted(
    tmp_path: Path, server: RedisServer
) -> None:
    settings = RemoteSettings(server.url, max_value_bytes=100)
    async with open_environment("fleet", root=tmp_path / "a", remote=settings) as a:
        assert isinstance(await a.storage(NS).insert(b"big", b"x" * 101), Stored)
        assert await a.storage(NS).get(b"big") == b"x" * 101
        assert a.remote is not None and a.remote.statistics().too_large == 1
    async with open_environment("fleet", root=tmp_path / "b", remote=settings) as b:
        assert await b.storage(NS).get(b"big") is None


async def test_a_burst_of_calls_opens_no_more_connections_than_the_pool_holds(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes]
) -> None:
    settings = RemoteSettings(server.url, max_connections=2)
    async with open_environment("fleet", root=tmp_path, remote=settings) as env:
        storage = env.storage(NS)
        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(storage.get, b"missing-%d" % i)
                tg.start_soon(storage.insert, b"k%d" % i, b"v")
        clients = await raw.client_list()
        assert env.remote is not None and env.remote.statistics().published == 200
    # The raw client, the pool and the tier's one subscription.
    assert len(clients) <= 1 + settings.max_connections + 1, clients


async def test_publishing_a_value_is_one_round_trip(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes]
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        storage = env.storage(NS)
        await storage.insert(b"first", b"v")  # connects and loads the script
        assert env.remote is not None
        await _until_subscribed(env.remote.statistics)
        await raw.config_resetstat()
        for i in range(20):
            await storage.insert(b"k%d" % i, b"v")
        stats = await raw.info("commandstats")
    calls: dict[str, int] = {}
    for name, counts in stats.items():
        assert isinstance(counts, dict)
        calls[str(name)] = int(counts["calls"])
    # One EVALSHA per insert; its SET NX runs inside it, on the server, and so does
    # the look at the key's lease: with no lease held nobody waits, so no PUBLISH.
    assert calls == {
        "cmdstat_config|resetstat": 1,
        "cmdstat_evalsha": 20,
        "cmdstat_set": 20,
        "cmdstat_exists": 20,
    }


async def test_another_process_shares_its_values(tmp_path: Path, server: RedisServer) -> None:
    code = f"""
import anyio, sys
from warmenv import Namespace, open_environment
async def main():
    async with open_environment("fleet", root=sys.argv[1], remote=sys.argv[2]) as env:
        store = await env.store(Namespace("app", "kernels", version="1"))
        for i in range(5):
            await store.insert(f"k{{i}}", {{"i": i}})
anyio.run(main, backend={"trio"!r})
"""
    child = await anyio.to_thread.run_sync(
        lambda: run_python(code, str(tmp_path / "child"), server.url)
    )
    assert child.returncode == 0, child.stderr
    async with open_environment("fleet", root=tmp_path / "parent", remote=server.url) as env:
        store: Store[str, Any] = await env.store(NS)
        assert [await store.get(f"k{i}") for i in range(5)] == [{"i": i} for i in range(5)]


def _one_try(settings: RemoteSettings) -> float:
    """The most one call that tries Redis may cost, in the server's time (`waited`).

    Its timeout, and the tier's clock's grain (`warmenv.remote.lag`): a deadline
    is looked at every TICK, so it is cancelled up to a TICK after it fell due,
    and the call's unwinding is measured to a TICK.
    """
    return settings.timeout + 2 * TICK


@contextlib.contextmanager
def _each_try_costs_at_most_the_timeout(tier: RemoteTier) -> Iterator[None]:
    """The calls of the block (one after another) cost the server's time of one timeout
    per call that tried Redis, and nothing for those skipped while it backs off.

    Counted in the server's time (`RemoteStatistics.waited`), not in wall time: a
    starved CPU makes every call slower in wall time, and that is not what the
    tier promises to bound. Against a Redis that does not answer, every try fails.
    """
    before = tier.statistics()
    yield
    after = tier.statistics()
    tries = after.failures - before.failures
    assert after.waited - before.waited <= tries * _one_try(tier.settings), (before, after)


async def _each_call_costs_at_most_the_timeout(env_root: Path, url: str, tag: str) -> None:
    """Every call against a remote that does not answer costs at most the timeout per try
    of the server, and is served locally."""
    async with open_environment("fleet", root=env_root, remote=url) as env:
        assert env.remote is not None
        store: Store[str, Any] = await env.store(NS)
        for i in range(10):
            with _each_try_costs_at_most_the_timeout(env.remote):
                assert await store.get(f"{tag}-missing-{i}") is None
                assert await store.get_or_compute(f"{tag}-{i}", compute, i) == i
                assert await store.get(f"{tag}-{i}") == i
        stats = env.remote.statistics()
        assert stats.outages == 1 and not stats.available and stats.failures >= 1


STOPPED_CHECKED = (
    "with Redis killed, each of 10 get_or_compute + get pairs returns the local answer and "
    "costs at most one timeout of the server's time per try of Redis (RemoteStatistics.waited); "
    "one warning and one outage counted; after a restart (empty) the tier publishes again and "
    "another host reads a value written after it"
)


async def stopped_mid_run(
    tmp_path: Path,
    server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    trials: int,
    row: Trials,
) -> float:
    """Redis is killed under a host, then started again, `trials` times; the most a pair of
    calls waited on Redis (in the server's time, s)."""
    slowest = 0.0
    for trial in range(trials):
        with row.trial():
            caplog.clear()
            here = tmp_path / f"trial{trial}"
            async with open_environment("fleet", root=here / "a", remote=server.url) as a:
                store: Store[str, Any] = await a.store(NS)
                await store.insert("before", 1)
                await anyio.to_thread.run_sync(server.stop)
                with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
                    assert a.remote is not None
                    for i in range(10):
                        before = a.remote.statistics().waited
                        with _each_try_costs_at_most_the_timeout(a.remote):
                            assert await store.get_or_compute(f"during-{i}", compute, i) == i
                            assert await store.get(f"missing-{i}") is None
                        slowest = max(slowest, a.remote.statistics().waited - before)
                outage = [r for r in caplog.records if "unavailable" in r.message]
                assert [r.levelno for r in outage] == [logging.WARNING]
                assert a.remote.statistics().outages == 1
                await anyio.to_thread.run_sync(server.start)
                # The tier retries after its backoff; poll (bounded) until it does.
                with anyio.fail_after(10), caplog.at_level(logging.INFO, logger="warmenv.remote"):
                    i = 0
                    while (
                        not a.remote.statistics().available or a.remote.statistics().published < 2
                    ):
                        await store.insert(f"after-{i}", i)
                        i += 1
                        await anyio.sleep(0.05)
                # A recovery is news, not a problem: one line, at INFO.
                recovery = [r for r in caplog.records if "answers again" in r.message]
                assert [r.levelno for r in recovery] == [logging.INFO]
            async with open_environment("fleet", root=here / "b", remote=server.url) as b:
                later: Store[str, Any] = await b.store(NS, mode=CacheMode.LAZY)
                assert await later.get(f"after-{i - 1}") == i - 1
    return slowest


async def test_a_stopped_redis_costs_each_call_at_most_the_timeout_and_is_used_after_restart(
    tmp_path: Path, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    await stopped_mid_run(tmp_path, server, caplog, 1, Trials("Redis stopped mid-run", ""))


@pytest.mark.slow
async def test_long_redis_stopped_mid_run(
    tmp_path: Path, server: RedisServer, caplog: pytest.LogCaptureFixture, anyio_backend: object
) -> None:
    trials = int(os.environ.get("WARMENV_REDIS_STOP_TRIALS", "10"))
    scenario = f"Redis killed under a host, then restarted empty ({backend_label(anyio_backend)})"
    with reliability_row(scenario, STOPPED_CHECKED) as row:
        slowest = await stopped_mid_run(tmp_path, server, caplog, trials, row)
        row.checked = (
            f"{STOPPED_CHECKED} (the most a pair of calls waited on Redis during the outage:"
            f" {slowest:.2f} s of the server's time)"
        )


async def test_a_redis_that_stops_answering_costs_each_call_at_most_the_timeout(
    tmp_path: Path, server: RedisServer
) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        await _each_call_costs_at_most_the_timeout(tmp_path, server.url, "frozen")
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


async def test_a_redis_without_hello_is_one_outage_naming_it_and_the_local_tier_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The tier speaks RESP3 (HELLO 3): Redis 6.0 or newer (docs/fleet.md). An older
    # server, here a real one whose HELLO is renamed away, is an outage in its own words.
    with (
        redis_server(options=["--rename-command", "HELLO", ""]) as old,
        caplog.at_level(logging.WARNING, logger="warmenv.remote"),
    ):
        async with open_environment("e", root=tmp_path, remote=old.url) as env:
            store = await env.store(NS)
            assert [await store.get_or_compute(f"k{i}", compute, i) for i in range(3)] == [0, 1, 2]
            assert env.remote is not None
            assert env.remote.statistics().outages == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "unknown command 'HELLO'" in warned[0], warned


async def test_an_unreachable_redis_never_fails_the_open(tmp_path: Path) -> None:
    server = RedisServer()  # never started: nothing listens on its port
    await _each_call_costs_at_most_the_timeout(tmp_path, server.url, "never")


@pytest.mark.parametrize("where", ["refusing", "silent"])
async def test_a_cold_burst_against_an_unreachable_redis_costs_one_timeout(
    tmp_path: Path, where: str
) -> None:
    # "silent": the kernel completes connections to a socket that never answers them.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(128)
        port = silent.getsockname()[1] if where == "silent" else free_port()
        settings = RemoteSettings(f"redis://127.0.0.1:{port}/0", timeout=0.25)
        async with open_environment("fleet", root=tmp_path, remote=settings) as env:
            store: Store[str, Any] = await env.store(NS)
            answers: dict[int, object] = {}

            async def ask(i: int) -> None:
                answers[i] = await store.get_or_compute(f"{where}-{i}", compute, i)

            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(ask, i)
            assert env.remote is not None
            stats = env.remote.statistics()
    assert answers == {i: i for i in range(50)}  # each computed here
    assert stats.outages == 1 and stats.failures >= 1
    # In the server's time (`waited`), which a starved CPU does not stretch. Calls
    # waiting on connections or on each other's timeouts would add up to several
    # timeouts; side by side they cost one (two at most: the last began before the
    # first had failed, after which calls are skipped), and each retry after a backoff
    # (a burst that outlasts it, on a slow machine) costs one more.
    assert stats.waited <= (2 + stats.retries) * _one_try(settings), stats


@pytest.mark.parametrize("where", ["silent", "killed"])
async def test_coredis_s_traceback_for_a_server_that_does_not_answer_stays_out_of_the_logs(
    tmp_path: Path, server: RedisServer, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    # "silent": a socket whose connections the kernel completes and nobody answers.
    # "killed": a server that answered, then died under its open connections.
    with socket.socket() as silent, caplog.at_level(logging.DEBUG):
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0" if where == "silent" else server.url
        settings = RemoteSettings(url, timeout=0.25)
        async with open_environment("fleet", root=tmp_path, remote=settings) as env:
            assert env.remote is not None
            storage = env.storage(NS)
            if where == "killed":
                await storage.insert(b"k", b"v")
                await _until_subscribed(env.remote.statistics)
                server.stop()
            for i in range(3):
                assert await storage.get(b"missing-%d" % i) is None
                await anyio.sleep(0.6)  # past the first backoff: each lookup tries again
            assert env.remote.statistics().outages == 1
    traced = [r for r in caplog.records if r.exc_info is not None]
    assert not traced, [(r.name, r.getMessage()) for r in traced]
    assert not [r for r in caplog.records if r.name.startswith("coredis")]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "is unavailable" in warned[0], warned


@contextlib.contextmanager
def answering_every_command_with(reply: bytes) -> Iterator[str]:
    """A server speaking just enough RESP: every request it reads gets `reply`."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set() and conn.recv(65536):
                conn.sendall(reply)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        listener.close()
        thread.join(timeout=10)
        assert not thread.is_alive()


async def _our_log_lines_when_every_command_answers(
    reply: bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> list[str]:
    """warmenv's log lines, as messages, from one lookup through a tier whose server
    answers every command with `reply` (an error: the lookup misses, one outage)."""
    with (
        answering_every_command_with(reply) as url,
        caplog.at_level(logging.DEBUG, logger="warmenv"),
    ):
        settings = RemoteSettings(url, timeout=0.5)
        async with open_environment("fleet", root=tmp_path, remote=settings) as env:
            assert await env.storage(NS).get(b"k") is None
            assert env.remote is not None and env.remote.statistics().outages == 1
    return [r.getMessage() for r in caplog.records if r.name.startswith("warmenv")]


async def test_a_server_s_error_text_reaches_the_log_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A hostile server's error reply carried raw into the application's log lines:
    # an escape sequence there clears or recolours the terminal that tails the log.
    ours = await _our_log_lines_when_every_command_answers(
        b"-ERR \x1b[2J\x1b]0;pwned\x07fake\r\n", tmp_path, caplog
    )
    assert any("\\x1b[2J" in message for message in ours), ours
    assert not [m for m in ours if "\x1b" in m or "\x07" in m], ours


async def test_a_server_s_long_error_text_reaches_the_log_cut_to_one_short_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An error reply may be 64 KiB (the reader's line bound): a warning quoting it whole
    # is a flood, not a line.
    ours = await _our_log_lines_when_every_command_answers(
        b"-ERR " + b"\x1b" + b"A" * 60_000 + b"\r\n", tmp_path, caplog
    )
    quoting = [m for m in ours if "AAAA" in m]
    assert quoting and all("more characters)" in m for m in quoting), ours
    assert max(len(m) for m in ours) < 1000, max(ours, key=len)[:2000]
    assert not [m for m in ours if "\x1b" in m], ours


async def test_what_the_application_s_own_coredis_clients_log_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as silent, caplog.at_level(logging.DEBUG):
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        async with (
            open_environment("fleet", root=tmp_path, remote=RemoteSettings(url)) as env,
            coredis.Redis.from_url(url, retry_policy=NoRetryPolicy()) as own,
        ):
            assert await env.storage(NS).get(b"k") is None  # the tier's records are its own
            # Cancelled on asyncio; on trio, coredis makes it a ConnectionError.
            with anyio.move_on_after(0.25), contextlib.suppress(coredis.exceptions.ConnectionError):
                await own.ping()
    assert any(r.name == "coredis" and r.exc_info is not None for r in caplog.records)


@pytest.mark.parametrize("kind", ["list", "hash", "garbage", "huge", "moved", "empty"])
async def test_hostile_values_under_our_keys_are_misses_with_a_warning(
    tmp_path: Path,
    server: RedisServer,
    raw: coredis.Redis[bytes],
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    settings = RemoteSettings(server.url, max_value_bytes=1024)
    async with open_environment("fleet", root=tmp_path / "a", remote=settings) as a:
        assert a.remote is not None
        await a.storage(NS).insert(b"genuine", b'"ok"')
        rkey = a.remote.redis_key(NS.full, b'"k"')
        genuine = await raw.get(a.remote.redis_key(NS.full, b"genuine"))
        assert genuine is not None
        if kind == "list":
            await raw.rpush(rkey, [b"a", b"b"])
        elif kind == "hash":
            await raw.hset(rkey, {b"a": b"b"})
        elif kind == "garbage":
            await raw.set(rkey, os.urandom(64))
        elif kind == "huge":
            await raw.set(rkey, genuine[:24] + b"x" * 10_000_000)
        elif kind == "moved":  # a genuine value copied under another key
            await raw.set(rkey, genuine)
        else:
            await raw.set(rkey, b"")
    async with open_environment("fleet", root=tmp_path / "b", remote=settings) as b:
        assert b.remote is not None
        store: Store[str, Any] = await b.store(NS)
        with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
            assert await store.get("k") is None
            assert await store.get_or_compute("k", compute, "computed") == "computed"
        assert await b.storage(NS).get(b"genuine") == b'"ok"'
        if kind != "empty":
            assert b.remote.statistics().rejected >= 1
            assert any("ignoring the value" in r.message for r in caplog.records)
        assert b.remote.statistics().outages == 0


async def test_an_unusable_value_is_warned_about_once_per_key(
    tmp_path: Path,
    server: RedisServer,
    raw: coredis.Redis[bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        assert env.remote is not None
        storage = env.storage(NS)
        for key in (b"a", b"b"):
            await raw.set(env.remote.redis_key(NS.full, key), os.urandom(64))
        with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
            for _ in range(5):
                assert await storage.get(b"a") is None
                assert await storage.get(b"b") is None
        assert env.remote.statistics().rejected == 10  # every lookup still counted
    warned = [r.getMessage() for r in caplog.records if "ignoring the value" in r.getMessage()]
    assert len(warned) == 2


async def test_a_warning_about_a_long_key_quotes_it_cut_short(
    tmp_path: Path,
    server: RedisServer,
    raw: coredis.Redis[bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = b"k" * 50_000  # a caller's key of any length is part of the Redis key
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        assert env.remote is not None
        await raw.set(env.remote.redis_key(NS.full, key), os.urandom(64))
        with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
            assert await env.storage(NS).get(key) is None
    (warned,) = [r.getMessage() for r in caplog.records if "ignoring the value" in r.getMessage()]
    assert len(warned) < 1_000 and "more characters)" in warned, warned[:300]


DOCUMENTED_ACL = (
    "ACL SETUSER fleet on >PASSWORD ~warmenv:* &warmenv:* +getrange +get +set +exists +pttl"
    " +pexpire +del +evalsha +script|load +publish +subscribe +unsubscribe +ping"
)


async def test_a_user_with_the_documented_acl_runs_the_whole_tier(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes]
) -> None:
    fleet_md = Path(__file__).parent.parent / "docs" / "fleet.md"
    assert DOCUMENTED_ACL in fleet_md.read_text()
    _, _, user, *rules = DOCUMENTED_ACL.replace("PASSWORD", PASSWORD).split()
    await raw.acl_setuser(user, *rules)
    url = server.url.replace("redis://", f"redis://{user}:{PASSWORD}@")
    async with (
        open_environment("fleet", root=tmp_path / "a", remote=url) as a,
        open_environment("fleet", root=tmp_path / "b", remote=url) as b,
    ):
        assert a.remote is not None and b.remote is not None
        sa: Store[str, Any] = await a.store(NS)
        sb: Store[str, Any] = await b.store(NS)
        assert await sa.get_or_compute("k", compute, "a") == "a"  # lease, publish, release
        assert await sb.get_or_compute("k", compute, "b") == "a"  # claim with the value
        assert await sb.get("j") is None
        await _until_subscribed(b.remote.statistics)
        for stats in (a.remote.statistics(), b.remote.statistics()):
            assert stats.failures == stats.rejected == 0 and stats.subscribed
        assert a.remote.statistics().published == 1 and b.remote.statistics().hits == 1


async def _until_subscribed(statistics: Callable[[], RemoteStatistics]) -> None:
    with anyio.fail_after(10):
        # The subscription is another task's state, with no event to wait on.
        while not statistics().subscribed:  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def test_the_password_is_never_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with redis_server(password=PASSWORD) as server:
        assert PASSWORD in server.url
        settings = RemoteSettings(server.url)
        assert PASSWORD not in repr(settings)
        assert PASSWORD not in redact(server.url)
        async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
            assert a.remote is not None
            assert PASSWORD not in a.describe() + repr(a.remote) + a.storage(NS).describe()
            await a.storage(NS).insert(b"k", b"v")
            assert a.remote.statistics().published == 1
        wrong = server.url.replace(PASSWORD, PASSWORD[::-1])
        with caplog.at_level(logging.DEBUG, logger="warmenv"):
            async with open_environment("fleet", root=tmp_path / "b", remote=wrong) as b:
                assert await b.storage(NS).get(b"k") is None
                # A refused password is the URL's mistake, not an outage (warned once).
                assert b.remote is not None and b.remote.statistics().outages == 0
                assert (await b.remote.ping()).misconfigured
        assert caplog.records
        assert not any(PASSWORD[::-1] in record.getMessage() for record in caplog.records)
        with pytest.raises(RemoteError) as caught:
            RemoteSettings(server.url.replace("redis://", "http://"))
        assert PASSWORD not in str(caught.value)


async def test_a_rediss_url_shares_values_over_tls(tmp_path: Path) -> None:
    with redis_server(password=PASSWORD, tls=tmp_path / "tls") as server:
        assert server.url.startswith("rediss://")
        async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
            store: Store[str, Any] = await a.store(NS)
            assert await store.get_or_compute("k", compute, "over TLS") == "over TLS"
            assert a.remote is not None and a.remote.statistics().published == 1
            assert PASSWORD not in a.describe()
        async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
            store = await b.store(NS)
            assert await store.get("k") == "over TLS"
            assert b.remote is not None and b.remote.statistics().hits == 1


async def test_a_rediss_server_whose_certificate_is_not_trusted_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with redis_server(password=PASSWORD, tls=tmp_path / "tls") as server:
        untrusted = server.url.partition("?")[0]  # the private CA not given
        with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
            async with open_environment("fleet", root=tmp_path / "a", remote=untrusted) as a:
                store: Store[str, Any] = await a.store(NS)
                assert await store.get_or_compute("k", compute, "local") == "local"
                assert a.remote is not None
                stats = a.remote.statistics()
                assert stats.outages == 1 and stats.published == 0
        outage = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
        assert outage and "CERTIFICATE_VERIFY_FAILED" in outage[0]  # why, not only "unable"
        assert not any(PASSWORD in r.getMessage() for r in caplog.records)


async def test_a_rediss_server_whose_certificate_names_another_host_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Signed by the CA the URL names, but for "localhost", not 127.0.0.1: coredis's
    # own TLS settings took it (no host name check); warmenv's refuse it.
    with redis_server(password=PASSWORD, tls=tmp_path / "tls", tls_name="DNS:localhost") as server:
        with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
            async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
                store: Store[str, Any] = await a.store(NS)
                assert await store.get_or_compute("k", compute, "local") == "local"
                assert a.remote is not None
                stats = a.remote.statistics()
                assert stats.outages == 1 and stats.published == 0
        outage = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
        assert outage and "127.0.0.1" in outage[0] and "CERTIFICATE_VERIFY_FAILED" in outage[0]


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("ssl_cert_reqs=none", "always checks the server's certificate"),
        ("ssl_cert_reqs=optional", "always checks the server's certificate"),
        ("ssl_check_hostname=false", "always checks the server's host name"),
        ("ssl_ca_certs=/nonexistent/ca.pem", "ssl_ca_certs='/nonexistent/ca.pem'"),
        ("ssl_ca_certs=/etc/hostname", "holds no usable CA certificate"),
        ("ssl_certfile=/nonexistent/host.pem", "ssl_certfile='/nonexistent/host.pem'"),
        ("ssl_keyfile=/etc/hostname", "needs ssl_certfile="),
    ],
)
async def test_rediss_settings_that_would_not_check_or_cannot_be_read_are_refused(
    tmp_path: Path, query: str, said: str
) -> None:
    url = f"rediss://:{PASSWORD}@127.0.0.1:{free_port()}/0?{query}"
    with pytest.raises(RemoteError, match=re.escape(said)) as raised:
        async with open_environment("fleet", root=tmp_path, remote=url):
            pass
    assert PASSWORD not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        # coredis takes a password from the query string too.
        f"redis://127.0.0.1:6390/0?password={PASSWORD}",
        f"redis://:x@127.0.0.1:6390/0?db=1&PASSWORD={PASSWORD}&ssl=no",
        # Unencoded, '#', '?' and '/' end the host part: the parser's message
        # would quote the password's pieces (as a port, say).
        f"redis://:{PASSWORD}#tail@127.0.0.1:6390/0",
        f"redis://:{PASSWORD}/tail@127.0.0.1:6390/0",
        f"redis://:{PASSWORD}?tail@127.0.0.1:6390/0",
        f"redis://:{PASSWORD}\uff03@127.0.0.1:6390/0",  # NFKC makes it a '#'
    ],
)
def test_a_password_in_any_part_of_the_url_is_never_shown(url: str) -> None:
    assert PASSWORD not in redact(url)
    try:
        settings = RemoteSettings(url)
    except RemoteError as exc:
        assert PASSWORD not in str(exc)
    else:
        assert PASSWORD not in repr(settings)


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("redis://localhost:notaport/0", "notaport"),
        ("redis://localhost:99999", "99999"),
        (f"redis://:{PASSWORD}@localhost:notaport/0", "notaport"),
        (f"redis://:{PASSWORD}@cache.internal:99999/2", "99999"),
        (f"rediss://fleet:{PASSWORD}@[::1]:63 79/0", "63 79"),
    ],
)
async def test_a_malformed_port_is_named_as_given_with_the_password_hidden(
    tmp_path: Path, url: str, port: str
) -> None:
    with pytest.raises(RemoteError) as raised:
        async with open_environment("fleet", root=tmp_path, remote=url):
            pass
    message = str(raised.value)
    assert f"malformed port {port!r}" in message
    assert redact(url) in message and f":{port}" in redact(url)
    assert PASSWORD not in message


@pytest.mark.parametrize("path", ["/abc", "/0/1", "/-1", "/1.5", "/0x1"])
async def test_a_malformed_database_number_is_refused_not_taken_for_database_0(
    tmp_path: Path, path: str
) -> None:
    # coredis read `redis://host/abc` as database 0: writes went into another fleet's data.
    url = f"redis://:{PASSWORD}@localhost{path}"
    with pytest.raises(RemoteError, match="malformed database number") as raised:
        async with open_environment("fleet", root=tmp_path, remote=url):
            pass
    assert repr(path[1:]) in str(raised.value) and PASSWORD not in str(raised.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["", "/", "/0", "/15"])
def test_a_database_number_or_none_is_accepted(path: str) -> None:
    assert check_redis_url(f"redis://localhost{path}") == f"redis://localhost{path}"


async def test_the_variable_warmenv_remote_configures_the_tier(
    tmp_path: Path, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMENV_REMOTE", server.url)
    async with open_environment("fleet", root=tmp_path / "a") as a:
        assert a.remote is not None
        await a.storage(NS).insert(b"k", b"v")
    async with open_environment("fleet", root=tmp_path / "b", remote="") as b:
        assert b.remote is None
        assert await b.storage(NS).get(b"k") is None
    monkeypatch.setenv("WARMENV_REMOTE", f"redis:/:{PASSWORD}@host")
    with pytest.raises(RemoteError, match="WARMENV_REMOTE") as caught:
        async with open_environment("fleet", root=tmp_path / "c"):
            pass
    assert PASSWORD not in str(caught.value)


async def test_statistics_and_values_survive_a_json_round_trip_of_the_codec(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes]
) -> None:
    """What Redis holds is the codec's bytes (after the frame), never a pickle."""
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        store: Store[str, Any] = await env.store(NS)
        await store.insert("k", {"a": [1, 2]})
        assert env.remote is not None
        framed = await raw.get(env.remote.redis_key(NS.full, b'"k"'))
    # Behind the 40-byte frame: marker, digest, written_at and cost.
    assert framed is not None and json.loads(framed[40:]) == {"a": [1, 2]}


async def test_an_error_in_the_block_comes_out_as_raised(
    tmp_path: Path, server: RedisServer
) -> None:
    with pytest.raises(KeyError):
        async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
            await env.storage(NS).insert(b"k", b"v")
            raise KeyError("mine")


# --- what a value carries: its cost and when it was written ---------------------


async def slow_compute(value: object) -> object:
    await anyio.sleep(0.05)  # the computation's own time: its cost, recorded and carried
    return value


async def test_a_fetched_value_records_the_cost_and_time_it_was_computed_with(
    tmp_path: Path, server: RedisServer
) -> None:
    async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
        sa: Store[str, Any] = await a.store(NS)
        assert await sa.get_or_compute("k", slow_compute, "v") == "v"
        computed = await a.storage(NS).info(b'"k"')
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
        sb: Store[str, Any] = await b.store(NS)
        assert await sb.get("k") == "v"
        fetched = await b.storage(NS).info(b'"k"')
    # uvloop's timers may wake a little early: 0.04, not 0.05.
    assert computed is not None and computed.cost is not None and computed.cost >= 0.04
    assert fetched is not None and fetched.origin == Origin.REMOTE
    assert (fetched.cost, fetched.written_at) == (computed.cost, computed.written_at)


async def test_hits_on_fetched_values_count_the_seconds_they_saved(
    tmp_path: Path, server: RedisServer
) -> None:
    async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
        sa: Store[str, Any] = await a.store(NS)
        for i in range(3):
            await sa.get_or_compute(f"k{i}", slow_compute, i)
        costs = [await a.storage(NS).info(f'"k{i}"'.encode()) for i in range(3)]
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
        sb: Store[str, Any] = await b.store(NS)
        for i in range(3):
            assert await sb.get_or_compute(f"k{i}", compute, "not computed again") == i
        await sb.aclose()
        (stats,) = (await b.statistics()).namespaces
    assert stats.hits_by_origin == {Origin.REMOTE: 3} and stats.computes == 0
    assert stats.saved_seconds == pytest.approx(sum(c.cost for c in costs if c and c.cost))
    assert stats.saved_seconds >= 3 * 0.04


def _frame(rkey: bytes, magic: bytes, body: bytes) -> bytes:
    """A frame as a raw client would write it: the digest is no secret."""
    digest = hashlib.blake2b(rkey, digest_size=16)
    digest.update(b"\0")
    digest.update(body)
    return magic + digest.digest() + body


async def test_a_value_published_before_costs_were_carried_still_reads(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes]
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        assert env.remote is not None
        rkey = env.remote.redis_key(NS.full, b'"old"')
        await raw.set(rkey, _frame(rkey, b"warmenv1", b'"value"'))
        assert await env.storage(NS).get(b'"old"') == b'"value"'
        info = await env.storage(NS).info(b'"old"')
        assert env.remote.statistics().hits == 1 and env.remote.statistics().rejected == 0
    # It carries no write time: recorded as unknown (a miss under a ttl), not as fetched now.
    assert info == EntryInfo(Origin.REMOTE, None, None, None)


NAN = float("nan")
HOSTILE_CARRIED = {
    # what the frame carries (written_at, cost) -> what is recorded (None: unknown)
    "nan cost": ((1.0e9, NAN), (1.0e9, None)),
    "infinite cost": ((1.0e9, float("inf")), (1.0e9, None)),
    "negative cost": ((1.0e9, -5.0), (1.0e9, None)),
    "absurd cost": ((1.0e9, 2.0**40), (1.0e9, None)),
    "future written_at": ((time.time() + 1e6, 2.0), (None, 2.0)),
    "nan written_at": ((NAN, 2.0), (None, 2.0)),
    "negative written_at": ((-1.0, 2.0), (None, 2.0)),
    "negative zero cost": ((1.0e9, -0.0), (1.0e9, 0.0)),
}


@pytest.mark.parametrize("case", list(HOSTILE_CARRIED))
async def test_what_a_value_carries_is_believed_as_a_bundle_s_is(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes], case: str
) -> None:
    (written_at, cost), (recorded_at, recorded_cost) = HOSTILE_CARRIED[case]
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        assert env.remote is not None
        rkey = env.remote.redis_key(NS.full, b'"k"')
        await raw.set(rkey, _frame(rkey, b"warmenv2", struct.pack("<dd", written_at, cost) + b"1"))
        assert await env.storage(NS).get(b'"k"') == b"1"  # the value is used all the same
        info = await env.storage(NS).info(b'"k"')
    assert info is not None and info.origin == Origin.REMOTE
    assert info.cost == recorded_cost and str(info.cost) == str(recorded_cost)  # 0.0, not -0.0
    # Unknown or in the future: recorded as unknown, never as the time it was fetched.
    assert info.written_at == recorded_at


@pytest.mark.parametrize("length", [0, 1, 15])
async def test_a_frame_too_short_for_what_it_carries_is_a_miss_with_a_warning(
    tmp_path: Path,
    server: RedisServer,
    raw: coredis.Redis[bytes],
    caplog: pytest.LogCaptureFixture,
    length: int,
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        assert env.remote is not None
        rkey = env.remote.redis_key(NS.full, b'"k"')
        await raw.set(rkey, _frame(rkey, b"warmenv2", b"\x01" * length))
        with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
            assert await env.storage(NS).get(b'"k"') is None
        assert env.remote.statistics().rejected == 1 and env.remote.statistics().hits == 0
    assert any("too short" in r.message for r in caplog.records)


async def test_a_value_at_the_cap_is_shared_and_one_byte_over_is_not(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes]
) -> None:
    settings = RemoteSettings(server.url, max_value_bytes=100)
    async with open_environment("fleet", root=tmp_path / "a", remote=settings) as a:
        await a.storage(NS).insert(b"fits", b"x" * 100)
        assert a.remote is not None
        rkey = a.remote.redis_key(NS.full, b"planted")
        # An old frame holds 16 bytes more value in the same length: still over the cap.
        await raw.set(rkey, _frame(rkey, b"warmenv1", b"x" * 116))
    async with open_environment("fleet", root=tmp_path / "b", remote=settings) as b:
        assert await b.storage(NS).get(b"fits") == b"x" * 100
        assert await b.storage(NS).get(b"planted") is None
        assert b.remote is not None and b.remote.statistics().rejected == 1


# --- purging with a shared tier ----------------------------------------------------


async def test_a_purged_key_is_gone_from_the_fleet_too(
    tmp_path: Path, server: RedisServer, raw: coredis.Redis[bytes]
) -> None:
    async with (
        open_environment("fleet", root=tmp_path / "a", remote=server.url) as a,
        open_environment("fleet", root=tmp_path / "b", remote=server.url) as b,
    ):
        sa: Store[str, Any] = await a.store(NS)
        sb: Store[str, Any] = await b.store(NS)
        await sa.insert("k", "wrong")
        await sa.insert("kept", 1)
        assert await sb.get("k") == "wrong"  # b fetched it before the purge: b keeps it
        assert isinstance(await sa.purge_key("k"), Purged)
        assert await sa.get("k") is None
        assert a.remote is not None
        assert await raw.exists([a.remote.redis_key(NS.full, b'"k"')]) == 0
        assert await sa.get("kept") == 1
    async with open_environment("fleet", root=tmp_path / "c", remote=server.url) as c:
        sc: Store[str, Any] = await c.store(NS)
        assert await sc.get("k") is None
        assert await sc.get_or_compute("k", compute, "right") == "right"
        assert await sc.get("kept") == 1


async def test_a_purge_that_cannot_reach_redis_purges_here_and_says_so(
    tmp_path: Path, server: RedisServer
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        store: Store[str, Any] = await env.store(NS)
        await store.insert("k", "wrong")
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            assert env.remote is not None
            # One try, one timeout of the server's time (`waited`, our loop's lateness not counted).
            with _each_try_costs_at_most_the_timeout(env.remote):
                result = await store.purge_key("k")
            assert env.remote.statistics().failures == 1
            assert await env.storage(NS).info(b'"k"') is None  # gone here
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    assert isinstance(result, Failed)
    assert "not the shared copy" in result.reason and "purge the key again" in result.reason


async def test_purging_a_namespace_is_local_and_the_fleet_s_values_come_back(
    tmp_path: Path, server: RedisServer
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        store: Store[str, Any] = await env.store(NS)
        await store.insert("k", 1)
        assert isinstance(await store.purge(), Purged)
        assert await env.storage(NS).info(b'"k"') is None
        assert await store.get("k") == 1  # the fleet's copy, fetched again
        info = await env.storage(NS).info(b'"k"')
    assert info is not None and info.origin == Origin.REMOTE


# --- ping ----------------------------------------------------------------------------


async def test_ping_says_how_fast_a_reachable_redis_answers(
    tmp_path: Path, server: RedisServer
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        assert env.remote is not None
        started = time.perf_counter()
        ping = await env.remote.ping()
        took = time.perf_counter() - started
        assert env.remote.statistics().failures == 0
    assert ping.reachable and ping.reason is None
    # The round trip it timed, within the call: not a default, nor another unit.
    assert ping.seconds is not None and 0 < ping.seconds <= took
    assert str(ping).startswith(f"Redis at {redact(server.url)} answered in ")


@pytest.mark.parametrize("where", ["refusing", "frozen"])
async def test_ping_of_an_unreachable_redis_returns_within_the_timeout(
    tmp_path: Path, where: str
) -> None:
    with redis_server(password=PASSWORD) as server:
        url = server.url
        assert server.process is not None
        if where == "frozen":
            os.kill(server.process.pid, signal.SIGSTOP)
        else:
            await anyio.to_thread.run_sync(server.stop)
        try:
            async with open_environment("fleet", root=tmp_path, remote=url) as env:
                assert env.remote is not None
                with _each_try_costs_at_most_the_timeout(env.remote):
                    ping = await env.remote.ping()
                stats = env.remote.statistics()
                assert stats.outages == stats.failures == 1
        finally:
            if server.process is not None:
                os.kill(server.process.pid, signal.SIGCONT)
    assert not ping.reachable and ping.seconds is None and ping.reason
    assert "unavailable" in str(ping) and PASSWORD not in str(ping) + repr(ping)


async def test_ping_asks_even_while_the_tier_backs_off_and_ends_the_outage(
    tmp_path: Path, server: RedisServer
) -> None:
    async with open_environment("fleet", root=tmp_path, remote=server.url) as env:
        assert env.remote is not None
        await anyio.to_thread.run_sync(server.stop)
        assert await env.storage(NS).get(b"k") is None  # fails: the tier backs off
        assert not env.remote.statistics().available
        await anyio.to_thread.run_sync(server.start)
        assert (await env.remote.ping()).reachable
        assert env.remote.statistics().available
        assert env.remote.statistics().outages == 1


# --- warmenv.blocking with a shared tier ----------------------------------------------


def test_blocking_hits_with_a_remote_are_read_on_the_calling_thread(
    tmp_path: Path, server: RedisServer
) -> None:
    codec = TracingCodec()
    with open_blocking("fleet", root=tmp_path / "a", remote=server.url) as a:
        a.store(NS, codec=codec).insert("local", {"v": 1})
        lazy = a.store(NS, codec=codec, mode=CacheMode.LAZY)  # holds nothing: reads through
        codec.decoded_on.clear()
        assert lazy.get("local") == {"v": 1}
        assert codec.decoded_on == [threading.get_ident()]  # not the loop thread's
    with open_blocking("fleet", root=tmp_path / "b", remote=server.url) as b:
        first = b.store(NS, codec=codec, mode=CacheMode.LAZY)
        assert first.get("local") == {"v": 1}  # a local miss: fetched from Redis on the loop
        assert b.remote is not None and b.remote.statistics().hits == 1
        codec.decoded_on.clear()
        assert b.store(NS, codec=codec, mode=CacheMode.LAZY).get("local") == {"v": 1}
        assert codec.decoded_on == [threading.get_ident()]  # now local: read here
        assert b.remote.statistics().hits == 1


def test_a_blocking_miss_against_a_frozen_redis_returns_within_the_timeout(
    tmp_path: Path, server: RedisServer
) -> None:
    assert server.process is not None
    with open_blocking("fleet", root=tmp_path, remote=server.url) as env:
        store = env.store(NS, mode=CacheMode.LAZY)
        assert env.remote is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            with _each_try_costs_at_most_the_timeout(env.remote):
                assert store.get("missing") is None
                assert store.get_or_compute("k", lambda: 7) == 7
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert env.remote.statistics().outages == 1
        assert store.get("k") == 7
