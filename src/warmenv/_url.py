"""URLs warmenv is given: a Redis server's (`redis://`, `rediss://`) and a bundle's (`http(s)://`).

Both kinds carry credentials (a password or a token in the user information,
a password or a signature in the query), and both end up in logs, errors,
reprs and `--json` output. So there is one `redact`, with one rule for every
URL: what could be a credential is `***`, whatever the scheme, because a rule
per kind drifts (one hid the query, the other only `?password=`; one kept a
password the parser had cut off at a `#`). The checks that say whether a
string names a Redis server or a bundle by URL live here too, with no import
of the Redis tier or of the HTTP client, so that the configuration can check
a remote URL without loading either.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from warmenv._errors import RemoteError

__all__ = ["check_redis_url", "is_http_url", "redact"]

UNPARSABLE: Final = "<an unparsable URL>"
_DATABASE: Final = re.compile(r"/[0-9]{1,9}")


def redact(url: str) -> str:
    """`url` fit to print: whatever could be a credential replaced by `***`.

    - The user information: `***@` (a user name may be a token), `:***@`
      for a password alone (`redis://:PASSWORD@host`).
    - Every query value (`?password=`, a signed URL's signature), and a query
      item without `=`, which may be a token itself; the names stay.
    - The fragment is dropped.
    - An `@` after the host part, as a password holding `#`, `/` or `?` leaves
      (the parser ends the host part there: `redis://:pa#ss@host`): all
      before the last `@` is hidden, since pieces of the password are there.
    - The host and port as given, not as parsed: a malformed port is what
      the reader must see.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return UNPARSABLE
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{':' if userinfo.startswith(':') else ''}***@{hostport}"
    elif "@" in url:
        tail = url.rpartition("@")[2]
        return redact(f"{parts.scheme}://***@{tail}" if parts.scheme else f"//***@{tail}")
    query = "&".join(_redact_item(item) for item in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _redact_item(item: str) -> str:
    name, equals, _ = item.partition("=")
    if not equals:
        return "***" if item else ""
    return f"{name}=***"


def is_http_url(source: object) -> bool:
    """Whether an import or preflight `source` names a bundle by http(s) URL."""
    return isinstance(source, str) and source[:8].lower().startswith(("http://", "https://"))


def check_redis_url(url: object, where: str = "remote") -> str:
    """`url` if it names a Redis server, else `RemoteError` saying what would.

    `where` names the setting (`remote`, a file's key, a variable), so the
    error says which one to fix; the URL in it is redacted.
    """
    if not isinstance(url, str):
        raise RemoteError(f"{where} must be a redis:// or rediss:// URL, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        # Not the parser's message: it may quote the password, taken for a port or a host.
        if port := _port_as_given(url):
            raise RemoteError(
                f"{where}: {redact(url)!r} has a malformed port {port!r}; a port is a number"
                " from 0 to 65535 (none means 6379)"
            ) from None
        raise RemoteError(
            f"{where}: {redact(url)!r} is not a valid URL (a malformed host or port; a password"
            " with '#', '/' or '?' goes in the query, percent-encoded: ?password=a%23b)"
        ) from None
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise RemoteError(
            f"{where}: {redact(url)!r} is not a Redis URL; use redis://[:password@]host[:port][/db]"
            " or rediss:// for TLS"
        )
    if parts.path not in ("", "/") and not _DATABASE.fullmatch(parts.path):
        # coredis would take a path it cannot read as database 0: another fleet's data.
        raise RemoteError(
            f"{where}: {redact(url)!r} has a malformed database number {parts.path[1:]!r};"
            " the path is a database number, e.g. /0 (none means 0)"
        )
    return url


def _port_as_given(url: str) -> str | None:
    """The port text of `url` when it cannot be a password's piece, else `None`.

    It can be one when no `@` ends the host part (`redis://:pw#x@host`: the
    parser reads `pw#x` up to the `#`, and `pw` as the port).
    """
    try:
        netloc = urlsplit(url).netloc
    except ValueError:  # a malformed host (an unclosed `[`): no port to show
        return None
    if "@" in url and "@" not in netloc:
        return None
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        hostport = hostport.partition("]")[2]
    return hostport.partition(":")[2]
