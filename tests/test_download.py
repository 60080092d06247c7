"""Bundles by URL: served by a real HTTP server on 127.0.0.1, imported and preflighted.

The server is a small threaded `http.server` written here: it honours
`Range` and `If-Range` (with an ETag and Last-Modified per file) and can be
told to misbehave once: drop the connection mid-body, stall mid-body until
released, ignore ranges, or send a body with no length.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import attrs
import pytest

from conftest import env_contents, sample_entries
from redis_server import self_signed_certificate
from warmenv import Environment, WarmenvError, open_environment
from warmenv.bundle import (
    BundleStarted,
    CorruptBundleError,
    DownloadError,
    Downloading,
    DownloadOptions,
    ImportEvent,
    InvalidManifestError,
    NotABundleError,
    StaleBundleError,
    export_bundle,
    import_bundle,
    importing,
    preflight,
)

TOTAL = sum(len(items) for items in sample_entries().values())


# --- the server --------------------------------------------------------------------


@attrs.define
class Seen:
    """One request as the server saw it, and what it answered."""

    path: str
    range: str | None
    if_range: str | None
    status: int = 0
    sent: int = 0  # body bytes written


@attrs.define
class Served:
    body: bytes
    etag: str
    modified: str


class BundleServer(ThreadingHTTPServer):
    """Serves `files` by path; the knobs make the next response misbehave once."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, Served] = {}
        self.seen: list[Seen] = []
        self.honour_ranges = True
        self.send_length = True
        self.drop_after: int | None = None  # the next full body stops after this many bytes
        self.drops_left = 0
        self.on_drop: Callable[[], None] | None = None
        self.garble = False  # a drop first writes a TLS record no key decrypts
        self.stall_after: int | None = None  # the next body waits for `release` there
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.statuses: list[int] = []  # answered, in turn, before any file is served
        self.redirect_to: str | None = None  # where every GET is redirected
        self.connections = 0  # accepted, whatever was said on them (a TLS handshake too)
        self.headers: dict[str, str] = {}  # sent with every file served
        self._versions = 0

    def verify_request(self, request: object, client_address: object) -> bool:
        self.connections += 1  # on the serving thread, once per accepted connection
        return True

    def put(self, path: str, body: bytes) -> str:
        self._versions += 1
        tag = hashlib.sha256(body).hexdigest()[:16]
        modified = formatdate(1_700_000_000 + self._versions, usegmt=True)
        self.files[path] = Served(body, f'"{tag}"', modified)
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up
            super().handle_error(request, client_address)  # type: ignore[arg-type]

    def range_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.range is not None]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: BundleServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        server = self.server
        seen = Seen(self.path.split("?", 1)[0], self.headers["Range"], self.headers["If-Range"])
        server.seen.append(seen)
        served = server.files.get(seen.path)
        if server.redirect_to is not None:
            seen.status = 302
            self.send_response(302)
            self.send_header("Location", server.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if server.statuses:
            seen.status = server.statuses.pop(0)
            self.send_response(seen.status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if served is None:
            seen.status = 404
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body, start = served.body, 0
        ranged = (
            seen.range is not None
            and server.honour_ranges
            and seen.if_range in (None, served.etag, served.modified)
        )
        if ranged:
            assert seen.range is not None
            first, _, last = seen.range.removeprefix("bytes=").partition("-")
            start = int(first)
            end = min(int(last) + 1, len(body)) if last else len(body)
            part = body[start:end]
            seen.status = 206
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(body)}")
        else:
            part = body
            seen.status = 200
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", served.etag)
        self.send_header("Last-Modified", served.modified)
        for name, value in server.headers.items():
            self.send_header(name, value)
        if server.send_length:
            self.send_header("Content-Length", str(len(part)))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        cut = server.drop_after if server.drops_left and not ranged else None
        stall = server.stall_after
        if cut is not None:
            server.drops_left -= 1
            self._send(seen, part[:cut])
            if server.garble:  # on the bare socket, below the TLS layer: a corrupt record
                os.write(self.connection.fileno(), b"\x17\x03\x03\x00\x20" + b"\xaa" * 32)
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            if server.on_drop is not None:
                server.on_drop()
            return
        if stall is not None:
            server.stall_after = None
            self._send(seen, part[:stall])
            server.stalled.set()
            server.release.wait(timeout=60)
            self.close_connection = True
            return
        self._send(seen, part)

    def _send(self, seen: Seen, data: bytes) -> None:
        step = 64 << 10
        for at in range(0, len(data), step):
            self.wfile.write(data[at : at + step])
            seen.sent += len(data[at : at + step])
        self.wfile.flush()


@pytest.fixture
def server() -> Iterator[BundleServer]:
    httpd = BundleServer()
    thread = threading.Thread(target=httpd.serve_forever, name="bundle-server", daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


# --- helpers -----------------------------------------------------------------------


def staging_left(root: Path) -> list[Path]:
    """Private import directories beside the environments, and ours in the temp dir."""
    ours = Path(tempfile.gettempdir()).glob(f".warmenv-import.{os.getpid()}.*")
    return [*root.glob(".warmenv-import.*"), *ours]


def tampered(body: bytes) -> bytes:
    """One value changed, the structure intact (no checksum covers a SQLite cell)."""
    data = bytearray(body)
    at = data.rindex(b"kernel-7")
    data[at] ^= 0x20
    return bytes(data)


async def events_of(url: str, env: Environment, **kwargs: object) -> list[ImportEvent]:
    async with importing(url, env, **kwargs) as progress:  # type: ignore[arg-type]
        return [event async for event in progress]


async def flat_bundle_of(tmp_path: Path, name: str, values: int) -> Path:
    """A flat bundle of `values` values of 100 KiB, in namespace `app/<name>/1`."""
    out = tmp_path / f"{name}.bundle"
    async with open_environment(name, root=tmp_path / f"{name}-root") as env:
        await env.storage(f"app/{name}/1").insert_many(
            (b"k%03d" % i, bytes([i % 256]) * (100 << 10)) for i in range(values)
        )
        await export_bundle(env, out, name=name, version="1", format="flat")
    return out


@pytest.fixture
async def big_bundle(root: Path, tmp_path: Path) -> Path:
    """About 4 MiB of values, so a download is reported on disk before it ends."""
    return await flat_bundle_of(tmp_path, "big", 40)


# --- import by URL -----------------------------------------------------------------


def test_the_blocking_import_takes_a_url_and_its_download_options(
    server: BundleServer, tmp_path: Path
) -> None:
    # warmenv.blocking.import_bundle had no download= (and took no open bundle).
    from warmenv import BytesCodec, Namespace, blocking

    ns, out, cold_root = Namespace("app", "big", version="1"), tmp_path / "b.bundle", tmp_path / "c"
    with blocking.open_environment("warm", root=tmp_path / "w") as warm:
        store: blocking.BlockingStore[bytes, bytes] = warm.store(ns, codec=BytesCodec())
        for i in range(8):
            store.insert(b"k%d" % i, bytes([i]) * (64 << 10))
        blocking.export_bundle(warm, out, name="big", version="1", format="flat")
    url = server.put("/b.bundle", out.read_bytes())
    with blocking.open_environment("cold", root=cold_root) as cold:
        with pytest.raises(DownloadError, match="over the download limit"):
            blocking.import_bundle(url, cold, download=DownloadOptions(max_bytes=1 << 16))
        assert cold.namespaces() == []
        report = blocking.import_bundle(url, cold, download=DownloadOptions(max_bytes=1 << 30))
        assert report.complete
        assert cold.store(ns, codec=BytesCodec()).get(b"k7") == bytes([7]) * (64 << 10)
    assert staging_left(cold_root) == []


@pytest.mark.anyio
async def test_an_import_by_url_equals_an_import_by_path(
    server: BundleServer, bundle_path: Path, root: Path
) -> None:
    url = server.put("/b/warm.bundle", bundle_path.read_bytes())
    async with (
        open_environment("by-path", root=root) as by_path,
        open_environment("by-url", root=root) as by_url,
    ):
        from_path = await import_bundle(bundle_path, by_path)
        from_url = await import_bundle(url, by_url)
        assert from_url.imported == from_path.imported == TOTAL
        assert await env_contents(by_url) == await env_contents(by_path) == sample_entries()
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_downloading_events_come_before_started(
    server: BundleServer, bundle_path: Path, cold_env: Environment
) -> None:
    size = bundle_path.stat().st_size
    url = server.put("/warm.bundle", bundle_path.read_bytes())
    events = await events_of(url, cold_env)
    downloads = [e for e in events if isinstance(e, Downloading)]
    first_other = next(i for i, e in enumerate(events) if not isinstance(e, Downloading))
    assert downloads and all(isinstance(e, Downloading) for e in events[:first_other])
    assert isinstance(events[first_other], BundleStarted)
    assert not any(isinstance(e, Downloading) for e in events[first_other:])
    assert (downloads[-1].bytes_done, downloads[-1].total_bytes) == (size, size)
    assert [e.bytes_done for e in downloads] == sorted(e.bytes_done for e in downloads)


@pytest.mark.anyio
async def test_a_dropped_connection_resumes_with_range_and_the_result_is_verified(
    server: BundleServer, bundle_path: Path, cold_env: Environment
) -> None:
    body = bundle_path.read_bytes()
    url = server.put("/warm.bundle", body)
    server.drop_after, server.drops_left = len(body) // 2, 1
    report = await import_bundle(url, cold_env)
    assert report.imported == TOTAL
    assert await env_contents(cold_env) == sample_entries()
    (resumed,) = server.range_requests()
    assert resumed.range == f"bytes={len(body) // 2}-"
    assert resumed.if_range == server.files["/warm.bundle"].etag
    assert resumed.status == 206
    assert resumed.sent == len(body) - len(body) // 2


@pytest.mark.anyio
async def test_a_file_replaced_on_the_server_is_fetched_again_from_its_start(
    server: BundleServer, bundle_path: Path, cold_env: Environment, tmp_path: Path
) -> None:
    other = tmp_path / "other.bundle"
    async with open_environment("other", root=tmp_path / "other-root") as env:
        await env.storage("app/other/1").insert(b"only", b"this")
        await export_bundle(env, other, name="other", version="1", format="flat")
    body = bundle_path.read_bytes()
    url = server.put("/warm.bundle", body)
    server.drop_after, server.drops_left = len(body) // 2, 1

    def replace_it() -> None:
        server.put("/warm.bundle", other.read_bytes())

    server.on_drop = replace_it
    await import_bundle(url, cold_env)
    assert await env_contents(cold_env) == {"app/other/1": {b"only": b"this"}}
    (asked,) = server.range_requests()
    assert asked.status == 200  # If-Range no longer matched: the whole new file came


@pytest.mark.anyio
async def test_a_tampered_body_fails_as_corrupt_and_imports_nothing(
    server: BundleServer, bundle_path: Path, cold_env: Environment, root: Path
) -> None:
    url = server.put("/warm.bundle", tampered(bundle_path.read_bytes()))
    with pytest.raises(CorruptBundleError, match="nothing was imported"):
        await import_bundle(url, cold_env)
    assert await cold_env.namespaces() == []
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_cancelling_mid_download_leaves_nothing(
    server: BundleServer, big_bundle: Path, cold_env: Environment, root: Path
) -> None:
    body = big_bundle.read_bytes()
    url = server.put("/big.bundle", body)
    server.stall_after = len(body) // 2
    on_disk = 0
    with anyio.CancelScope() as scope:
        async with importing(url, cold_env) as progress:
            async for event in progress:
                assert isinstance(event, Downloading)
                if event.bytes_done >= 1 << 20:
                    on_disk = event.bytes_done
                    assert staging_left(root) != []  # the download is really on disk
                    scope.cancel()
    assert scope.cancelled_caught
    assert 0 < on_disk < len(body)
    assert staging_left(root) == []
    assert await cold_env.namespaces() == []


@pytest.mark.anyio
async def test_a_missing_bundle_is_a_clear_error_naming_the_url_without_its_password(
    server: BundleServer, cold_env: Environment, root: Path
) -> None:
    port = server.server_address[1]
    url = f"http://reader:s3cret@127.0.0.1:{port}/missing.bundle"
    with pytest.raises(DownloadError) as caught:
        await import_bundle(url, cold_env)
    message = str(caught.value)
    assert isinstance(caught.value, WarmenvError)
    assert f"http://***@127.0.0.1:{port}/missing.bundle" in message
    assert "404" in message and "s3cret" not in message
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_bundle_announced_over_the_cap_is_refused_before_it_is_read(
    server: BundleServer, big_bundle: Path, cold_env: Environment, root: Path
) -> None:
    url = server.put("/big.bundle", big_bundle.read_bytes())
    with pytest.raises(DownloadError, match="over the download limit"):
        await import_bundle(url, cold_env, download=DownloadOptions(max_bytes=1 << 20))
    assert staging_left(root) == []
    assert await cold_env.namespaces() == []


@pytest.mark.anyio
async def test_a_body_without_a_length_is_cut_off_at_the_cap(
    server: BundleServer, big_bundle: Path, cold_env: Environment, root: Path
) -> None:
    url = server.put("/big.bundle", big_bundle.read_bytes())
    server.send_length = False
    with pytest.raises(DownloadError, match="longer than the download limit"):
        await import_bundle(url, cold_env, download=DownloadOptions(max_bytes=1 << 20))
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_connection_that_keeps_dropping_fails_after_bounded_retries(
    server: BundleServer, bundle_path: Path, cold_env: Environment, root: Path
) -> None:
    body = bundle_path.read_bytes()
    url = server.put("/warm.bundle", body)
    server.honour_ranges = False  # every retry starts over, and drops again
    server.drop_after, server.drops_left = 100, 10
    with pytest.raises(DownloadError, match="failed after 3 attempts"):
        await import_bundle(url, cold_env, download=DownloadOptions(retries=2))
    assert len(server.seen) == 3
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_transient_server_error_is_retried(
    server: BundleServer, bundle_path: Path, cold_env: Environment, root: Path
) -> None:
    url = server.put("/warm.bundle", bundle_path.read_bytes())
    server.statuses = [503, 502]
    await import_bundle(url, cold_env, download=DownloadOptions(retries=2))
    assert [seen.status for seen in server.seen] == [503, 502, 200]
    assert await cold_env.namespaces() != []


@pytest.mark.anyio
async def test_https_to_a_plain_http_server_fails_at_once_suggesting_http(
    server: BundleServer, cold_env: Environment, root: Path
) -> None:
    # The TLS handshake is answered in plain text: the same on every try.
    url = server.put("/warm.bundle", b"never read").replace("http://", "https://")
    with pytest.raises(DownloadError) as imported:
        await import_bundle(url, cold_env, download=DownloadOptions(retries=5))
    assert server.connections == 1
    with pytest.raises(DownloadError) as checked:
        await preflight(url, download=DownloadOptions(retries=5))
    assert server.connections == 2
    for error in (imported.value, checked.value):
        message = str(error)
        assert "TLS handshake failed" in message and "use http:// instead of https://" in message
        assert "\n" not in message and "attempts" not in message
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_redirect_to_https_on_a_plain_http_port_blames_the_redirect(
    server: BundleServer, cold_env: Environment, root: Path
) -> None:
    url = server.put("/warm.bundle", b"never read")
    server.redirect_to = url.replace("http://", "https://")  # the same plain HTTP port
    with pytest.raises(DownloadError) as caught:
        await import_bundle(url, cold_env, download=DownloadOptions(retries=5))
    assert server.connections == 2  # the redirect, then one handshake answered in plain text
    message = str(caught.value)
    assert "where a redirect's target used https://" in message, message
    assert "instead of https://" not in message and "attempts" not in message
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_host_name_that_does_not_exist_fails_at_once(
    cold_env: Environment, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = "http://bundles.invalid/warm.bundle"  # RFC 2606: never resolves
    with caplog.at_level(logging.DEBUG, logger="httpcore"):
        with pytest.raises(DownloadError) as caught:
            await import_bundle(url, cold_env, download=DownloadOptions(retries=5))
    # httpcore says each connection attempt it starts; one, not six.
    started = [r for r in caplog.records if r.getMessage().startswith("connect_tcp.started")]
    assert len(started) == 1, [r.getMessage() for r in caplog.records]
    message = str(caught.value)
    assert message.startswith("http://bundles.invalid/warm.bundle: the host name could not be")
    assert "check the host in the URL" in message and "attempts" not in message
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_an_untrusted_certificate_fails_at_once(
    server: BundleServer,
    cold_env: Environment,
    root: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    made = self_signed_certificate(tmp_path / "tls")  # its CA is no one's trust
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(made.cert, made.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    url = server.put("/warm.bundle", b"never read").replace("http://", "https://")
    with caplog.at_level(logging.DEBUG, logger="httpcore"):
        with pytest.raises(DownloadError) as caught:
            await import_bundle(url, cold_env, download=DownloadOptions(retries=5))
    started = [r for r in caplog.records if r.getMessage().startswith("connect_tcp.started")]
    assert len(started) == 1
    message = str(caught.value)
    assert "TLS certificate was refused" in message and "attempts" not in message
    assert "certificate verify failed" in message, message
    assert staging_left(root) == []


def _serve_tls(server: BundleServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`server` made an HTTPS server, its self-signed certificate trusted (`SSL_CERT_FILE`)."""
    made = self_signed_certificate(tmp_path / "tls")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(made.cert, made.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(made.cert))


@pytest.mark.anyio
async def test_a_corrupt_tls_record_mid_body_is_resumed(
    server: BundleServer,
    big_bundle: Path,
    cold_env: Environment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The handshake passed and bytes came: what breaks now is the connection, not the set-up.
    _serve_tls(server, tmp_path, monkeypatch)
    url = server.put("/big.bundle", big_bundle.read_bytes()).replace("http://", "https://")
    server.drop_after, server.drops_left, server.garble = 1 << 20, 1, True
    report = await import_bundle(url, cold_env, download=DownloadOptions(retries=2))
    whole = [seen for seen in server.seen if seen.range is None or seen.status == 200]
    assert [(seen.status, seen.sent) for seen in whole] == [(200, 1 << 20)]
    assert server.seen[-1].range == f"bytes={1 << 20}-" and server.seen[-1].status == 206
    assert report.imported == 40


@pytest.mark.anyio
async def test_corrupt_tls_records_mid_body_fail_after_the_retries_naming_the_reason(
    server: BundleServer,
    big_bundle: Path,
    cold_env: Environment,
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _serve_tls(server, tmp_path, monkeypatch)
    url = server.put("/big.bundle", big_bundle.read_bytes()).replace("http://", "https://")
    server.honour_ranges = False  # every retry starts over, and is garbled again
    server.drop_after, server.drops_left, server.garble = 1 << 20, 10, True
    with pytest.raises(DownloadError) as caught:
        await import_bundle(url, cold_env, download=DownloadOptions(retries=2))
    assert [(seen.status, seen.sent) for seen in server.seen] == [(200, 1 << 20)] * 3
    message = str(caught.value)
    assert "failed after 3 attempts" in message and "handshake" not in message, message
    assert "SSLError" in message and "[SSL" in message, message
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_download_that_is_not_a_bundle_is_refused(
    server: BundleServer, cold_env: Environment, root: Path
) -> None:
    url = server.put("/page.html", b"<html>not a bundle</html>")
    with pytest.raises(NotABundleError, match=r"page\.html"):
        await import_bundle(url, cold_env)
    assert staging_left(root) == []


# --- what a body that is not a bundle is, said as by path (`bundle/_kinds.py`) ----------

_LFS = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    b"size 12345\n"
)
# (the body, what the line says it is)
_BODIES = {
    "error-page": (b"<!DOCTYPE html><title>404</title>", "is an HTML or XML page"),
    "listing": (
        b'<!DOCTYPE HTML>\n<html lang="en">\n<head>\n<title>Directory listing for /</title>',
        "is an HTML or XML page",
    ),
    "bom-page": (b"\xef\xbb\xbf<html><body>gone</body></html>", "is an HTML or XML page"),
    "head-page": (b"<head><title>502</title></head>", "is an HTML or XML page"),
    "gzip": (gzip.compress(b"SQLite format 3\x00" + bytes(4080)), "is a gzip file"),
    "json-object": (b'{"error": "not found"}', "is a JSON document"),
    "json-list": (b'\xef\xbb\xbf\n  ["a.bundle", "b.bundle"]', "is a JSON document"),
    "lfs-pointer": (_LFS, "is a Git LFS pointer"),
}


async def _refusal(source: str | Path, env: Environment) -> str:
    with pytest.raises(NotABundleError) as caught:
        await import_bundle(source, env)
    return str(caught.value)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", sorted(_BODIES))
async def test_a_body_that_is_not_a_bundle_is_named_alike_by_url_and_by_path(
    server: BundleServer, cold_env: Environment, tmp_path: Path, kind: str
) -> None:
    body, says = _BODIES[kind]
    path = tmp_path / f"{kind}.bundle"
    path.write_bytes(body)
    url = server.put(f"/{kind}.bundle", body)
    by_path = await _refusal(path, cold_env)
    by_url = await _refusal(url, cold_env)
    assert by_path.startswith(f"{path} {says}, not a warmenv bundle"), by_path
    assert by_url == by_path.replace(str(path), url)
    assert "\n" not in by_url


@pytest.mark.anyio
async def test_a_git_lfs_pointer_says_to_pull_the_file(
    cold_env: Environment, tmp_path: Path
) -> None:
    path = tmp_path / "h100.bundle"
    path.write_bytes(_LFS)
    assert (await _refusal(path, cold_env)).endswith("git lfs pull")


@pytest.mark.anyio
async def test_a_body_of_nothing_known_says_to_check_the_url(
    server: BundleServer, cold_env: Environment
) -> None:
    url = server.put("/odd.bundle", b"\x00\x01 nothing warmenv knows" * 40)
    assert (await _refusal(url, cold_env)).endswith("check the URL")


# --- preflight by URL --------------------------------------------------------------


@pytest.mark.anyio
async def test_preflight_of_a_flat_bundle_reads_only_its_header(
    server: BundleServer, big_bundle: Path
) -> None:
    body = big_bundle.read_bytes()
    url = server.put("/big.bundle", body)
    by_url = await preflight(url, version="1")
    assert by_url == await preflight(big_bundle, version="1")
    assert all(s.range is not None for s in server.seen)
    assert sum(s.sent for s in server.seen) < len(body) // 10


@pytest.mark.anyio
async def test_preflight_by_url_refuses_a_huge_manifest_length_from_the_first_range(
    server: BundleServer, bundle_path: Path, bundle_format: str
) -> None:
    # Before the limit, a length field claiming 4 GiB made preflight ask for ever
    # larger ranges and then for the whole file, to call it truncated at the end.
    body = bundle_path.read_bytes()
    if bundle_format == "flat":
        body = body[:12] + (0xFFFFFFF0).to_bytes(4, "little") + body[16:]
    else:  # a SQLite bundle's header is not read by range: only the flat one has a field
        body = b"WARMENV\x01" + (2).to_bytes(4, "little") + (0xFFFFFFF0).to_bytes(4, "little")
    url = server.put("/claims.bundle", body)
    with pytest.raises(InvalidManifestError, match="4,294,967,280 bytes, over the"):
        await preflight(url)
    assert len(server.seen) == 1 and server.seen[0].range is not None


@pytest.mark.anyio
async def test_preflight_of_named_namespaces_by_url_counts_the_entries_downloaded(
    server: BundleServer, bundle_path: Path, root: Path
) -> None:
    # A flat bundle's header names its namespaces without counting their
    # entries, so naming namespaces downloads the bundle whole.
    url = server.put("/warm.bundle", bundle_path.read_bytes())
    named = ["app/1/kernels", "app/2/kernels"]
    by_url = await preflight(url, namespaces=named)
    assert by_url == await preflight(bundle_path, namespaces=named)
    assert by_url.would_hit == ("app/1/kernels",)
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_preflight_downloads_what_it_cannot_read_by_range(
    server: BundleServer, bundle_path: Path, root: Path
) -> None:
    url = server.put("/warm.bundle", bundle_path.read_bytes())
    server.honour_ranges = False
    assert await preflight(url, version="1") == await preflight(bundle_path, version="1")
    assert staging_left(root) == []


# --- the command line --------------------------------------------------------------


@pytest.mark.anyio
async def test_the_command_line_imports_a_bundle_by_url(
    server: BundleServer, bundle_path: Path, tmp_path: Path
) -> None:
    url = server.put("/warm.bundle", bundle_path.read_bytes())
    command = [sys.executable, "-m", "warmenv", "import", url, "--env", "fresh", "--json"]
    completed = await anyio.run_process([*command, "--root", str(tmp_path / "cli-root")])
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["imported"] == TOTAL
    async with open_environment("fresh", root=tmp_path / "cli-root") as env:
        assert await env_contents(env) == sample_entries()


def test_the_command_line_names_a_missing_url_and_creates_nothing(
    server: BundleServer, tmp_path: Path
) -> None:
    url = f"http://user:pw@127.0.0.1:{server.server_address[1]}/nope.bundle"
    completed = subprocess.run(
        [sys.executable, "-m", "warmenv", "import", url, "--root", str(tmp_path / "cli-root")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 1
    assert "404" in completed.stderr and "pw@" not in completed.stderr
    assert "Traceback" not in completed.stderr
    assert not (tmp_path / "cli-root").exists()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_download_leaves_nothing_behind(
    server: BundleServer, tmp_path: Path, signum: int, status: int, backend: str
) -> None:
    body = os.urandom(4 << 20)  # never imported: the command is stopped mid-body
    url = server.put("/big.bundle", body)
    server.stall_after = len(body) // 2
    root = tmp_path / "cli-root"
    process = subprocess.Popen(
        [sys.executable, "-m", "warmenv", "import", url, "--env", "fresh", "--root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WARMENV_CLI_BACKEND": backend},
    )
    try:
        assert server.stalled.wait(timeout=60)  # half the body is out: the download is under way
        assert [p.name for p in root.glob(".warmenv-import.*")] != []
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == status, err
    assert "Traceback" not in err
    assert not root.exists(), sorted(str(p) for p in root.rglob("*"))


# --- a server that ignores Range -----------------------------------------------------


@pytest.fixture
async def huge_bundle(tmp_path: Path) -> Path:
    """About 24 MiB of values: more than loopback's buffers take before the reader reads."""
    return await flat_bundle_of(tmp_path, "huge", 240)


@pytest.mark.anyio
async def test_a_stale_bundle_is_refused_from_the_head_of_a_response_that_ignored_range(
    server: BundleServer, huge_bundle: Path, cold_env: Environment
) -> None:
    body = huge_bundle.read_bytes()
    url = server.put("/huge.bundle", body)
    server.honour_ranges = False
    with pytest.raises(StaleBundleError):
        await import_bundle(url, cold_env, version="2")
    (only,) = server.seen
    assert only.status == 200
    assert only.sent < len(body)


@pytest.mark.anyio
async def test_a_response_that_ignored_range_is_read_on_as_the_body(
    server: BundleServer, big_bundle: Path, cold_env: Environment, root: Path
) -> None:
    url = server.put("/big.bundle", big_bundle.read_bytes())
    server.honour_ranges = False
    report = await import_bundle(url, cold_env, version="big")
    assert report.imported == 40
    (only,) = server.seen
    assert only.status == 200
    assert (
        len(await cold_env.storage("app/big/1").get_many([b"k%03d" % i for i in range(40)])) == 40
    )
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_server_s_header_quoted_in_a_download_error_is_cut_short_and_escaped(
    server: BundleServer, bundle_path: Path, env: Environment
) -> None:
    server.headers["Content-Encoding"] = "\x1b[2J" + "x" * 8000
    url = server.put("/b.bundle", bundle_path.read_bytes())
    with pytest.raises(DownloadError) as failed:
        await import_bundle(url, env)
    message = str(failed.value)
    assert "content-encoding '\\x1b[2jxxx" in message, message  # lowered, as compared
    assert "... (7,807 more characters)'; serve it as is" in message, message
    assert len(message) < 600 and "\x1b" not in message, message
