"""Bundles by URL: fetch a bundle over HTTP(S) into a private staging file, then import it.

A download is an import's private copy made over the network instead of
from a local file: the body is streamed straight into a file in the same
private (0700) directory beside the environment that `warmenv.bundle._files`
makes for a copy, and that file is then opened as the private bundle (no
second copy). What was verified is what is imported, as for a path: the
digest check runs on the downloaded file before anything is committed.

A dropped connection resumes where it stopped with an HTTP `Range` request,
but only while the server's validator (a strong ETag, else Last-Modified)
is unchanged, through `If-Range`: a file replaced on the server meanwhile is
fetched again from its start rather than spliced from two versions.
Retries are bounded (and a failure no retry can mend, a refused TLS
handshake or an unknown host, is not retried: `warmenv.bundle._http_errors`),
the body is capped (a `Content-Length` over the cap is refused before a byte
is read, and a body that outgrows its announced length or the cap is cut
off), and every wait is bounded from outside: each read by the timeout, a
response's head by the timeout too (an endless run of `100 Continue`, or
headers sent a byte at a time, would pass every read's), the body by a
minimum rate, and the whole download, retries and all, by an overall
deadline. What httpx and httpcore log about a download is redacted
(`warmenv.bundle._http_logs`). A redirect is followed to another origin
(scheme, host, port) without the caller's headers, unless the caller allows
them there. A download that fails, is cancelled or is interrupted removes
its staging directory; one whose process was killed is removed by the next
import beside the same environment (the directory names the process).

httpx is the client: it runs on anyio, so one code path serves asyncio,
uvloop and trio. It is an optional dependency (the `http` extra), imported
only when a URL is given.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack, aclosing
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

import anyio
import anyio.to_thread
import attrs

from warmenv._errors import WarmenvError
from warmenv._install import install_hint
from warmenv._text import brief, plural
from warmenv._url import bundle_url_problem, redact, redact_in
from warmenv.bundle import _files
from warmenv.bundle._http_errors import lasting, tls_error
from warmenv.bundle._http_headers import content_range, int_header, range_validator
from warmenv.bundle._http_logs import redact_client_logs, status_line
from warmenv.bundle.base import Header
from warmenv.bundle.events import Downloading
from warmenv.bundle.flat.bundle import FlatBundle
from warmenv.bundle.formats import sniff
from warmenv.bundle.open import open_private_file
from warmenv.bundle.sqlite.bundle import SqliteBundle

if TYPE_CHECKING:
    import httpx

__all__ = ["DownloadError", "DownloadOptions", "Opened"]

_FLUSH_BYTES = 1 << 20  # written to disk (and reported) at least every MiB...
_FLUSH_SECONDS = 0.25  # ...or this often on a slow link
_HEAD_FIRST = 64 << 10  # the first range a preflight asks for
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_STAGED_NAME = "bundle.download"


class DownloadError(WarmenvError):
    """A bundle named by URL could not be downloaded; nothing was left behind."""


def _headers(value: Mapping[str, str] | tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)


@attrs.frozen
class DownloadOptions:
    """How a bundle is fetched by URL: limits, patience and extra request headers.

    `max_bytes` caps the body (a server announcing more is refused before
    the download starts); `timeout` bounds each connect, read and write in
    seconds, and the wait for each response's head; `retries` bounds the
    reconnections after a dropped connection, a transient server error or a
    body slower than `min_rate` (each resumes with `Range` when it may).
    `min_rate` is the slowest body accepted, in bytes per second averaged
    over each `timeout` seconds (0: no minimum); `deadline` bounds the whole
    download in seconds, retries included (`None`: no bound).
    `headers` are sent with every request (an `Authorization` header for a
    private bundle server, say); they are never printed, and a redirect to
    another origin (scheme, host or port) is followed without them unless
    `cross_origin_headers` is true.
    """

    max_bytes: int = 16 << 30
    timeout: float = 30.0
    retries: int = 5
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_headers)
    min_rate: int = 1024
    deadline: float | None = 3600.0
    cross_origin_headers: bool = False

    def __attrs_post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {self.max_bytes}")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be positive, not {self.timeout}")
        if self.retries < 0:
            raise ValueError(f"retries must be 0 or more, not {self.retries}")
        if self.min_rate < 0:
            raise ValueError(f"min_rate must be 0 or more, not {self.min_rate}")
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline must be positive or None, not {self.deadline}")


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise DownloadError(
            f"importing a bundle by URL needs httpx; install it with: {install_hint('http')}"
        ) from None
    return httpx


class _Retry(Exception):
    """A transient failure: reconnect (within the retry budget)."""


@final
class _Deadline:
    """The overall bound of one download (or preflight read), and the rate the body must keep."""

    def __init__(self, label: str, options: DownloadOptions) -> None:
        self.label = label
        self.options = options
        limit = options.deadline
        self.at = float("inf") if limit is None else anyio.current_time() + limit

    def left(self) -> float:
        """Seconds left before the deadline; `DownloadError` once it has passed."""
        left = self.at - anyio.current_time()
        if left <= 0:
            raise self.passed()
        return left

    def passed(self) -> DownloadError:
        return DownloadError(
            f"{self.label}: the download did not finish within its deadline of "
            f"{self.options.deadline:g} s; raise DownloadOptions.deadline if the bundle is "
            "that large or the link that slow"
        )

    async def send(self, client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
        """`request` sent, its response's head read within the timeout (and the deadline)."""
        patience = self.options.timeout
        with anyio.move_on_after(min(patience, self.left())):
            return await client.send(request, stream=True)
        if anyio.current_time() >= self.at:
            raise self.passed()
        raise _Retry(f"the server sent no whole response head within {patience:g} s")


@final
class _Body:
    """A response body read chunk by chunk, which can be left before its end.

    httpx streams through a chain of async generators; closing the outer
    one leaves the inner ones to the garbage collector (trio warns about
    each). Stopping instead cancels the next read, so the cancellation
    runs through the whole chain and every generator finishes.

    Each read ends by the deadline; and over each `timeout` seconds the
    body must average `min_rate` bytes per second (each read's own timeout
    would let a byte every few seconds run for days).
    """

    def __init__(self, response: httpx.Response, deadline: _Deadline) -> None:
        self._chunks = response.aiter_raw()
        self._stopping = False
        self._deadline = deadline
        self._window_start = anyio.current_time()
        self._window_bytes = 0

    async def next(self) -> bytes | None:
        """The next chunk, `None` at the end (or once stopped)."""
        with anyio.CancelScope() as scope:
            if self._stopping:
                scope.cancel()
            else:
                scope.deadline = self._deadline.at
            try:
                chunk = await anext(self._chunks, None)
            except ssl.SSLError as exc:  # httpcore wraps it on trio, not through anyio's TLS
                raise _Retry("the connection broke") from exc  # mid-body: retried
        if scope.cancelled_caught:
            if self._stopping:
                return None
            raise self._deadline.passed()
        if chunk is not None:
            self._check_rate(len(chunk))
        return chunk

    def _check_rate(self, size: int) -> None:
        options = self._deadline.options
        self._window_bytes += size
        elapsed = anyio.current_time() - self._window_start
        if elapsed < options.timeout:
            return
        if self._window_bytes < options.min_rate * elapsed:
            raise _Retry(
                f"the server sent {self._window_bytes:,} bytes in {elapsed:.1f} s, under the "
                f"minimum rate of {options.min_rate:,} bytes/s (DownloadOptions.min_rate)"
            )
        self._window_start += elapsed
        self._window_bytes = 0

    async def stop(self) -> None:
        """Abandon the rest of the body (the connection is dropped); idempotent."""
        self._stopping = True
        try:
            while await self.next() is not None:
                pass
        except Exception:  # the transport's complaint about the cut is no news
            pass


def _client(lib: Any, url: str, options: DownloadOptions) -> httpx.AsyncClient:
    """The client for one download: the caller's headers go only to the origin of `url`."""
    guard = [] if options.cross_origin_headers else [_origin_guard(lib, url, options)]
    try:
        client: httpx.AsyncClient = lib.AsyncClient(
            timeout=lib.Timeout(options.timeout),
            follow_redirects=True,
            headers=dict(options.headers),
            event_hooks={"request": guard},
        )
    except lib.InvalidURL:  # the one URL parsed here is a proxy's: not quoted, it holds secrets
        raise DownloadError(
            f"{redact(url)}: the proxy URL in HTTP_PROXY, HTTPS_PROXY or ALL_PROXY is invalid"
        ) from None
    # After the client is made: its transport imports httpcore, whose loggers it makes.
    redact_client_logs()  # httpx's INFO line names the URL as sent, credentials and all
    return client


def _origin_guard(httpx: Any, url: str, options: DownloadOptions) -> Any:
    """A request hook removing the caller's headers from a request to another origin.

    httpx drops only `Authorization` on a cross-origin redirect; a token in
    `X-Api-Key` (or any header) would follow the redirect anywhere. Those the
    download sets itself (`Range`, `If-Range`, `Accept-Encoding`) stay.
    """
    origin = _origin(httpx.URL(url))
    names = {name.lower() for name, _ in options.headers} - _OURS

    async def guard(request: httpx.Request) -> None:
        if names and _origin(request.url) != origin:
            for name in names:
                request.headers.pop(name, None)

    return guard


_OURS = frozenset({"range", "if-range", "accept-encoding"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return (url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme))


def _checked(url: str) -> str:
    """`url` if it can name a bundle to download, else `DownloadError` saying why."""
    problem = bundle_url_problem(url)
    if problem is not None:
        raise DownloadError(problem)
    return url


def _refused(label: str, exc: BaseException, url: str) -> DownloadError:
    """A failure no retry can mend: a redirect loop, an unsupported protocol, a bad URL."""
    if isinstance(exc, _httpx().TooManyRedirects):
        return DownloadError(
            f"{label}: the server redirected too many times (a redirect loop?: "
            f"{_reason(exc, url)}); check the URL"
        )
    return DownloadError(f"{label}: {_reason(exc, url)}; check the URL")


def _lasting(label: str, exc: BaseException, url: str) -> DownloadError | None:
    """The error for a failure no retry can mend (`_http_errors`), else `None`: a redirect
    to a malformed Location (not quoted: it may hold a secret), or a failure to connect."""
    httpx = _httpx()
    if isinstance(exc, httpx.RemoteProtocolError) and isinstance(exc.__context__, httpx.InvalidURL):
        return DownloadError(
            f"{label}: the server redirected to an invalid Location; check the URL"
        )
    if not isinstance(exc, httpx.ConnectError) or (found := lasting(exc, url)) is None:
        return None
    return DownloadError(f"{label}: {found.what} ({_reason(found.cause, url)}); {found.fix}")


@final
class Opened:
    """A whole body sent in answer to a preflight's `Range` request, read as far as its head.

    The download reads on from it (the bytes already read first), so a server
    that ignores ranges is asked once; `aclose()` drops it (a refused bundle's
    body is never read further). Its deadline is the download's too.
    """

    def __init__(
        self,
        stack: AsyncExitStack,
        client: httpx.AsyncClient,
        response: httpx.Response,
        body: _Body,
        head: bytes,
        deadline: _Deadline,
    ) -> None:
        self.client = client
        self.response = response
        self.body = body
        self.head = head
        self.deadline = deadline
        self._stack = stack

    async def aclose(self) -> None:
        """Drop the rest of the body and the connection (idempotent)."""
        with anyio.CancelScope(shield=True):
            await self.body.stop()
            await self.response.aclose()
            await self._stack.aclose()


@final
class Download:
    """One bundle fetched into a private staging file, then opened as the private bundle.

    `fetch()` yields `Downloading` events while the body streams to disk;
    `open()` then hands the file to the reader of its format, which owns it
    from there (closing the bundle removes it). If anything fails before
    `open()` succeeds, the staging directory is removed.
    """

    def __init__(
        self,
        url: str,
        near: Path | None,
        options: DownloadOptions | None,
        opened: Opened | None = None,
    ) -> None:
        self.url = url
        self.label = redact(url)
        _checked(url)
        self._near = near
        self._options = options or DownloadOptions()
        self._path: Path | None = None
        self._fd: int | None = None
        self._done = 0  # bytes on disk
        self._total: int | None = None
        self._validator: tuple[str, str] | None = None  # (If-Range value, header it came from)
        self._started_at = 0.0
        self._deadline: _Deadline | None = None
        self._opened = opened  # the first attempt's response, already begun (`read_head`)

    async def fetch(self) -> AsyncGenerator[Downloading, None]:
        """Stream the body to the staging file, yielding progress; resumes, retries, cleans up."""
        httpx = _httpx()
        self._started_at = time.perf_counter()
        opened = self._opened
        self._deadline = _Deadline(self.label, self._options) if opened is None else opened.deadline
        try:
            directory = await anyio.to_thread.run_sync(_files.private_directory, self._near)
            self._path = directory / _STAGED_NAME
            self._fd = await anyio.to_thread.run_sync(_files.create_private, self._path)
            try:
                async with AsyncExitStack() as stack:
                    if opened is None:
                        client = await stack.enter_async_context(
                            _client(httpx, self.url, self._options)
                        )
                    else:
                        stack.push_async_callback(opened.aclose)
                        client = opened.client
                    async with aclosing(self._attempts(httpx, client)) as events:
                        async for event in events:
                            yield event
            finally:
                fd, self._fd = self._fd, None
                os.close(fd)
        except BaseException:
            await self.discard()
            raise

    async def open(self) -> FlatBundle | SqliteBundle:
        """The downloaded file opened and validated as a private bundle; it owns the file."""
        path = self._path
        if path is None:
            raise RuntimeError("open() before fetch() completed")
        try:
            return await open_private_file(path, self.label, downloaded=True)
        except BaseException:
            await self.discard()
            raise

    async def release(self) -> None:
        """Drop the response handed over by `read_head`, if it was never read (idempotent)."""
        opened, self._opened = self._opened, None
        if opened is not None:
            await opened.aclose()

    async def discard(self) -> None:
        """Remove the staging directory and whatever is in it (idempotent)."""
        await self.release()
        path, self._path = self._path, None
        if path is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_files.remove_private, path)

    async def _attempts(
        self, httpx: Any, client: httpx.AsyncClient
    ) -> AsyncGenerator[Downloading, None]:
        failures = 0
        assert self._deadline is not None
        while True:
            try:
                async with aclosing(self._attempt(httpx, client)) as events:
                    async for event in events:
                        yield event
                return
            except (httpx.TooManyRedirects, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                raise _refused(self.label, exc, self.url) from None
            except (httpx.TransportError, ssl.SSLError, _Retry) as exc:
                if (error := _lasting(self.label, exc, self.url)) is not None:
                    raise error from None
                failures += 1
                if failures > self._options.retries:
                    raise DownloadError(
                        f"{self.label}: the download failed after {plural(failures, 'attempt')} "
                        f"({_reason(exc, self.url)}); check the server and the network, "
                        "then retry"
                    ) from None
                if self._validator is None and self._done:
                    await self._restart()  # nothing proves the rest would match: start over
                yield self._event()
                await anyio.sleep(min(0.05 * 2**failures, 2.0, self._deadline.left()))

    async def _attempt(
        self, httpx: Any, client: httpx.AsyncClient
    ) -> AsyncGenerator[Downloading, None]:
        headers = {"Accept-Encoding": "identity"}
        resuming = self._done > 0 and self._validator is not None
        if resuming:
            assert self._validator is not None
            headers["Range"] = f"bytes={self._done}-"
            headers["If-Range"] = self._validator[0]
        assert self._deadline is not None
        opened, self._opened = self._opened, None
        if opened is None:
            request = client.build_request("GET", self.url, headers=headers)
            response = await self._deadline.send(client, request)
        else:
            response = opened.response
        try:
            if response.status_code == 206 and resuming:
                self._check_resumed(response)
            elif response.status_code == 200:
                await self._begin(response)
            elif response.status_code in _RETRY_STATUSES:
                raise _Retry(f"the server answered {status_line(response.status_code)}")
            else:
                hint = "check the URL" if response.status_code in (404, 410) else "nothing was kept"
                raise DownloadError(
                    f"{self.label}: the server answered {status_line(response.status_code)}; {hint}"
                )
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding != "identity":
                raise DownloadError(
                    f"{self.label}: the server sent the bundle with content-encoding "
                    f"'{brief(encoding)}'; serve it as is (bundles are not compressed in transit)"
                )
            yield self._event()
            head, body = (b"", None) if opened is None else (opened.head, opened.body)
            async for event in self._receive(response, body, head):
                yield event
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
        if self._total is not None and self._done != self._total:
            raise _Retry(f"the body ended after {self._done} of {self._total} bytes")

    async def _begin(self, response: httpx.Response) -> None:
        """A whole body is coming: start the file over and note its size and validator."""
        if self._done:
            await self._restart()
        self._total = int_header(response.headers, "content-length")
        self._check_size(self._total)
        self._validator = range_validator(response.headers)

    def _check_resumed(self, response: httpx.Response) -> None:
        assert self._validator is not None
        value, header = self._validator
        if response.headers.get(header) not in (None, value):
            self._validator = None  # so the next attempt starts over
            raise _Retry("the file changed on the server while resuming")
        start, total = content_range(response.headers.get("content-range", ""))
        if start != self._done or (self._total is not None and total != self._total):
            raise DownloadError(
                f"{self.label}: the server resumed at the wrong place (asked for byte "
                f"{self._done}, got '{brief(response.headers.get('content-range', ''))}'); nothing "
                "was kept"
            )

    def _check_size(self, size: int | None) -> None:
        cap = self._options.max_bytes
        if size is not None and size > cap:
            raise DownloadError(
                f"{self.label}: the bundle is {size:,} bytes, over the download limit of "
                f"{cap:,} bytes; raise DownloadOptions.max_bytes if it is expected"
            )

    async def _receive(
        self, response: httpx.Response, body: _Body | None, head: bytes
    ) -> AsyncGenerator[Downloading, None]:
        """Write the body to the file: `head` (read already from `body`, if given) first."""
        assert self._fd is not None
        fd = self._fd
        limit = self._options.max_bytes if self._total is None else self._total
        pending = bytearray(head)
        flushed_at = time.monotonic()
        assert self._deadline is not None
        body = _Body(response, self._deadline) if body is None else body
        chunk: bytes | None = b""
        try:
            while chunk is not None:
                pending += chunk
                if self._done + len(pending) > limit:
                    raise DownloadError(
                        f"{self.label}: the body is longer than "
                        + (
                            f"the {limit:,} bytes the server announced"
                            if self._total is not None
                            else f"the download limit of {limit:,} bytes"
                        )
                        + "; nothing was kept"
                    )
                now = time.monotonic()
                if len(pending) >= _FLUSH_BYTES or now - flushed_at >= _FLUSH_SECONDS:
                    await self._write(fd, pending)
                    pending.clear()
                    flushed_at = now
                    yield self._event()
                chunk = await body.next()
        finally:
            with anyio.CancelScope(shield=True):
                await body.stop()
                # What arrived before a dropped connection is good: keep it to resume from.
                if pending:
                    await self._write(fd, pending)
        yield self._event()

    async def _write(self, fd: int, data: bytearray) -> None:
        await anyio.to_thread.run_sync(_files.pwrite_all, fd, bytes(data), self._done)
        self._done += len(data)

    async def _restart(self) -> None:
        assert self._fd is not None
        await anyio.to_thread.run_sync(os.ftruncate, self._fd, 0)
        self._done = 0

    def _event(self) -> Downloading:
        return Downloading(self._done, self._total, time.perf_counter() - self._started_at)


async def read_head(
    url: str, options: DownloadOptions | None
) -> tuple[Header | None, Opened | None]:
    """A bundle's manifest (and namespace names, where told up front), read by `Range`
    from the file's start, before its body; and the response to read on, if the server
    sent the whole file instead (or `None`).

    Each further range asks only for the bytes after those already read, and
    only of the same file (`If-Range` on its validator; a server without one
    gets one range at most). The header is `None` when that is not possible
    (the file changed meanwhile, or what the format keeps up front is not all
    within its `header_limit`): the caller downloads the whole file instead.
    A server that ignores ranges answers the first with the whole file: its
    head is read from that response, which is handed back open (`Opened`),
    for the download to read on or for the caller to close.
    """
    httpx = _httpx()
    options = options or DownloadOptions()
    label = redact(url)
    _checked(url)
    deadline = _Deadline(label, options)
    want = _HEAD_FIRST
    data = bytearray()
    validator: str | None = None
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(_client(httpx, url, options))
        while True:
            headers = {"Range": f"bytes={len(data)}-{want - 1}", "Accept-Encoding": "identity"}
            if validator is not None:
                headers["If-Range"] = validator
            request = client.build_request("GET", url, headers=headers)
            whole: Opened | None = None
            try:
                response = await deadline.send(client, request)
                body = _Body(response, deadline)
                try:
                    if response.status_code == 200:
                        if data:
                            return None, None  # the file changed: read it all
                        # The client outlives this block: the download reads on with it.
                        whole = Opened(stack.pop_all(), client, response, body, b"", deadline)
                        return await _head_of_whole(whole, label)
                    if response.status_code != 206:
                        raise DownloadError(
                            f"{label}: the server answered {status_line(response.status_code)}; "
                            + ("check the URL" if response.status_code in (404, 410) else "retry")
                        )
                    start, size = content_range(response.headers.get("content-range", ""))
                    if start != len(data):
                        return None, None  # not the range asked for: read it all
                    while len(data) < want and (chunk := await body.next()) is not None:
                        data += chunk  # a server sending more than asked is not read on
                    proof = range_validator(response.headers)
                    validator = None if proof is None else proof[0]
                finally:
                    if whole is None:
                        with anyio.CancelScope(shield=True):
                            await body.stop()
                            await response.aclose()
            except (httpx.TooManyRedirects, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                raise _refused(label, exc, url) from None
            except _Retry as exc:
                raise DownloadError(f"{label}: {_reason(exc, url)}; check the server") from None
            except (httpx.TransportError, ssl.SSLError) as exc:
                raise _lasting(label, exc, url) or DownloadError(
                    f"{label}: {_reason(exc, url)}; check the URL and the network"
                ) from None
            found = sniff(bytes(data))
            if found is None or not found.header_in_front:
                return None, None
            # On a worker thread: reading a SQLite bundle's first pages is SQLite's work.
            parsed = await anyio.to_thread.run_sync(found.header, bytes(data[:want]), label)
            if parsed is not None:
                return parsed, None
            whole_file = len(data) < want or (size is not None and want >= size)
            if whole_file or want >= found.header_limit or validator is None:
                return None, None  # the whole file was given, or more is not worth it
            want = min(want * 4, found.header_limit)


async def _head_of_whole(whole: Opened, label: str) -> tuple[Header | None, Opened]:
    """The header read from the start of a whole body, as far as its format keeps it
    (`header_limit`); `whole` keeps what was read, and is handed back open (closed,
    with its client, if reading fails)."""
    data = bytearray()
    want = _HEAD_FIRST
    try:
        while True:
            while len(data) < want and (chunk := await whole.body.next()) is not None:
                data += chunk
            whole.head = bytes(data)
            found = sniff(whole.head)
            if found is None or not found.header_in_front:
                return None, whole
            parsed = await anyio.to_thread.run_sync(found.header, whole.head[:want], label)
            if parsed is not None or len(data) < want or want >= found.header_limit:
                return parsed, whole
            want = min(want * 4, found.header_limit)
    except BaseException:
        await whole.aclose()
        raise


def _reason(exc: BaseException, url: str) -> str:
    """`exc` in a few words: a client's message may quote `url`, so it is redacted."""
    exc = tls_error(exc) or exc
    text = brief(" ".join(redact_in(str(exc), url).split()))
    kind = type(exc).__name__
    return f"{kind}: {text}" if text and not isinstance(exc, _Retry) else (text or kind)
