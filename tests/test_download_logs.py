"""No log line a download causes carries a secret: ours, httpx's or httpcore's.

httpx logs each request at INFO with its URL as sent, and httpcore, at
DEBUG, each response's headers. The URLs we are given carry passwords and
tokens (`https://user:pw@host/b?token=...`), a redirect sends us to signed
URLs (absolute or relative), and a server sets cookies. Each test captures
every record at DEBUG, from every logger, through a real download from real
HTTP servers on free ports, then looks for each secret in every line, as
a handler would format it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import one_trial
from test_download import BundleServer
from test_download_hostile import Behaviour, HostileServer, hostile, not_found  # noqa: F401
from test_signing import http_server  # noqa: F401 (a fixture, used by name)
from warmenv import Environment
from warmenv.bundle import DownloadError, DownloadOptions, export_bundle, import_bundle, preflight

pytestmark = pytest.mark.anyio

SECRETS = ("PASS-1", "TOKEN-1", "PASS-2", "TOKEN-2", "COOKIE-3", "HEADER-4", "TOKEN-5")
_ROW = (
    "secrets in log lines of a download: URL passwords and tokens, a redirect's, a cookie "
    "(asyncio, uvloop, trio)",
    "every record at DEBUG from every logger (httpx, httpcore, warmenv) formatted: no "
    "password, token, cookie or caller header; the records are there",
)


def _redirects(routes: dict[str, str]) -> Behaviour:
    """Each path (its query aside) redirects to its `routes` location, with a cookie and a
    token of the server's own in the response's headers; any other path is not found."""

    def behaviour(conn: socket.socket, head: bytes, server: HostileServer) -> None:
        path = head.split(b" ", 2)[1].decode().partition("?")[0]
        if path not in routes:
            return not_found(conn, head, server)
        conn.sendall(
            f"HTTP/1.1 302 Found\r\nLocation: {routes[path]}\r\n"
            "Set-Cookie: session=COOKIE-3\r\nX-Request-Token: TOKEN-5\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )

    return behaviour


@pytest.fixture
def records() -> Iterator[list[str]]:
    """Every record logged anywhere at DEBUG, as a handler formats it."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _leaks(lines: list[str]) -> list[str]:
    return [line for line in lines if any(secret in line for secret in SECRETS)]


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
async def test_a_download_through_a_redirect_logs_no_secret(
    records: list[str],
    relative: bool,
    warm_env: Environment,
    cold_env: Environment,
    out_dir: Path,
    hostile: Callable[[Behaviour], HostileServer],  # noqa: F811
    http_server: BundleServer,  # noqa: F811
) -> None:
    with one_trial(*_ROW):
        await export_bundle(warm_env, out_dir / "b", name="n", version="1")
        served = http_server.put("/b", (out_dir / "b").read_bytes())
        # The bundle's own server is reached as u:PASS-2 with a signed URL's token,
        # straight from the first redirect, or through a relative one.
        signed = served.replace("http://", "http://u:PASS-2@") + "?token=TOKEN-2&sig"
        routes = (
            {"/b.bundle": "/hop?token=TOKEN-2", "/hop": signed}
            if relative
            else {"/b.bundle": signed}
        )
        first = hostile(_redirects(routes))
        url = first.url().replace("http://", "http://user:PASS-1@") + "?token=TOKEN-1"
        options = DownloadOptions(headers={"X-Api-Key": "HEADER-4"}, cross_origin_headers=True)
        await preflight(url, download=options)
        await import_bundle(url, cold_env, download=options)
        assert await cold_env.namespaces() != []
        assert any("HTTP Request: GET" in line for line in records), records
        assert any("receive_response_headers" in line for line in records), records
        assert any("Location" in line and "***" in line for line in records), records
        assert _leaks(records) == []


async def test_a_failed_download_logs_no_secret(
    records: list[str],
    cold_env: Environment,
    hostile: Callable[[Behaviour], HostileServer],  # noqa: F811
) -> None:
    """A redirect loop through a signed URL: the error and every line on the way."""
    with one_trial(*_ROW):
        first = hostile(_redirects({"/b.bundle": "/b.bundle?token=TOKEN-2&PASS-2"}))
        url = first.url().replace("http://", "http://user:PASS-1@") + "?token=TOKEN-1"
        with pytest.raises(DownloadError) as raised:
            await import_bundle(url, cold_env, download=DownloadOptions(retries=0))
        assert _leaks([str(raised.value)]) == []
        assert any("HTTP Request: GET" in line for line in records), records
        assert _leaks(records) == []
