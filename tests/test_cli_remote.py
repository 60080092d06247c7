"""The command with a remote: `--remote URL`, `WARMENV_REMOTE`, run as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import anyio
import coredis
import pytest

from redis_server import RedisServer, free_port, redis_server
from test_cli import warmenv
from warmenv import open_environment

NS = "app/1/kernels"
PASSWORD = "s3cret-Pa55word"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root whose environment 'fleet' holds one entry."""
    root = tmp_path / "root"

    async def fill() -> None:
        async with open_environment("fleet", root=root, remote="") as env:
            await env.storage(NS).insert(b'"k"', b"1")

    anyio.run(fill)
    return root


def nothing_listens() -> str:
    return f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"


def one_warning(completed: subprocess.CompletedProcess[str]) -> str:
    assert completed.returncode == 0, completed.stderr
    (line,) = completed.stderr.splitlines()
    assert line.startswith("warmenv: warning: ")
    assert PASSWORD not in completed.stdout + completed.stderr
    return line


@pytest.mark.parametrize(
    ("command", "result"),
    [
        pytest.param(["ls", "--env", "fleet"], "1 namespace, 1 entry in 'fleet'", id="ls"),
        pytest.param(["stats", "--env", "fleet"], "statistics of 'fleet'", id="stats"),
        pytest.param(
            ["explain", NS, "--env", "fleet"], f"namespace '{NS}' holds 1 entry", id="explain"
        ),
        pytest.param(["gc", "--env", "fleet", "--max-bytes", "1GB"], "evicted 0 entries", id="gc"),
    ],
)
def test_an_unreachable_remote_is_said_once_and_the_command_works_locally(
    root: Path, command: list[str], result: str
) -> None:
    url = nothing_listens()
    completed = warmenv(*command, "--remote", url, root=root)
    line = one_warning(completed)
    assert "Redis at redis://:***@127.0.0.1" in line
    assert "unavailable" in line and "serving from the local tier" in line
    assert result in completed.stdout  # the command's own output, as without a remote


def test_an_unreachable_configured_remote_is_said_once_too(root: Path) -> None:
    completed = warmenv(
        "ls", "--env", "fleet", "--json", root=root, env={"WARMENV_REMOTE": nothing_listens()}
    )
    assert "unavailable" in one_warning(completed)
    assert json.loads(completed.stdout)["environment"] == "fleet"


def test_an_import_with_an_unreachable_remote_warns_once_and_imports(
    root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fleet.bundle"
    exported = warmenv(
        "export", str(out), "--name", "n", "--app-version", "1", "--env", "fleet", root=root
    )
    assert exported.returncode == 0, exported.stderr
    url = nothing_listens()
    completed = warmenv("import", str(out), "--env", "other", "--remote", url, "--json", root=root)
    assert "unavailable" in one_warning(completed)
    assert json.loads(completed.stdout)["imported"] == 1


def test_a_frozen_tls_remote_is_said_once_without_the_client_s_unclosed_streams(
    root: Path, tmp_path: Path
) -> None:
    # coredis 6.9 leaves memory streams unclosed when a TLS connect is cancelled
    # (tests/redis_server.py); the command must not print a line for each.
    with redis_server(password=PASSWORD, tls=tmp_path / "tls") as server:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            completed = warmenv("ls", "--env", "fleet", "--remote", server.url, root=root)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    line = one_warning(completed)
    assert "rediss://:***@127.0.0.1" in line and "no answer within 0.25 s" in line
    assert "1 namespace, 1 entry in 'fleet'" in completed.stdout


def test_a_reachable_remote_is_not_warned_about(root: Path, server: RedisServer) -> None:
    completed = warmenv("ls", "--env", "fleet", "--remote", server.url, root=root)
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""
    assert NS in completed.stdout


def _commands(url: str) -> dict[str, int]:
    """How many times the server ran each command since its statistics were reset."""

    async def read() -> dict[str, int]:
        calls: dict[str, int] = {}
        async with coredis.Redis.from_url(url, decode_responses=True) as client:
            stats = await client.info("commandstats")
        for name, counts in stats.items():
            assert isinstance(name, str) and isinstance(counts, dict)
            calls[name.removeprefix("cmdstat_")] = int(counts["calls"])
        return calls

    return anyio.run(read)


def test_the_probe_of_a_remote_is_a_ping_that_reads_no_key(root: Path, server: RedisServer) -> None:
    async def reset() -> None:
        async with coredis.Redis.from_url(server.url) as client:
            await client.config_resetstat()

    anyio.run(reset)
    completed = warmenv("ls", "--env", "fleet", "--remote", server.url, root=root)
    assert completed.returncode == 0, completed.stderr
    commands = _commands(server.url)
    assert commands.get("ping", 0) == 1
    assert not {"get", "getrange", "evalsha", "eval", "subscribe"} & set(commands), commands


def test_stats_counts_the_seconds_that_hits_on_fetched_values_saved(
    tmp_path: Path, server: RedisServer
) -> None:
    async def slow(value: int) -> int:
        await anyio.sleep(0.05)
        return value

    async def hosts() -> None:
        async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
            store = await a.store(NS)
            for i in range(2):
                await store.get_or_compute(f"k{i}", slow, i)
        async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
            store = await b.store(NS)
            for i in range(2):
                assert await store.get(f"k{i}") == i  # fetched: a remote hit
            await store.aclose()

    anyio.run(hosts)
    completed = warmenv("stats", "--env", "fleet", "--json", root=tmp_path / "b")
    assert completed.returncode == 0, completed.stderr
    (namespace,) = json.loads(completed.stdout)["namespaces"]
    assert namespace["hits_by_origin"].get("remote") == 2
    assert namespace["saved_seconds"] >= 2 * 0.04  # each fetched value's carried cost
