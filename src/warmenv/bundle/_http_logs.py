"""What the HTTP client logs about our downloads carries no secret.

httpx logs every request at INFO with its URL as sent (`HTTP Request: GET
https://user:pw@host/b?token=...`), and httpcore, at DEBUG, every
response's headers (a redirect's `Location` to a signed URL, a
`Set-Cookie`). Both name URLs we were given or were redirected to, which
carry credentials as often as not. So every logger of the two libraries
gets one filter that rewrites a record before any handler sees it: each
URL in it redacted by `warmenv._url.redact` (the one rule), and each
response header's value hidden unless it is one known to say nothing
secret (its length, type, validators and the like); a `Location` is kept
redacted, since where a download was sent is what a reader debugs.

A filter on a logger applies to the records logged on that logger only,
not on its children, so it is added to each of theirs, again whenever a
client is made (httpcore makes some of its loggers when first used).
"""

from __future__ import annotations

import logging
import re
from typing import Final

from warmenv._url import redact, redact_urls_in

__all__ = ["redact_client_logs"]

_LIBRARIES: Final = ("httpx", "httpcore")
# Response headers whose values say nothing secret, kept in httpcore's DEBUG lines.
_PLAIN: Final = frozenset(
    {
        "accept-ranges",
        "age",
        "cache-control",
        "connection",
        "content-encoding",
        "content-length",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expires",
        "keep-alive",
        "last-modified",
        "server",
        "transfer-encoding",
        "vary",
    }
)
_LOCATIONS: Final = frozenset({"location", "content-location"})
# A header as httpcore logs it: a tuple of two bytes reprs, (b'Name', b'value').
_HEADER: Final = re.compile(r"""\(b(['"])([^'"\\]*)\1, b(['"])((?:\\.|(?!\3).)*)\3\)""")


def _header(found: re.Match[str]) -> str:
    name, value = found.group(2), found.group(4)
    if name.lower() in _LOCATIONS:
        value = redact(value)
    elif name.lower() not in _PLAIN:
        value = "***"
    return f"(b{found.group(1)}{name}{found.group(1)}, b{found.group(3)}{value}{found.group(3)})"


def redacted(text: str) -> str:
    """A client's log line with its URLs redacted and its unknown header values hidden."""
    return redact_urls_in(_HEADER.sub(_header, text))


class _Redacting(logging.Filter):
    """Rewrites a record's message, redacted, before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted: logging reports it as ever
            return True
        clean = redacted(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


_FILTER: Final = _Redacting()


def redact_client_logs() -> None:
    """Put the filter on every logger of httpx and httpcore that exists now (idempotent)."""
    names = [
        name
        for name in list(logging.Logger.manager.loggerDict)
        if name in _LIBRARIES or name.startswith(tuple(f"{lib}." for lib in _LIBRARIES))
    ]
    for name in {*_LIBRARIES, *names}:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
