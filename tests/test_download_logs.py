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
import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers import one_trial
from test_download import BundleServer
from test_download_hostile import Behaviour, HostileServer, hostile, not_found  # noqa: F401
from test_signing import http_server  # noqa: F401 (a fixture, used by name)
from warmenv import Environment
from warmenv.bundle import DownloadError, DownloadOptions, export_bundle, import_bundle, preflight
from warmenv.bundle._http_logs import _FILTER, _REQUEST_LINE

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


def _filtered(record: logging.LogRecord) -> str:
    """`record` as a handler formats it, after the filter on httpx's and httpcore's loggers."""
    assert _FILTER.filter(record)
    return logging.Formatter("%(name)s %(message)s").format(record)


# A secret as it may be written in a URL: quotes, parentheses, brackets, `%` escapes, spaces,
# separators, unicode; marked at both ends, so that a leak of any of its pieces shows. Not a
# raw `&` or `=`: in a query they make a new item's name, which `redact` shows by design.
_MARK = "S3CR3T"
_secret = (
    st.lists(
        st.sampled_from(
            [*"aZ09-._~()[]{}'\"<>%;,!*$+ /?#@:\\", "%20", "%26", "%3D", "é", "☃", "\t"]
        ),
        max_size=12,
    )
    .map("".join)
    .map(lambda s: f"{_MARK}{s}{_MARK}")
)
_urls = st.builds(
    lambda scheme, user, query, fragment, where: {
        "user": f"{scheme}://u:{user}@host:8000/b.bundle?token=x",
        "value": f"{scheme}://host/b.bundle?sig={query}&X-Amz-Signature={query}",
        "item": f"{scheme}://host/b.bundle?a=1&{query}",
        "fragment": f"{scheme}://host/b.bundle?a=1#{fragment}",
        "all": f"{scheme}://{user}@host/b?t={query}#{fragment}",
    }[where],
    st.sampled_from(["http", "https", "HTTPS", "redis"]),
    _secret,
    _secret,
    _secret,
    st.sampled_from(["user", "value", "item", "fragment", "all"]),
)


@settings(max_examples=300, deadline=None)
@given(url=_urls)
def test_httpx_request_line_never_shows_a_secret_of_its_url(url: str) -> None:
    """The URL argument of httpx's INFO line (an `httpx.URL`, which httpx could parse and send)
    is redacted as the URL it is, whatever its query and fragment hold."""
    import httpx

    try:
        sent = httpx.URL(url)
    except httpx.InvalidURL:
        return  # never sent, never logged
    names = [item.partition("=")[0] for item in sent.query.decode().split("&")]
    if _MARK.lower() in sent.host or _MARK in f"{sent.path}{names}":
        return  # what httpx reads as the host, the path or a query's name (`u:pw/x@h`): shown
    args = ("GET", sent, "HTTP/1.1", 302, "Found")
    line = _filtered(
        logging.LogRecord("httpx", logging.INFO, __file__, 1, _REQUEST_LINE, args, None)
    )
    assert _MARK not in line
    assert line.startswith("httpx HTTP Request: GET ")
    assert line.endswith(' "HTTP/1.1 302 Found"')


@settings(max_examples=300, deadline=None)
@given(url=_urls, quote=st.sampled_from(["", "'", '"', "(", "<", "[b'"]))
# Found by this test: a password holding `@ ?` (no host after the first `@`).
@example(url=f"http://u:{_MARK}@ ?{_MARK}@host:8000/b.bundle?token=x", quote="")
@example(url=f"http://u:{_MARK}@ ?{_MARK}@host:8000/b.bundle?token=x", quote="(")
def test_a_url_in_free_text_never_shows_a_secret(url: str, quote: str) -> None:
    """A URL in any other line of httpx or httpcore (an exception's message, a header's look-alike
    after it): its user information, query and fragment are hidden, wherever it seems to end."""
    if re.search(r"\s", url.partition("@")[0]):
        return  # a space before a user information's end: text cannot say that it is one
    message = f"connect.failed exception=Error({quote}{url}{quote[::-1]}) (b'Set-Cookie', b'a') z"
    record = logging.LogRecord(
        "httpcore.connection", logging.DEBUG, __file__, 1, message, None, None
    )
    assert _MARK not in _filtered(record)


async def test_a_redirect_with_parentheses_and_quotes_in_its_query_logs_no_secret(
    records: list[str],
    cold_env: Environment,
    hostile: Callable[[Behaviour], HostileServer],  # noqa: F811
) -> None:
    """Characters legal in a query that text takes for a URL's end (a parenthesis, a quote, a
    bracket) and a fragment of the given URL: no piece of a signature is logged after them."""
    with one_trial(*_ROW):
        location = "/b.flat?sig=TOKEN-2(x)&X-Amz-Signature=TOKEN-2'[y]\"&z=(TOKEN-2)"
        first = hostile(_redirects({"/b.bundle": location}))
        url = first.url().replace("http://", "http://user:PASS-1@") + "?t=(TOKEN-1)#fragTOKEN-1"
        with pytest.raises(DownloadError):
            await import_bundle(url, cold_env, download=DownloadOptions(retries=0))
        assert any("HTTP Request: GET" in line and "/b.flat?" in line for line in records), records
        assert _leaks(records) == []
