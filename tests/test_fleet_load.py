"""The fleet under load: one computation per key while its hosts are busy, and a frozen Redis.

Real host processes (asyncio and trio) on a redis-server of the test's own,
with the tier's default bounds. A host whose computations hold the GIL on more
worker threads than there are cores reads Redis's answers late; that lateness
is its own, and must not look like an outage (which would turn a lease into a
local computation). A Redis that freezes (SIGSTOP) while keys are in flight
costs at most one extra computation per key, and the hosts use it again soon
after it answers.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from helpers import reliability_row
from redis_server import RedisServer

CHILD = """
import json, os, random, sys, time
import anyio
from warmenv import Namespace, open_environment
from warmenv.remote import RemoteSettings

root, url, log, keys, backend, mode, options = sys.argv[1:8]

def spin(key):
    # CPU-bound and holding the GIL: pure Python, no release until done.
    total = 0
    for i in range(50_000):
        total += i * i
    return total

async def compute(key):
    # One short O_APPEND write per computation: whole lines, whatever the interleaving.
    with open(log, "a") as file:
        file.write(json.dumps([os.getpid(), key, time.monotonic()]) + "\\n")
    if mode == "cpu":
        await anyio.to_thread.run_sync(spin, key)
    else:
        await anyio.sleep(int(key.rsplit("-", 1)[1]) % 2 * 3.5 + 1)
    return {"key": key}

async def main():
    settings = RemoteSettings(url, **json.loads(options))
    async with open_environment("fleet", root=root, remote=settings) as env:
        store = await env.store(Namespace("app", "kernels", version="1"))
        tier = env.remote
        asked = keys.split(",")
        random.shuffle(asked)
        results = {}
        back = []

        async def ask(key):
            results[key] = await store.get_or_compute(key, compute, key)

        async def watch():
            # Once every key is computed here or waited for, and when the tier answers
            # again after an outage (the test measures from SIGCONT).
            while tier.statistics().leases + tier.statistics().lease_waits < settled:
                await anyio.sleep(0.005)
            print("settled", flush=True)
            while True:
                while tier.statistics().available:
                    await anyio.sleep(0.005)
                while not tier.statistics().available:
                    await anyio.sleep(0.005)
                back.append(time.monotonic())

        # Connected and subscribed before the race: the race is what is measured.
        while not (await tier.ping()).reachable:
            pass
        await store.get_or_compute("warm-up", compute, "warm-up-0")
        while not tier.statistics().subscribed:
            await anyio.sleep(0.005)
        leased = tier.statistics().leases
        settled = leased + tier.statistics().lease_waits + len(asked)
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            async with anyio.create_task_group() as asks:
                for key in asked:
                    asks.start_soon(ask, key)
            tg.cancel_scope.cancel()
        assert results == {key: {"key": key} for key in asked}, results
        stats = tier.statistics()
        counts = {"leases": stats.leases - leased, "outages": stats.outages, "back": back}
        print(json.dumps(counts), flush=True)

anyio.run(main, backend=backend)
"""


class _Host:
    """A host process, started and stepped through pipes."""

    def __init__(
        self,
        root: Path,
        url: str,
        log: Path,
        keys: list[str],
        i: int,
        mode: str,
        options: dict[str, float],
    ) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        backend = "trio" if i % 2 else "asyncio"
        args = [str(root), url, str(log), ",".join(keys), backend, mode, json.dumps(options)]
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            bufsize=0,
            cwd="/",
        )

    @property
    def stdout(self) -> IO[bytes]:
        assert self.process.stdout is not None
        return self.process.stdout

    def line(self, limit: float = 60.0) -> str:
        ready, _, _ = select.select([self.stdout], [], [], limit)
        if not ready:
            self.process.kill()
            raise AssertionError(f"no line from the host within {limit} s")
        line = self.stdout.readline().decode()
        if not line:
            assert self.process.stderr is not None
            raise AssertionError(f"the host ended: {self.process.stderr.read().decode()}")
        return line.strip()

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")

    def result(self) -> dict[str, Any]:
        while (line := self.line()) == "settled":
            pass
        outcome: dict[str, Any] = json.loads(line)
        assert self.process.wait(30) == 0
        assert self.process.stderr is not None
        outcome["log"] = self.process.stderr.read().decode()
        return outcome

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


@contextmanager
def _fleet(
    here: Path, url: str, keys: list[str], mode: str, options: dict[str, float]
) -> Iterator[list[_Host]]:
    """Three hosts, ready to race for `keys`; killed (if still running) when the block ends."""
    hosts: list[_Host] = []
    try:
        hosts.extend(
            _Host(here / f"host{i}", url, here / "log", keys, i, mode, options) for i in range(3)
        )
        for host in hosts:
            assert host.line() == "ready"
        (here / "log").unlink(missing_ok=True)  # the warm-up's computations are not the race's
        yield hosts
    finally:
        for host in hosts:
            host.close()


def _computed(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [json.loads(line)[1] for line in log.read_text().splitlines()]


def busy_fleet(tmp_path: Path, url: str) -> list[dict[str, Any]]:
    keys = [f"{tmp_path.name}-{i:03}" for i in range(100)]
    with _fleet(tmp_path, url, keys, "cpu", {}) as hosts:
        for host in hosts:
            host.go()
        outcomes = [host.result() for host in hosts]
    computed = _computed(tmp_path / "log")
    assert sorted(computed) == keys, (len(computed), [o["log"] for o in outcomes])
    return outcomes


def test_three_busy_hosts_compute_each_of_100_keys_once_fleet_wide(
    tmp_path: Path, server: RedisServer
) -> None:
    outcomes = busy_fleet(tmp_path, server.url)
    assert sum(outcome["leases"] for outcome in outcomes) == 100
    assert [outcome["outages"] for outcome in outcomes] == [0, 0, 0]


FROZEN_TTL = 5.0
FREEZE = 3.0


def frozen_redis(tmp_path: Path, server: RedisServer) -> tuple[int, list[float]]:
    """3 hosts race for 20 keys (1 s and 4.5 s computations); once every key is computed
    or waited for on every host, Redis is frozen (SIGSTOP) for 3 s.

    The computations fleet-wide, and how long after SIGCONT each host that saw the
    outage used Redis again.
    """
    keys = [f"{tmp_path.name}-{i:03}" for i in range(20)]
    options = {"lease_ttl": FROZEN_TTL}
    with _fleet(tmp_path, server.url, keys, "sleep", options) as hosts:
        for host in hosts:
            host.go()
        for host in hosts:
            assert host.line() == "settled"
        assert set(_computed(tmp_path / "log")) == set(keys)  # every key in flight
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            time.sleep(FREEZE)  # the outage's length, not a synchronisation
        finally:
            # Taken before SIGCONT: no answer can come earlier. Taken after it, a host
            # that reconnected while this process waited for a core was "back" 54 us
            # before the thaw (a fresh-clone nox -s reliability run at load 12-15).
            thawed = time.monotonic()
            os.kill(server.process.pid, signal.SIGCONT)
        outcomes = [host.result() for host in hosts]
    computed = _computed(tmp_path / "log")
    assert set(computed) == set(keys)
    assert all(computed.count(key) <= 2 for key in keys), (sorted(computed), outcomes)
    back = []
    for outcome in outcomes:
        if outcome["outages"]:
            assert outcome["back"] and outcome["back"][-1] > thawed, outcome
            back.append(outcome["back"][-1] - thawed)
    assert back, "no host saw the outage"
    return len(computed), back


def test_a_frozen_redis_costs_at_most_one_extra_computation_per_key_in_flight(
    tmp_path: Path, server: RedisServer
) -> None:
    _, back = frozen_redis(tmp_path, server)
    assert max(back) < 2.0, back


_BUSY_AND_FROZEN = (
    "3 host processes whose computations hold the GIL race for 100 keys, then for 20 keys "
    "while their Redis is frozen (SIGSTOP) 3 s (asyncio, trio)",
    "busy: each key computed once fleet-wide, no outage counted; frozen: at most 2 "
    "computations per key, and every host that saw the outage uses Redis again within 2 s "
    "of SIGCONT",
)


@pytest.mark.slow
def test_long_busy_and_frozen_fleets(tmp_path: Path, server: RedisServer) -> None:
    trials = int(os.environ.get("WARMENV_FLEET_LOAD_TRIALS", "5"))
    with reliability_row(*_BUSY_AND_FROZEN) as row:
        for trial in range(trials):
            with row.trial():
                busy = tmp_path / f"busy{trial}"
                busy.mkdir()
                outcomes = busy_fleet(busy, server.url)
                assert [outcome["outages"] for outcome in outcomes] == [0, 0, 0]
                frozen = tmp_path / f"frozen{trial}"
                frozen.mkdir()
                _, back = frozen_redis(frozen, server)
                assert max(back) < 2.0, back
