"""Where the shared tier is and how long it may take: the remote setting, checked.

A remote is named by one `redis://` or `rediss://` URL (password, database
number and TLS files as in the URL), given in code, in `WARMENV_REMOTE` or in
the configuration; `RemoteSettings` adds the bounds the tier keeps to (the
timeout per operation, the value cap, the pool size, the lease TTL). Every
setting is checked when it is made, not when the tier first connects: a URL
coredis would misread (a path it takes for database 0, another fleet's data)
or a TLS parameter that would switch checking off is an error naming the
setting and the fix, and the password never appears in it.

For `rediss://`, warmenv builds the TLS context itself rather than letting
coredis read the URL, because coredis's own checks no host name (see
`tls_context`).
"""

from __future__ import annotations

import os
import re
import ssl
from typing import Final
from urllib.parse import parse_qs, urlsplit, urlunsplit

import attrs

from warmenv._errors import WarmenvError

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_REMOTE_TIMEOUT",
    "RemoteError",
    "RemoteSettings",
    "check_url",
    "redact",
    "remote_settings",
    "tls_context",
]

DEFAULT_REMOTE_TIMEOUT: Final = 0.25
DEFAULT_MAX_VALUE_BYTES: Final = 8 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS: Final = 2
DEFAULT_LEASE_TTL: Final = 10.0


class RemoteError(WarmenvError):
    """The remote setting cannot be used (a malformed URL, or the `redis` extra missing)."""


# A query parameter naming a password (coredis reads `?password=` as the URL's password).
_QUERY_PASSWORD: Final = re.compile(r"(?i)([?&][^=&#]*pass[^=&#]*=)[^&#]*")


def redact(url: str) -> str:
    """`url` with its password replaced by `***`, for logs, errors and reprs."""
    return _QUERY_PASSWORD.sub(r"\1***", _redact_userinfo(url))


def _redact_userinfo(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        # Malformed (`redis:/:pw@host`) or user-only: hide whatever precedes an `@`.
        head, at, tail = url.rpartition("@")
        if not at:
            return url
        scheme, colon, _ = head.partition(":")
        return f"{scheme}{colon}//***@{tail}" if colon else f"***@{tail}"
    # The host and port as given, not as parsed: a malformed port is what the
    # user must see (the parser would drop it, or raise).
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    netloc = f"{user}:***@{hostport}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


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


@attrs.frozen(repr=False)
class RemoteSettings:
    """Where the shared tier is and how long it may take."""

    url: str
    """A `redis://` or `rediss://` URL; password, database number and TLS as in the URL."""
    timeout: float = DEFAULT_REMOTE_TIMEOUT
    """The most one remote operation may take before the call falls back to local."""
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    """A value larger than this is neither published nor read (it stays local)."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """The size of the connection pool."""
    lease_ttl: float = DEFAULT_LEASE_TTL
    """How long a computing host's lease outlives its last heartbeat (a crash costs this much)."""

    def __attrs_post_init__(self) -> None:
        check_url(self.url)
        if not (isinstance(self.timeout, int | float) and self.timeout > 0):
            raise ValueError(f"remote timeout must be a positive number, got {self.timeout!r}")
        for name in ("max_value_bytes", "max_connections"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"remote {name} must be a positive int, got {value!r}")
        # Three heartbeats per TTL, each allowed the whole timeout, must fit in it.
        if not (isinstance(self.lease_ttl, int | float) and self.lease_ttl >= 4 * self.timeout):
            raise ValueError(
                f"remote lease_ttl must be a number of seconds at least 4 x timeout"
                f" ({4 * self.timeout}), got {self.lease_ttl!r}"
            )

    def __repr__(self) -> str:
        return (
            f"RemoteSettings(url={redact(self.url)!r}, timeout={self.timeout!r}, "
            f"max_value_bytes={self.max_value_bytes!r}, max_connections={self.max_connections!r}, "
            f"lease_ttl={self.lease_ttl!r})"
        )


def check_url(url: object, where: str = "remote") -> str:
    """`url` if it names a Redis server, else `RemoteError` saying what would."""
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
    if parts.path not in ("", "/") and not re.fullmatch(r"/[0-9]{1,9}", parts.path):
        # coredis would take a path it cannot read as database 0: another fleet's data.
        raise RemoteError(
            f"{where}: {redact(url)!r} has a malformed database number {parts.path[1:]!r};"
            " the path is a database number, e.g. /0 (none means 0)"
        )
    return url


def remote_settings(remote: str | RemoteSettings | None) -> RemoteSettings | None:
    """The settings `open_environment(remote=...)` means; `None` reads `WARMENV_REMOTE`.

    An empty string turns the remote off, even where `WARMENV_REMOTE` is set.
    """
    if isinstance(remote, RemoteSettings):
        return remote
    if remote is None:
        remote = os.environ.get("WARMENV_REMOTE")
        if not remote:
            return None
        return RemoteSettings(check_url(remote, "the environment variable WARMENV_REMOTE"))
    if remote == "":
        return None
    return RemoteSettings(check_url(remote))


# The query parameters of a rediss:// URL that name files, and what each holds.
_TLS_FILES: Final = {
    "ssl_ca_certs": "the CA certificates to trust",
    "ssl_certfile": "this host's certificate",
    "ssl_keyfile": "this host's key",
}
_TRUE: Final = ("1", "true", "yes", "on")


def tls_context(url: str) -> ssl.SSLContext | None:
    """The TLS context of a rediss:// URL (None for redis://): the server's certificate
    and its host name are always checked.

    coredis, left to read the URL, checks no host name and takes a server that
    sends no certificate: any certificate of a trusted CA (with the system's
    CAs, any public one) would do for any host, and the password and values
    would go to whoever holds it. So warmenv builds the context, from the same
    query parameters, and refuses those that would switch checking off.
    """
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return None
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    reqs = query.get("ssl_cert_reqs")
    if reqs is not None and reqs.lower() not in ("required", "cert_required"):
        raise RemoteError(
            f"remote: ssl_cert_reqs={reqs!r}: warmenv always checks the server's certificate;"
            " drop the parameter (name a private CA with ssl_ca_certs=FILE)"
        )
    check = query.get("ssl_check_hostname")
    if check is not None and check.lower() not in _TRUE:
        raise RemoteError(
            f"remote: ssl_check_hostname={check!r}: warmenv always checks the server's host"
            " name; drop the parameter"
        )
    for name, what in _TLS_FILES.items():
        path = query.get(name)
        if path is not None and not os.path.isfile(path):
            raise RemoteError(f"remote: {name}={path!r} ({what}) is not a file")
    try:
        context = ssl.create_default_context(cafile=query.get("ssl_ca_certs"))
    except (OSError, ssl.SSLError) as exc:
        raise RemoteError(
            f"remote: ssl_ca_certs={query['ssl_ca_certs']!r} holds no usable CA certificate ({exc})"
        ) from None
    if "ssl_certfile" in query:
        try:
            context.load_cert_chain(query["ssl_certfile"], query.get("ssl_keyfile"))
        except (OSError, ssl.SSLError) as exc:
            raise RemoteError(
                f"remote: ssl_certfile={query['ssl_certfile']!r} and ssl_keyfile="
                f"{query.get('ssl_keyfile')!r} are not a usable certificate and key ({exc})"
            ) from None
    elif "ssl_keyfile" in query:
        raise RemoteError("remote: ssl_keyfile= needs ssl_certfile= (the certificate it signs)")
    return context
