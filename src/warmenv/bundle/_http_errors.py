"""Which failures of a download no retry can mend, and what to tell the caller instead.

A download retries what may pass: a dropped connection, a timeout, a 5xx,
a resolver that could not answer this time. Some failures come out the same
however often they are tried, and retrying them only made the caller wait
(six attempts, 8-10 s by default) for the same line, with advice that did not
fit: a TLS handshake the server refuses (an `https://` URL naming a plain
HTTP port, a certificate that is not trusted) and a host name the resolver
says does not exist. Those are read here from the exception's chain, where
httpcore keeps the `ssl.SSLError` or `socket.gaierror` it wrapped (on asyncio
directly, on trio under `trio.BrokenResourceError`, whose own text is empty).
Only a failure to connect (`httpx.ConnectError`, the handshake included) may
be lasting: a TLS error once the response has begun (a corrupt record, an
alert) broke that connection only, and is retried like any dropped one.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from typing import Final, final

import attrs

__all__ = ["Lasting", "lasting", "tls_error"]

# What OpenSSL says when the server answers a TLS handshake in plain text (an HTTP server).
_PLAIN_TEXT_REASONS: Final = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE"})


@final
@attrs.frozen
class Lasting:
    """A failure no retry can mend: what failed, the error that says why, and the fix."""

    what: str
    cause: BaseException
    fix: str


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it was raised from or during, in turn (httpcore suppresses the
    context it wraps, so suppressed contexts are followed too)."""
    cause: BaseException | None = exc
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or cause.__context__


def lasting(exc: BaseException, url: str) -> Lasting | None:
    """What in the chain of `exc`, a failure to connect to `url` or where it redirected,
    no retry can mend; `None` if nothing does (retry it)."""
    for cause in _chain(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            fix = "check the URL's host and the server's certificate"
            return Lasting("the server's TLS certificate was refused", cause, fix)
        # An EOF in the handshake is a connection dropped: that may pass.
        if isinstance(cause, ssl.SSLError) and not isinstance(
            cause, ssl.SSLEOFError | ssl.SSLZeroReturnError
        ):
            fix = "check the server's TLS set-up"
            if cause.reason in _PLAIN_TEXT_REASONS:
                fix = (
                    "the server answered in plain text: if it serves plain HTTP, use http:// "
                    "instead of https://"
                    if url.lower().startswith("https:")
                    else "the server answered in plain text where a redirect's target used "
                    "https://; check the server's redirects"
                )
            return Lasting("the TLS handshake failed", cause, fix)
        if isinstance(cause, socket.gaierror) and cause.errno != socket.EAI_AGAIN:
            return Lasting(
                "the host name could not be resolved", cause, "check the host in the URL"
            )
    return None


def tls_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error that `exc` was raised from, if any: what to print (on trio, httpx's
    `ReadError` over it says nothing itself)."""
    return next((cause for cause in _chain(exc) if isinstance(cause, ssl.SSLError)), None)
