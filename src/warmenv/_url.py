"""URLs warmenv is given: a Redis server's (`redis://`, `rediss://`) and a bundle's (`http(s)://`).

Both kinds carry credentials (a password or a token in the user information,
a password or a signature in the query), and both end up in logs, errors,
reprs and `--json` output (a token may sit in a path parameter too:
`https://host/b;token=...`). So there is one `redact`, with one rule for every
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

__all__ = [
    "bundle_url_problem",
    "check_redis_url",
    "is_http_url",
    "is_url",
    "redact",
    "redact_in",
    "redact_urls_cut",
    "redact_urls_in",
]

UNPARSABLE: Final = "<an unparsable URL>"
_DATABASE: Final = re.compile(r"/[0-9]{1,9}")
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def redact(url: str, *, parsed: bool = False) -> str:
    """`url` fit to print: whatever could be a credential replaced by `***`.

    - The user information: `***@` (a user name may be a token), `:***@`
      for a password alone (`redis://:PASSWORD@host`).
    - Every query value (`?password=`, a signed URL's signature), and a query
      item without `=`, which may be a token itself; the names stay.
    - Every path parameter's value the same way (`/b;token=***/x.bundle`):
      servers read credentials from them as from a query.
    - The fragment is dropped.
    - An `@` after the host part, as a password holding `#`, `/` or `?` leaves
      (the parser ends the host part there: `redis://:pa#ss@host`): all
      before the last `@` is hidden, since pieces of the password are there.
    - The host and port as given, not as parsed: a malformed port is what
      the reader must see.

    `parsed` says `url` is one a client parsed and sent (httpx's request
    line): its host part does end at the first `/`, `?` or `#`, so an `@`
    after it is a query's or a fragment's (`?email=a@b`), not a password's
    end, and what follows it is hidden with the rest of them.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return UNPARSABLE
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{':' if userinfo.startswith(':') else ''}***@{hostport}"
    elif "@" in url and not parsed:
        tail = url.rpartition("@")[2]
        return redact(f"{parts.scheme}://***@{tail}" if parts.scheme else f"//***@{tail}")
    query = "&".join(_redact_item(item) for item in parts.query.split("&")) if parts.query else ""
    path = "/".join(_redact_params(segment) for segment in parts.path.split("/"))
    return urlunsplit((parts.scheme, netloc, path, query, ""))


def _redact_params(segment: str) -> str:
    """A path segment with its `;` parameters redacted as query items are."""
    name, semicolon, params = segment.partition(";")
    if not semicolon:
        return segment
    return f"{name};" + ";".join(_redact_item(item) for item in params.split(";"))


def _redact_item(item: str) -> str:
    name, equals, _ = item.partition("=")
    if not equals:
        return "***" if item else ""
    return f"{name}=***"


def redact_in(text: str, url: str) -> str:
    """`text` (a client's message about `url`) fit to print: every secret of every URL hidden.

    httpx's and coredis's exceptions may quote `url` whole (shown as `redact`
    shows it), or a piece of it they could not parse (a password taken for a
    port): every piece `redact` would hide is `***` wherever it stands. A URL
    the message names that is not `url` (a redirect's target) gets the
    conservative rule of `redact_urls_in`, which may hide the message's rest.
    """
    pieces = text.split(url)
    shown = []
    for number, piece in enumerate(pieces):
        for secret in _secrets(url):
            piece = piece.replace(secret, "***")
        clean, cut = redact_urls_cut(piece)
        shown.append(clean)
        if cut:  # the rest may be that URL's query still
            break
        if number < len(pieces) - 1:
            shown.append(redact(url))
    return "".join(shown)


# A URL written inside other text: a scheme, then its token, up to a space.
_URL_IN_TEXT: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(\S*)")


def redact_urls_in(text: str) -> str:
    """`text` with every URL written in it (`scheme://...`, any scheme) redacted: for
    text whose URLs nobody told us, as an HTTP client's debug line.

    Text says neither where a URL ends nor where its query does: a quote, a
    parenthesis, a bracket and (unencoded) a space are all legal in a query
    or a fragment, so ending the URL at any of them let the rest of a
    signature through. So the rule is conservative, not `redact`'s: the user
    information (all before the last `@` of the token, or before the first
    `?` or `#`) is `***`, and from the first `?`, `#` or `;` (a path
    parameter) after the host to the end of the text all is `***`;
    the scheme, host and path stay, what a reader debugs. Where the URL is
    known (a structured log record's argument), use `redact` on it instead.
    """
    return redact_urls_cut(text)[0]


def redact_urls_cut(text: str) -> tuple[str, bool]:
    """`redact_urls_in(text)`, and whether a query or fragment hid the text's end.

    A caller that redacts a line in pieces hides all the pieces after such
    a one: what follows may still be the query's.
    """
    found = _URL_IN_TEXT.search(text)
    if found is None:
        return text, False
    start = found.start(1)
    # The user information ends at the token's last `@` (a password may hold `/`, `?`, `#`)
    # or at the last `@` before a `?` or `#` (it may hold a space, and a `/` after it).
    authority = re.split(r"[?#]", text[start:], maxsplit=1)[0]
    ats = [piece.rfind("@") for piece in (found.group(1), authority)]
    if re.search(r"[?#]", text[start : start + max(ats)]):  # a query's `@` as much as a password's
        return f"{text[:start]}***", True
    if max(ats) >= 0:
        head, start = f"{text[:start]}***@", start + max(ats) + 1
    else:
        head = text[:start]
    rest = text[start:]
    cut = re.search(r"[?#;]|\s", rest)
    if cut is not None and cut.group() in "?#;":
        return f"{head}{rest[: cut.start()]}{cut.group()}***", True
    end = cut.start() if cut is not None else len(rest)
    if end == 0 and max(ats) >= 0:
        # User information and no host after it: a password with a space in it as
        # likely as a URL that ends there, so what follows may still be the secret's.
        return f"{head}***", True
    tail, tail_cut = redact_urls_cut(rest[end:])
    return f"{head}{rest[:end]}{tail}", tail_cut


def _secrets(url: str) -> list[str]:
    """What `redact` would hide in `url`, as given (longest first)."""
    head, at, _ = url.rpartition("@")
    pieces = [head.partition("://")[2]] if at else []
    pieces += [p for p in re.split(r"[:@/?#&=;]", pieces[0]) if p] if pieces else []
    query = url.partition("?")[2].partition("#")[0]
    params = re.findall(r";([^;/?#]*)", url)  # wherever they stand: more hidden is no harm
    for item in [*params, *(query.split("&") if query else ())]:
        name, equals, value = item.partition("=")
        pieces.append(value if equals else name)
    fragment = url.partition("#")[2]
    pieces.append(fragment)
    return sorted({p for p in pieces if len(p) >= 3}, key=len, reverse=True)


def is_url(source: object) -> bool:
    """Whether `source` is written as a URL (`scheme://...`), whatever the scheme.

    Such a string is never taken for a file path: `ftp://user:pw@host/b`
    read as a path would be printed, credentials and all, as "no such file".
    """
    return isinstance(source, str) and _SCHEME.match(source) is not None


def is_http_url(source: object) -> bool:
    """Whether an import or preflight `source` names a bundle by http(s) URL."""
    return isinstance(source, str) and source[:8].lower().startswith(("http://", "https://"))


def bundle_url_problem(url: str) -> str | None:
    """Why `url` cannot name a bundle to download, in one line (redacted); `None` if it can.

    A bundle is fetched by `http://` or `https://` from a named host and a
    valid port; anything else (another scheme, a malformed host or port, a
    password with `#`, `/` or `?` that cuts the host part short) is refused
    here, before a client sees it, so the message is ours and hides the
    credentials rather than the client's, which may quote them.
    """
    shown = repr(redact(url))
    if shown == repr(UNPARSABLE):
        shown = "the URL (not shown: it may hold a password)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        if port := _port_as_given(url):
            return f"{shown} has a malformed port {port!r}; a port is a number from 0 to 65535"
        return (
            f"{shown} is not a valid URL (a malformed host or port; a password with '#', '/' "
            "or '?' must be percent-encoded: %23, %2F, %3F)"
        )
    if parts.scheme.lower() not in ("http", "https"):
        return (
            f"{shown} is a {parts.scheme}:// URL; a bundle is downloaded by http:// or "
            "https:// only (or read from a file path)"
        )
    if "@" in url and "@" not in parts.netloc:
        return (
            f"{shown} is not a valid URL (its host part ends before its last '@': a password "
            "with '#', '/' or '?' must be percent-encoded: %23, %2F, %3F)"
        )
    if not parts.hostname:
        return f"{shown} names no host; use http(s)://host[:port]/path"
    return None


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
            f"{where}: {redact(url)!r} has a malformed database number"
            f" {urlsplit(redact(url)).path[1:]!r};"
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
