"""A remote URL the server refuses is a configuration error, never an outage.

A wrong password (`WRONGPASS`), none where one is required (`NOAUTH`), a
database the server lacks: the server answered, so "Redis is unavailable"
sends the user looking for a network problem that is not there. Against a
real redis-server started here with `requirepass`: the library warns once
that the URL's settings were refused (password hidden), counts no outage and
serves from the local tier; the command line fails in one line naming the URL.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from redis_server import RedisServer, redis_server
from test_cli import warmenv
from test_cli_errors import assert_one_error_line
from warmenv import Namespace, open_environment

PASSWORD = "s3cret-Pa55word"
NS = Namespace("app", "kernels", version="1")


@pytest.fixture
def locked() -> Iterator[RedisServer]:
    with redis_server(password=PASSWORD) as running:
        yield running


def misconfigured(server: RedisServer) -> dict[str, str]:
    """URLs the server answers with a refusal, by what is wrong in them."""
    base = f"127.0.0.1:{server.port}"
    return {
        "wrong password": f"redis://:not-the-{PASSWORD}@{base}/0",
        "no password": f"redis://{base}/0",
        "wrong user": f"redis://nobody:{PASSWORD}@{base}/0",
        "no such database": f"redis://:{PASSWORD}@{base}/99",
    }


CASES = ["wrong password", "no password", "wrong user", "no such database"]


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES)
async def test_a_refused_url_is_warned_about_as_configuration_not_an_outage(
    case: str, locked: RedisServer, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = misconfigured(locked)[case]
    with caplog.at_level(logging.WARNING, logger="warmenv.remote"):
        async with open_environment("svc", root=root, remote=url) as env:
            storage = env.storage(NS)
            await storage.insert(b"k", b"local")
            assert await storage.get(b"k") == b"local"  # served from the local tier
            assert await storage.get(b"absent") is None
            assert env.remote is not None
            stats = env.remote.statistics()
    warnings = [r.getMessage() for r in caplog.records if r.name == "warmenv.remote"]
    assert len(warnings) == 1, warnings
    (line,) = warnings
    assert "refused the remote URL's settings" in line and "not an outage" in line, line
    assert "unavailable" not in line
    assert f"127.0.0.1:{locked.port}" in line and PASSWORD not in line
    assert stats.outages == 0 and not stats.available


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES)
async def test_a_probe_of_a_refused_url_says_it_is_misconfigured(
    case: str, locked: RedisServer, root: Path
) -> None:
    async with open_environment("svc", root=root, remote=misconfigured(locked)[case]) as env:
        assert env.remote is not None
        ping = await env.remote.ping()
    assert ping.misconfigured and not ping.reachable
    assert "refused the remote URL's settings" in str(ping) and PASSWORD not in str(ping)


@pytest.mark.anyio
async def test_the_right_password_is_no_misconfiguration(locked: RedisServer, root: Path) -> None:
    async with open_environment("svc", root=root, remote=locked.url) as env:
        assert env.remote is not None
        ping = await env.remote.ping()
    assert ping.reachable and not ping.misconfigured


@pytest.mark.parametrize("case", CASES)
def test_the_command_line_fails_in_one_line_naming_the_url(
    case: str, locked: RedisServer, tmp_path: Path
) -> None:
    async def make() -> None:
        async with open_environment("svc", root=tmp_path, remote="") as env:
            await env.storage(NS).insert(b"k", b"v")

    anyio.run(make)
    url = misconfigured(locked)[case]
    completed = warmenv("ls", "--env", "svc", "--remote", url, root=tmp_path)
    line = assert_one_error_line(completed, 1)
    assert "refused the remote URL's settings" in line and "fix the password" in line, line
    assert f"127.0.0.1:{locked.port}" in line
    assert PASSWORD not in completed.stdout + completed.stderr
