"""A fleet soak: four hosts (OS processes, own roots) share a Redis restarted under them.

Every host asks `get_or_compute` for keys from a window that slides over time,
so the hosts keep racing for new keys while Redis is killed and started again
on the same port. A value is the key's deterministic payload plus the tag of
the host that computed it, so where each value came from can be checked
afterwards, in every host's database and in Redis:

- nothing computed is lost: every key a host computed is in its own database
  with its own value (origin LOCAL), and every answer a host got is what its
  database holds for the key;
- one value per key fleet-wide: a value fetched from Redis (origin REMOTE) is
  byte for byte the value Redis holds for the key, every value anywhere
  carries its key's payload and the tag of a host that computed that key, and
  Redis holds at least every value it acknowledged;
- the tier comes back: each host counts each outage, and Redis holds values
  first computed after every restart.

Redis runs with its append-only file synced before every answer, as a fleet's
Redis with persistence does, so a restart keeps what Redis acknowledged and
"Redis's value for a key" stays one value across restarts. (A restart that
loses Redis's data costs the fleet one recomputation per key: test_remote.py.)
Hosts that miss while Redis is down compute locally, as they must; the keys
computed by more than one host are counted in the report row.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import coredis
import pytest

from helpers import one_trial
from redis_server import RedisServer
from warmenv import Namespace, open_environment
from warmenv.persistence import Origin

NS = Namespace("app", "soak", version="1")
ENVIRONMENT = "fleet"
HOSTS = 4
BACKENDS = ["asyncio", "uvloop", "trio", "trio"]
# How long each outage lasts, in seconds (Redis killed, then started again).
OUTAGE = 1.0

CHILD = """
import hashlib, json, random, sys, time
import anyio, attrs
from warmenv import Namespace, open_environment
from warmenv.remote import RemoteSettings

root, url, me, seconds, backend = sys.argv[1:6]
seconds = float(seconds)
RATE, WIDTH, ASKS = 20, 60, 8  # new keys per second; keys in the window; asks per round

def payload(key):
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()

async def main():
    computed, answers, errors, unshared = {}, {}, [], []

    async def compute(key):
        if key in computed:
            errors.append(f"{key} computed twice on one host")
        computed[key] = time.monotonic()
        if not env.remote.statistics().available:
            unshared.append(key)  # the tier is backing off: computed locally, as it must be
        await anyio.sleep(random.uniform(0.002, 0.02))
        return {"key": key, "payload": payload(key), "by": me}

    settings = RemoteSettings(url, lease_ttl=2.0)
    async with open_environment("fleet", root=root, remote=settings) as env:
        store = await env.store(Namespace("app", "soak", version="1"))

        async def ask(key):
            value = await store.get_or_compute(key, compute, key)
            if value["key"] != key or value["payload"] != payload(key):
                errors.append(f"{key} answered {value!r}")
            if answers.setdefault(key, value["by"]) != value["by"]:
                errors.append(f"{key} answered by {answers[key]}, then by {value['by']}")

        await store.get("warm-up")  # connect before the run
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        begun = time.monotonic()
        while (elapsed := time.monotonic() - begun) < seconds:
            top = WIDTH + int(elapsed * RATE)
            async with anyio.create_task_group() as tg:
                for _ in range(ASKS):
                    tg.start_soon(ask, f"k{random.randrange(top - WIDTH, top):06}")
            await anyio.sleep(0.01)  # a steady pace, not a busy loop on two shared cores
        stats = attrs.asdict(env.remote.statistics())
    report = {"computed": computed, "unshared": unshared, "answers": answers, "errors": errors}
    print(json.dumps({**report, "stats": stats}))

if backend == "uvloop":
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
else:
    anyio.run(main, backend=backend)
"""


def payload(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


class Host:
    """One host of the fleet: a fresh interpreter with its own root."""

    def __init__(self, root: Path, url: str, me: int, seconds: float) -> None:
        self.root = root
        self.tag = str(me)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        args = [root, url, self.tag, seconds, BACKENDS[me]]
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd="/",
        )

    @property
    def stdout(self) -> IO[bytes]:
        assert self.process.stdout is not None
        return self.process.stdout

    def ready(self, limit: float = 60.0) -> None:
        readable, _, _ = select.select([self.stdout], [], [], limit)
        assert readable, f"host {self.tag} was not ready within {limit} s"
        line = self.stdout.readline()
        assert line == b"ready\n", self.process.communicate(timeout=30)

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        self.process.stdin.flush()

    def report(self, limit: float) -> dict[str, Any]:
        out, err = self.process.communicate(timeout=limit)
        assert self.process.returncode == 0, err.decode()
        assert b"Traceback" not in err, err.decode()
        result: dict[str, Any] = json.loads(out)
        return result

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    started: list[Host] = []
    yield started
    for host in started:
        host.close()


async def local_contents(root: Path) -> dict[str, tuple[Origin, bytes]]:
    """What a host's own database holds: key -> (origin, value bytes)."""
    found: dict[str, tuple[Origin, bytes]] = {}
    async with open_environment(ENVIRONMENT, root=root, remote="") as env:
        storage = env.storage(NS)
        async for key, value in storage.scan():
            info = await storage.info(key)
            assert info is not None
            found[json.loads(key)] = (info.origin, value)
    return found


async def redis_contents(url: str) -> dict[str, bytes]:
    """The values Redis holds for the namespace (their codec bytes, frame removed)."""
    prefix = f"warmenv:{ENVIRONMENT}:{NS.full}:".encode()
    found: dict[str, bytes] = {}
    async with coredis.Redis.from_url(url, decode_responses=False) as client:
        async for rkey in client.scan_iter(match=prefix + b"*"):
            if rkey.endswith(b":lease"):
                continue
            framed = await client.get(rkey)
            assert framed is not None
            # The 40-byte frame: marker, digest, then the written_at and cost carried.
            found[json.loads(bytes.fromhex(rkey[len(prefix) :].decode()))] = framed[40:]
    return found


def fleet_soak(tmp: Path, hosts: list[Host], seconds: float, restarts: int) -> dict[str, int]:
    """Run the fleet for `seconds`, restarting Redis `restarts` times; check; return counts."""
    data = tmp / "redis-data"
    data.mkdir()
    server = RedisServer(data_dir=data)
    server.start()
    restarted_at: list[float] = []
    try:
        hosts.extend(Host(tmp / f"host{i}", server.url, i, seconds) for i in range(HOSTS))
        for host in hosts:
            host.ready()
        for host in hosts:
            host.go()
        begun = time.monotonic()
        for n in range(1, restarts + 1):
            # What is tested is Redis failing at points of the run: the schedule is time.
            kill_at = begun + seconds * n / (restarts + 1) - OUTAGE
            time.sleep(max(0.0, kill_at - time.monotonic()))
            server.stop()
            time.sleep(OUTAGE)
            server.start()
            restarted_at.append(time.monotonic())
        reports = [host.report(limit=seconds + 120) for host in hosts]
        in_redis = anyio.run(redis_contents, server.url)
    finally:
        server.stop()
    in_hosts = [anyio.run(local_contents, host.root) for host in hosts]
    return check_fleet(reports, in_hosts, in_redis, restarted_at)


def check_fleet(
    reports: list[dict[str, Any]],
    in_hosts: list[dict[str, tuple[Origin, bytes]]],
    in_redis: dict[str, bytes],
    restarted_at: list[float],
) -> dict[str, int]:
    computers: dict[str, set[str]] = defaultdict(set)
    first_computed: dict[str, float] = {}
    for tag, report in enumerate(reports):
        assert report["errors"] == [], report["errors"]
        for key, at in report["computed"].items():
            computers[key].add(str(tag))
            first_computed[key] = min(at, first_computed.get(key, at))

    def is_genuine(key: str, value: dict[str, str]) -> bool:
        """The key's own payload, computed by the host it names."""
        return (
            value["key"] == key
            and value["payload"] == payload(key)
            and value["by"] in (computers[key])
        )

    for tag, (report, held) in enumerate(zip(reports, in_hosts, strict=True)):
        assert set(held) == set(report["answers"]), f"host {tag} answered other keys than it holds"
        for key in report["computed"]:
            origin, data = held[key]
            assert origin == Origin.LOCAL and json.loads(data)["by"] == str(tag), (
                f"host {tag} lost its value for {key}"
            )
        for key, (origin, data) in held.items():
            value = json.loads(data)
            assert is_genuine(key, value), f"host {tag} holds {value!r} for {key}"
            assert value["by"] == report["answers"][key], f"host {tag} answered {key} otherwise"
            if origin == Origin.REMOTE:
                assert in_redis.get(key) == data, f"host {tag} fetched {key}: not Redis's value"
    for key, data in in_redis.items():
        value = json.loads(data)
        assert is_genuine(key, value), f"Redis holds {data!r} for {key}"
        # Single flight wherever the tier answered: once the host whose value Redis
        # kept began computing it under the lease, no other host computed it with
        # the tier answering (it waited for the value instead).
        publisher = reports[int(value["by"])]
        if key not in publisher["unshared"]:
            began = publisher["computed"][key]
            for tag, report in enumerate(reports):
                if tag != int(value["by"]) and key not in report["unshared"]:
                    assert report["computed"].get(key, began) <= began, (
                        f"hosts {value['by']} and {tag} both computed {key} with the tier up"
                    )
    published = sum(report["stats"]["published"] for report in reports)
    assert len(in_redis) >= published, "Redis lost values it acknowledged"
    for tag, report in enumerate(reports):
        assert report["stats"]["outages"] >= len(restarted_at), f"host {tag} missed an outage"
    for at in restarted_at:
        assert any(first_computed[key] > at for key in in_redis), (
            "no value computed after a restart reached Redis: the tier was not used again"
        )
    return {
        "keys": len(computers),
        "computations": sum(len(report["computed"]) for report in reports),
        "duplicates": sum(1 for tags in computers.values() if len(tags) > 1),
        "in_redis": len(in_redis),
        "fetched": sum(
            1 for held in in_hosts for origin, _ in held.values() if origin == Origin.REMOTE
        ),
    }


def test_a_short_fleet_soak_with_one_redis_restart(tmp_path: Path, hosts: list[Host]) -> None:
    counts = fleet_soak(tmp_path, hosts, seconds=6.0, restarts=1)
    assert counts["fetched"] > 0 and counts["in_redis"] > 0


@pytest.mark.slow
def test_long_fleet_soak(tmp_path: Path, hosts: list[Host]) -> None:
    seconds = float(os.environ.get("WARMENV_FLEET_SOAK_SECONDS", "60"))
    checked = (
        "every key a host computed is in its database as computed; every answer is what the "
        "host holds; every fetched value is byte-identical to Redis's; every value anywhere is "
        "its key's, computed by the host it names; no host computed a key with the tier "
        "answering once the host whose value Redis kept had begun; Redis kept all it "
        "acknowledged; every host saw both outages and used the tier again after each"
    )
    scenario = f"fleet soak {seconds:.0f}s: 4 hosts, Redis killed and restarted with its data twice"
    with one_trial(f"{scenario} (asyncio, uvloop, trio)", checked) as row:
        counts = fleet_soak(tmp_path, hosts, seconds, restarts=2)
        row.checked = (
            f"{counts['keys']} keys, {counts['computations']} computations "
            f"({counts['duplicates']} keys computed on more than one host, by hosts whose tier "
            "was down or backing off, or before the first value reached Redis), "
            f"{counts['fetched']} fetched from Redis: {checked}"
        )
