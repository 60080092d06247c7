"""Bundles by URL from servers that lie or stall: raw sockets, so nothing is polite.

Each server here is a listening socket on 127.0.0.1 and a thread per
connection that reads the request's head and then misbehaves: redirects
forever, redirects to another origin, answers `100 Continue` forever,
trickles its headers or its body a byte at a time. What the client must
do: end within its bounds with one `DownloadError` line, and never hand the
caller's headers to an origin it did not name. Where a hang is the failure,
the client runs in a child process with a timeout, and how long the download
took is measured from the moment the child calls it to the moment the server
sees its last connection end (the machine's one monotonic clock): a
saturated machine stretched the child's start-up and imports past the
bound when they were counted too, and they are no part of a download.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import one_trial, run_python
from warmenv import open_environment
from warmenv.bundle import DownloadError, DownloadOptions, import_bundle, preflight

SECRET = "S3CRET"

Behaviour = Callable[["socket.socket", bytes, "HostileServer"], None]


class HostileServer:
    """A listening socket whose every connection is handed to `behaviour`."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[bytes] = []
        self.target = ""  # where a redirecting behaviour sends the client
        self.stopped = threading.Event()
        self.ended: list[float] = []  # when each connection that sent a request ended
        self._handlers: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, path: str = "/b.bundle", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            handler = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._handlers.append(handler)
            handler.start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            asked = False
            try:
                while b"\r\n\r\n" not in head:
                    data = conn.recv(4096)
                    if not data:
                        return
                    head += data
                asked = True
                self.requests.append(head)
                self.behaviour(conn, head, self)
            except OSError:  # the client hung up: what it was meant to do
                pass
            finally:
                if asked:
                    self.ended.append(time.monotonic())

    def last_hang_up(self) -> float:
        """When (`time.monotonic()`) the last connection that sent a request ended, once
        every connection so far has (the client's exit ends them all, and each behaviour
        notices a hang-up at once)."""
        for handler in list(self._handlers):
            handler.join(timeout=30)
        assert not any(handler.is_alive() for handler in self._handlers), "a connection is open"
        assert self.ended, "no request reached the server"
        return max(self.ended)

    def close(self) -> None:
        self.stopped.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(timeout=10)


@pytest.fixture
def hostile() -> Iterator[Callable[[Behaviour], HostileServer]]:
    made: list[HostileServer] = []

    def make(behaviour: Behaviour) -> HostileServer:
        made.append(HostileServer(behaviour))
        return made[-1]

    try:
        yield make
    finally:
        for server in made:
            server.close()


def _hung_up(conn: socket.socket, server: HostileServer, wait: float) -> bool:
    """Whether the client closed the connection (or the server stopped) within `wait` s.

    The client sends nothing after its request, so a readable socket is its
    hang-up: noticed at once, not at a later write that fails.
    """
    readable, _, _ = select.select([conn], [], [], wait)
    return server.stopped.is_set() or (bool(readable) and not conn.recv(4096))


def _trickle(conn: socket.socket, data: bytes, server: HostileServer, every: float) -> None:
    for byte in data:
        if _hung_up(conn, server, every):
            return
        conn.sendall(bytes([byte]))


def redirect_to_itself(conn: socket.socket, head: bytes, server: HostileServer) -> None:
    path = head.split(b" ", 2)[1]
    conn.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: "
        + path
        + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )


def continue_forever(conn: socket.socket, head: bytes, server: HostileServer) -> None:
    while not _hung_up(conn, server, 0.05):
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


def headers_a_byte_at_a_time(conn: socket.socket, head: bytes, server: HostileServer) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    _trickle(conn, b"X-Slow: " + b"a" * 100_000, server, every=0.05)


def body_a_byte_every_half_second(conn: socket.socket, head: bytes, server: HostileServer) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
    _trickle(conn, b"\0" * 1_000_000, server, every=0.5)


def not_found(conn: socket.socket, head: bytes, server: HostileServer) -> None:
    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def headers_of(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)
    }


_ENDLESS = (
    "hostile HTTP server that never finishes: 100 Continue forever, headers or a body a byte at "
    "a time, import and preflight by URL (child; asyncio, trio)",
    "each ended by a DownloadError within its deadline (+1.5 s), or under the minimum rate "
    "before it; no private directory left; the child within its 30 s timeout",
)
_REDIRECT_LOOP = (
    "redirect loop by URL: import, preflight and the CLI (asyncio, uvloop, trio)",
    "a DownloadError ('redirected too many times'); the CLI one line, exit 1, no credential",
)
_CROSS_ORIGIN = (
    "caller headers on a redirect to another origin (port, host name) (asyncio, uvloop, trio)",
    "none of X-Api-Key, Authorization or a custom header reaches the other origin unless "
    "cross_origin_headers=True; the first origin got them",
)
_BAD_URLS_ROW = (
    "malformed or foreign bundle URLs (a '#', '/' in the password, an unclosed '[', ftp://, "
    "file://, a port over 65535, no host): import, verify, check, inspect and the library",
    "one line (DownloadError or a usage error), exit 1 or 2, no credential printed, nothing "
    "created, no retry",
)


# --- a redirect loop -----------------------------------------------------------------


@pytest.mark.anyio
async def test_a_redirect_loop_is_a_download_error_in_import_and_preflight(
    hostile: Callable[[Behaviour], HostileServer], tmp_path: Path
) -> None:
    with one_trial(*_REDIRECT_LOOP):
        url = hostile(redirect_to_itself).url()
        async with open_environment("e", root=tmp_path) as env:
            with pytest.raises(DownloadError, match="redirected too many times"):
                await import_bundle(url, env)
        with pytest.raises(DownloadError, match="redirected too many times"):
            await preflight(url)


def test_the_command_line_says_a_redirect_loop_in_one_line(
    hostile: Callable[[Behaviour], HostileServer], tmp_path: Path
) -> None:
    with one_trial(*_REDIRECT_LOOP):
        url = hostile(redirect_to_itself).url().replace("http://", f"http://u:{SECRET}@")
        completed = subprocess.run(
            [sys.executable, "-m", "warmenv", "import", url, "--root", str(tmp_path / "r")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert completed.returncode == 1
        assert completed.stderr.count("\n") == 1, completed.stderr
        assert "redirected too many times" in completed.stderr
        assert "unexpected" not in completed.stderr and SECRET not in completed.stderr


# --- every wait bounded --------------------------------------------------------------

_CHILD = """
import json, sys, time
import anyio
import httpx  # imported here, not in the download's time
from warmenv import open_environment
from warmenv.bundle import DownloadError, DownloadOptions, import_bundle, preflight

url, what, backend, options, root = sys.argv[1:]
options = DownloadOptions(**json.loads(options))
called = []

async def main():
    if what == "preflight":
        called.append(time.monotonic())
        await preflight(url, download=options)
    else:
        async with open_environment("e", root=root) as env:
            called.append(time.monotonic())
            await import_bundle(url, env, download=options)

try:
    anyio.run(main, backend=backend)
except DownloadError as exc:
    error = str(exc)
else:
    error = None
now = time.monotonic()
print(json.dumps({"error": error, "called": called[0], "elapsed": now - called[0]}))
"""


def took(result: dict[str, object], server: HostileServer) -> float:
    """Seconds from the child's call to the server's last hang-up (one monotonic clock)."""
    return server.last_hang_up() - float(str(result["called"]))


def _fetch_in_child(
    url: str, what: str, backend: str, root: Path, **options: object
) -> dict[str, object]:
    completed = run_python(_CHILD, url, what, backend, json.dumps(options), str(root), timeout=30)
    assert completed.returncode == 0, completed.stderr
    result: dict[str, object] = json.loads(completed.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    "behaviour", [continue_forever, headers_a_byte_at_a_time, body_a_byte_every_half_second]
)
def test_a_server_that_never_finishes_ends_the_download_within_its_deadline(
    hostile: Callable[[Behaviour], HostileServer],
    tmp_path: Path,
    behaviour: Behaviour,
    backend: str,
) -> None:
    with one_trial(*_ENDLESS):
        server = hostile(behaviour)
        result = _fetch_in_child(
            server.url(), "import", backend, tmp_path, timeout=1, retries=1, deadline=4, min_rate=0
        )
        assert result["error"] is not None
        assert took(result, server) < 4 + 1.5, result
        assert not list(tmp_path.glob(".warmenv-import.*"))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_body_under_the_minimum_rate_fails_before_the_deadline(
    hostile: Callable[[Behaviour], HostileServer], tmp_path: Path, backend: str
) -> None:
    with one_trial(*_ENDLESS):
        server = hostile(body_a_byte_every_half_second)
        result = _fetch_in_child(
            server.url(),
            "import",
            backend,
            tmp_path,
            timeout=1,
            retries=1,
            deadline=60,
            min_rate=100,
        )
        assert "under the minimum rate of 100 bytes/s" in str(result["error"]), result
        assert took(result, server) < 10, result


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_preflight_by_url_ends_within_its_deadline_too(
    hostile: Callable[[Behaviour], HostileServer], tmp_path: Path, backend: str
) -> None:
    with one_trial(*_ENDLESS):
        server = hostile(continue_forever)
        result = _fetch_in_child(
            server.url(), "preflight", backend, tmp_path, timeout=1, retries=1, deadline=3
        )
        assert result["error"] is not None
        assert took(result, server) < 3 + 1.5, result


def test_the_bounds_have_documented_defaults_and_are_checked() -> None:
    options = DownloadOptions()
    assert (options.deadline, options.min_rate, options.cross_origin_headers) == (
        3600.0,
        1024,
        False,
    )
    with pytest.raises(ValueError, match="deadline"):
        DownloadOptions(deadline=0)
    with pytest.raises(ValueError, match="min_rate"):
        DownloadOptions(min_rate=-1)


# --- headers stay with their origin --------------------------------------------------


def redirect_to_target(conn: socket.socket, head: bytes, server: HostileServer) -> None:
    """The bundle's path redirects to `server.target`; anything else is not found."""
    if not head.startswith(b"GET /b.bundle "):
        return not_found(conn, head, server)
    location = f"Location: {server.target}\r\n".encode()
    conn.sendall(
        b"HTTP/1.1 302 Found\r\n" + location + b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("other", ["port", "host name"])
async def test_caller_headers_are_not_sent_to_another_origin_after_a_redirect(
    hostile: Callable[[Behaviour], HostileServer], tmp_path: Path, other: str
) -> None:
    with one_trial(*_CROSS_ORIGIN):
        first = hostile(redirect_to_target)
        there = hostile(not_found) if other == "port" else first
        # The same server under another name is another origin too.
        first.target = there.url("/there", host="127.0.0.1" if other == "port" else "localhost")
        headers = {"X-Api-Key": SECRET, "Authorization": f"Bearer {SECRET}", "X-Trace": "t"}
        async with open_environment("e", root=tmp_path) as env:
            with pytest.raises(DownloadError, match="404"):
                await import_bundle(first.url(), env, download=DownloadOptions(headers=headers))
        assert headers_of(first.requests[0])["x-api-key"] == SECRET
        sent_there = headers_of(there.requests[-1])
        assert there.requests[-1].startswith(b"GET /there ")
        assert not {"x-api-key", "authorization", "x-trace"} & set(sent_there), sent_there
        assert sent_there["accept-encoding"] == "identity"


@pytest.mark.anyio
async def test_a_caller_may_allow_its_headers_across_origins(
    hostile: Callable[[Behaviour], HostileServer], tmp_path: Path
) -> None:
    with one_trial(*_CROSS_ORIGIN):
        there = hostile(not_found)
        first = hostile(redirect_to_target)
        first.target = there.url("/there")
        options = DownloadOptions(headers={"X-Api-Key": SECRET}, cross_origin_headers=True)
        async with open_environment("e", root=tmp_path) as env:
            with pytest.raises(DownloadError, match="404"):
                await import_bundle(first.url(), env, download=options)
        assert headers_of(there.requests[-1])["x-api-key"] == SECRET


# --- what no retry mends, and what the server says that is not printed ----------------


@pytest.mark.anyio
async def test_a_redirect_to_a_malformed_location_fails_at_once_without_quoting_it(
    hostile: Callable[[Behaviour], HostileServer], tmp_path: Path
) -> None:
    server = hostile(redirect_to_target)
    server.target = f"http://127.0.0.1:{SECRET}B/x"  # a port that is no number
    async with open_environment("e", root=tmp_path) as env:
        with pytest.raises(DownloadError) as caught:
            await import_bundle(server.url(), env, download=DownloadOptions(retries=5))
    assert len(server.requests) == 1
    message = str(caught.value)
    assert "redirected to an invalid Location" in message and SECRET not in message, message


def not_found_saying_a_secret(conn: socket.socket, head: bytes, server: HostileServer) -> None:
    conn.sendall(
        f"HTTP/1.1 404 Not Found /n404;tok={SECRET}?sig={SECRET}2\r\n".encode()
        + b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.anyio
async def test_the_server_s_own_reason_phrase_is_never_printed_nor_logged(
    hostile: Callable[[Behaviour], HostileServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = hostile(not_found_saying_a_secret)
    with (
        caplog.at_level(logging.DEBUG, logger="httpx"),
        caplog.at_level(logging.DEBUG, logger="httpcore"),
    ):
        async with open_environment("e", root=tmp_path) as env:
            with pytest.raises(DownloadError) as caught:
                await import_bundle(server.url(), env)
    message = str(caught.value)
    assert "the server answered 404 Not Found; check the URL" in message, message
    assert SECRET not in message
    logged = [record.getMessage() for record in caplog.records]
    assert any("404 Not Found" in line for line in logged), logged
    assert not [line for line in logged if SECRET in line]


def cut_short(conn: socket.socket, head: bytes, server: HostileServer) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\nabc")


@pytest.mark.anyio
async def test_no_retries_says_one_attempt(
    hostile: Callable[[Behaviour], HostileServer], tmp_path: Path
) -> None:
    server = hostile(cut_short)
    async with open_environment("e", root=tmp_path) as env:
        with pytest.raises(DownloadError, match=r"failed after 1 attempt \("):
            await import_bundle(server.url(), env, download=DownloadOptions(retries=0))
    assert len(server.requests) >= 1


@pytest.mark.anyio
async def test_a_malformed_proxy_url_is_refused_in_one_line_without_its_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://puser:PROXY/{SECRET}@127.0.0.1:1")
    async with open_environment("e", root=tmp_path) as env:
        with pytest.raises(DownloadError) as caught:
            await import_bundle("http://example.invalid/b", env)
    message = str(caught.value)
    assert "the proxy URL in HTTP_PROXY, HTTPS_PROXY or ALL_PROXY is invalid" in message
    assert SECRET not in message and "PROXY'" not in message and "puser" not in message


# --- malformed and foreign URLs ------------------------------------------------------

_BAD_URLS = [
    f"http://u:pa#{SECRET}@127.0.0.1:1/b",  # a '#' in the password cuts the host part short
    f"http://u:{SECRET}@[::1/b",  # an unclosed IPv6 bracket
    f"ftp://u:{SECRET}@host/b",  # a scheme we do not download from
    f"http://u:{SECRET}@127.0.0.1:99999/b",  # a port out of range
    f"http://u:{SECRET}@/b",  # no host
    f"file://u:{SECRET}@/etc/b",
    f"http://u:p/{SECRET}@127.0.0.1:1/b",  # a '/' in the password
]


def _one_line_refusal(argv: list[str], root: Path) -> None:
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "warmenv", *argv, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode in (1, 2), completed.stderr
    assert completed.stderr.count("\n") == 1, completed.stderr
    assert SECRET not in completed.stderr + completed.stdout
    assert "unexpected" not in completed.stderr and "no such file" not in completed.stderr
    assert time.monotonic() - started < 30  # refused, not retried
    assert not root.exists()


@pytest.mark.parametrize("url", _BAD_URLS)
def test_import_refuses_a_malformed_or_foreign_url_in_one_line_without_its_credentials(
    url: str, tmp_path: Path
) -> None:
    with one_trial(*_BAD_URLS_ROW):
        _one_line_refusal(["import", url], tmp_path / "r")


@pytest.mark.parametrize("url", [_BAD_URLS[0], _BAD_URLS[2]])
@pytest.mark.parametrize("command", ["verify", "check", "inspect"])
def test_a_command_reading_a_file_refuses_a_url_in_one_line_without_its_credentials(
    url: str, command: str, tmp_path: Path
) -> None:
    with one_trial(*_BAD_URLS_ROW):
        _one_line_refusal([command, url], tmp_path / "r")


@pytest.mark.anyio
@pytest.mark.parametrize("url", _BAD_URLS)
async def test_the_library_refuses_a_malformed_or_foreign_url_as_a_download_error(
    url: str, tmp_path: Path
) -> None:
    with one_trial(*_BAD_URLS_ROW):
        async with open_environment("e", root=tmp_path) as env:
            with pytest.raises(DownloadError) as caught:
                await import_bundle(url, env)
        with pytest.raises(DownloadError) as preflighted:
            await preflight(url)
        for error in (caught.value, preflighted.value):
            assert SECRET not in str(error) and "\n" not in str(error)
