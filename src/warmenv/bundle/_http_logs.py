"""What the HTTP client logs about our downloads carries no secret.

httpx logs every request at INFO with its URL as sent (`HTTP Request: GET
https://user:pw@host/b?token=...`), and httpcore, at DEBUG, every
response's headers (a redirect's `Location` to a signed URL, a
`Set-Cookie`). Both name URLs we were given or were redirected to, which
carry credentials as often as not. So every logger of the two libraries
gets one filter that rewrites a record before any handler sees it: the
URL of httpx's request line, an argument of the record, redacted by
`warmenv._url.redact` (the one rule); a URL in other text by
`warmenv._url.redact_urls_in`, which cannot tell where a query ends and so
hides all from its `?` or `#` to the end of the text; and each
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
from http import HTTPStatus
from typing import Final

from warmenv._url import redact, redact_urls_cut

__all__ = ["redact_client_logs", "status_line"]

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
# A response's status as httpcore logs it: (b'HTTP/1.1', 404, b'the server's own phrase', ...
_STATUS: Final = re.compile(r"""(\(b'HTTP/[0-9.]+', ([0-9]+), b)(['"])(?:\\.|(?!\3).)*\3""")
# A header as httpcore logs it: a tuple of two bytes reprs, (b'Name', b'value').
_HEADER: Final = re.compile(r"""\(b(['"])([^'"\\]*)\1, b(['"])((?:\\.|(?!\3).)*)\3\)""")


def _header(found: re.Match[str]) -> str:
    name, value = found.group(2), found.group(4)
    if name.lower() in _LOCATIONS:
        value = redact(value)
    elif name.lower() not in _PLAIN:
        value = "***"
    return f"(b{found.group(1)}{name}{found.group(1)}, b{found.group(3)}{value}{found.group(3)})"


def _standard_phrase(found: re.Match[str]) -> str:
    phrase = status_line(int(found[2])).partition(" ")[2]
    return f"{found[1]}{found[3]}{phrase}{found[3]}"


def redacted(text: str) -> str:
    """A client's log line with its URLs redacted and its unknown header values hidden.

    A header's value is delimited by its repr's quotes, so a `Location` is
    redacted as the URL it is; the text around the headers is free text,
    redacted by `redact_urls_in`'s conservative rule, and once a query or a
    fragment in it is cut, the rest of the line goes with it.
    """
    text = _STATUS.sub(
        lambda s: f"{s[1]}{s[3]}{status_line(int(s[2])).partition(' ')[2]}{s[3]}", text
    )
    pieces, done = [], 0
    for found in [*_HEADER.finditer(text), None]:
        end = len(text) if found is None else found.start()
        free, cut = redact_urls_cut(text[done:end])
        pieces.append(free)
        if cut:  # what follows may be the query's still, a header's look-alike included
            return "".join(pieces)
        if found is not None:
            pieces.append(_header(found))
            done = found.end()
    return "".join(pieces)


# httpx's line for every request (`httpx._client`, 0.27 to 0.29): the method, the URL as
# sent (user information and fragment included), then the response's status line.
_REQUEST_LINE: Final = 'HTTP Request: %s %s "%s %d %s"'


def _request_args(record: logging.LogRecord) -> tuple[object, ...] | None:
    """The args of httpx's request line with the URL redacted; `None` for any other record.

    The URL is an argument, known exactly, so it gets `redact` whatever it
    holds, rather than a scan of the formatted text that must guess where it ends.
    """
    args = record.args
    if record.msg != _REQUEST_LINE or not isinstance(args, tuple) or len(args) != 5:
        return None
    method, url, version, status, _ = args
    return (
        redacted(str(method)),
        redact(str(url), parsed=not isinstance(url, str)),  # an httpx.URL: parsed
        redacted(str(version)),
        status,
        status_line(status).partition(" ")[2],  # the server's own phrase may say anything
    )


def status_line(code: object) -> str:
    """A status and its standard phrase ("404 Not Found"), never the server's own phrase,
    which may carry anything (a path, a token)."""
    try:
        return f"{code} {HTTPStatus(code).phrase}"  # type: ignore[arg-type]
    except ValueError:
        return str(code)


class _Redacting(logging.Filter):
    """Rewrites a record's message, redacted, before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = _request_args(record)
        if request is not None:
            record.args = request
            return True
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
