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
import ssl
from typing import Final
from urllib.parse import parse_qs, urlsplit

import attrs

from warmenv._errors import RemoteError
from warmenv._url import check_redis_url, redact

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_BACKFILL",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_LEASE_WAIT",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_REMOTE_TIMEOUT",
    "RemoteSettings",
    "remote_settings",
    "tls_context",
]

DEFAULT_REMOTE_TIMEOUT: Final = 0.25
DEFAULT_MAX_VALUE_BYTES: Final = 8 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS: Final = 2
DEFAULT_LEASE_TTL: Final = 10.0
DEFAULT_BACKOFF: Final = 1.0
DEFAULT_MAX_LEASE_WAIT: Final = 300.0
DEFAULT_MAX_BACKFILL: Final = 1024


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
    backoff: float = DEFAULT_BACKOFF
    """The longest the tier serves locally after a failure before trying Redis again; the
    first wait is 0.25 s (or this, if less), doubled per failed try up to this."""
    max_lease_wait: float = DEFAULT_MAX_LEASE_WAIT
    """The longest a host waits for another host's lease before computing the key itself
    (with a warning): a lease renewed forever holds no one longer."""
    max_backfill: int = DEFAULT_MAX_BACKFILL
    """The most values fetched from Redis that wait to be written locally
    (`warmenv.remote.backfill`); a caller that finds this many waits for a flush."""

    def __attrs_post_init__(self) -> None:
        check_redis_url(self.url)
        for name in ("timeout", "backoff", "max_lease_wait"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"remote {name} must be a positive number, got {value!r}")
        for name in ("max_value_bytes", "max_connections", "max_backfill"):
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
            f"lease_ttl={self.lease_ttl!r}, backoff={self.backoff!r}, "
            f"max_lease_wait={self.max_lease_wait!r}, max_backfill={self.max_backfill!r})"
        )


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
        return RemoteSettings(check_redis_url(remote, "the environment variable WARMENV_REMOTE"))
    if remote == "":
        return None
    return RemoteSettings(check_redis_url(remote))


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
