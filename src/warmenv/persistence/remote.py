"""The shared tier: a fleet's warm state in Redis, behind the `Storage` protocol.

The local database stays the first tier and the truth for this machine; Redis
is a second tier that only ever saves work. A local miss asks Redis, and a
value found there is recorded locally with origin `REMOTE` (which replaces
nothing, and any local value replaces it). A value computed here (origin
`LOCAL`) is published if Redis has none for the key: `SET key value NX` (in a
script that also announces the value, below) is the insert rule applied
server-side in one atomic step, because everything in Redis was published as
`LOCAL` and `may_replace(LOCAL, LOCAL)` is false, so the first writer
fleet-wide wins.

Every remote call is bounded: `remote_timeout` per operation, a connection
pool of fixed size, a cap on value size (a larger value stays local) and a
backoff after a failure, so a Redis that is down, slow or hostile costs each
call at most one timeout and then nothing until the next retry. One warning is
logged per outage, not per call. A value read from Redis is bytes checked
against a digest bound to its key (written by `publish`), then handed to the
store's codec, never unpickled; wrong types, oversized or garbled values under
our keys are misses plus a warning. A value carries what its entry carries in
a bundle, when it was written and what it cost (`warmenv.persistence.carried`,
whose rules decide what is believed), so that hits on it count the time they
saved on every host.

A purge of one key (`purge_key`) deletes the fleet's copy too: a value worth
purging here (wrong, or made by a bad build) would otherwise come back from
Redis at the next lookup, on this host and on every host that has not fetched
it yet. A purge of a namespace stays local: it would be a scan of the whole
server, and one host's clean-up must not make the whole fleet recompute.

Fleet-wide single flight: a host that misses a key in both tiers takes a
lease on it before computing (`SET <key>:lease <token> NX PX <lease_ttl>`),
and a heartbeat extends the lease while the computation runs, only while the
token is still ours (a Lua script, so the check and the extension are one
step). The lease is deleted (token-checked) when the computation ends,
whether it stored a value or raised, so a failure lets the next host try, and
a holder that died stops heartbeating and its lease expires within
`lease_ttl`. Other hosts wait until the value lands or the lease is gone.
They are woken by a message: publishing a value, or releasing a lease with no
value behind it, sends the value's key on the environment's channel
(`warmenv:<environment>:landed`), and each tier keeps one subscription to it
(a connection of its own, opened once the server first answers, not one per
waiter) that wakes the waiters on that key at once. A claim on a lease
returns the value when there is one, so a woken waiter needs one round
trip. Polling stays as the fallback, because pub/sub delivers at most once
and only to a live subscription: a waiter also polls, every `lease_ttl / 10`
while the subscription is up (which is also how an expired lease is noticed)
and at a growing interval capped at 0.1 s while it is not (reconnecting, or
a server that refuses pub/sub). A Redis that does not answer means computing
locally, as without a remote.

Key layout: `warmenv:<environment>:<namespace>:<hex of the key bytes>`. The
environment name cannot hold `:` and the hex part cannot either, so the last
`:` splits the namespace from the key unambiguously. A lease lives under the
value's key plus `:lease`, which no value key can end with (`l` and `s` are
not hex digits).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, TypeVar, final
from urllib.parse import parse_qs, urlsplit, urlunsplit

import anyio
import attrs

from warmenv._errors import WarmenvError
from warmenv._text import clean
from warmenv.persistence import carried
from warmenv.persistence.storage import (
    DEFAULT_SCAN_BATCH,
    BundleRef,
    Conflict,
    EntryInfo,
    Failed,
    Insertion,
    InsertItems,
    InsertSummary,
    NamespaceSummary,
    Origin,
    Purged,
    Storage,
    Stored,
    check_item,
    check_key,
    check_value,
    wall_clock,
)

if TYPE_CHECKING:
    import coredis
    from anyio.abc import TaskGroup

    from warmenv.persistence.explain import Explanation

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_REMOTE_TIMEOUT",
    "Ping",
    "RemoteError",
    "RemoteSettings",
    "RemoteStatistics",
    "RemoteStorage",
    "RemoteTier",
    "RemoteValue",
    "redact",
    "remote_settings",
]

log = logging.getLogger("warmenv.remote")
T = TypeVar("T")

DEFAULT_REMOTE_TIMEOUT: Final = 0.25
DEFAULT_MAX_VALUE_BYTES: Final = 8 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS: Final = 2
DEFAULT_LEASE_TTL: Final = 10.0
# Without a subscription a waiter polls first after this long, then 1.5 times
# longer each time, up to the cap; with one it polls every lease_ttl / this.
FIRST_POLL_DELAY: Final = 0.002
MAX_POLL_DELAY: Final = 0.1
POLLS_PER_LEASE_TTL: Final = 10
# Keys whose unusable value is warned about, each once; past this many, at DEBUG only.
MAX_REJECTED_WARNED: Final = 100
# The first retry after a failure, doubled per failed retry up to the ceiling.
FIRST_RETRY_DELAY: Final = 0.5
MAX_RETRY_DELAY: Final = 30.0

# A published value is framed: magic, then a digest of the key and the body, then the
# body: what the entry carries (`carried.pack`: written_at, cost), then the value.
# Frames of version 1 (warmenv 0.2.0.dev before costs were carried) have the value
# alone for a body; they still read, carrying nothing (unknown).
_MAGIC: Final = b"warmenv2"
_MAGIC_V1: Final = b"warmenv1"
_DIGEST_SIZE: Final = 16
_BODY: Final = len(_MAGIC) + _DIGEST_SIZE
_CARRIED: Final = 16
_HEADER: Final = _BODY + _CARRIED
_LEASE: Final = b":lease"  # a key's lease is its Redis key with this suffix

# KEYS: the value, its lease. ARGV: the framed value, the channel. 1 if stored, 0 if a
# value was there, -1 if what is there is no warmenv frame (another type, or a string
# without the marker or too short for a frame): it blocks the key until deleted, as the
# first value under a key stays. Told apart on the server, after SET NX failed: the
# publication that stores (every one but the first fleet-wide) stays one round trip of
# the same commands. Only a host waiting for a lease's holder listens for the message,
# so it is sent only while the key's lease is held: a plain insert costs no message (a
# waiter whose holder died finds the value by polling). Sent with pcall: a server that
# refuses PUBLISH still stores the value.
_PUBLISH: Final = b"""
if redis.call('set', KEYS[1], ARGV[1], 'NX') then
  if redis.call('exists', KEYS[2]) == 1 then redis.pcall('publish', ARGV[2], KEYS[1]) end
  return 1
end
local head = redis.pcall('getrange', KEYS[1], 0, %d)
if type(head) ~= 'string' then return -1 end
local magic = string.sub(head, 1, %d)
if (magic == '%s' and #head >= %d) or (magic == '%s' and #head >= %d) then return 0 end
return -1
""" % (_HEADER - 1, len(_MAGIC), _MAGIC, _HEADER, _MAGIC_V1, _BODY)
# KEYS: the lease, the value. ARGV: our token, the TTL in ms, the last byte to read.
# The value (framed, read up to the byte given) if there is one, so that a waiter gets
# it in the same round trip; else 1: the lease is now ours; 0: another host holds it;
# -1: something sits under the lease key that no warmenv host took: it never expires,
# or expires later than any lease can (a lease never holds more than its TTL).
_CLAIM: Final = b"""
local framed = redis.call('getrange', KEYS[2], 0, ARGV[3])
if framed ~= '' then return framed end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
local left = redis.call('pttl', KEYS[1])
if left == -1 or left > tonumber(ARGV[2]) then return -1 end
return 0
"""
# KEYS: the lease. ARGV: our token, the TTL in ms. 1 if the lease was still ours.
_EXTEND: Final = b"""
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: the lease, the value. ARGV: our token, the channel. Deletes the lease only if it
# is still ours; with no value behind it (the computation raised) waiters are woken to
# take over (after a value, its publication woke them already).
_RELEASE: Final = b"""
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('del', KEYS[1])
if redis.call('exists', KEYS[2]) == 0 then redis.pcall('publish', ARGV[2], KEYS[2]) end
return 1
"""


# The tier whose operation (or subscription) the running task is in. coredis runs
# each connection in a task of its own, which inherits this from the task that
# asked for the connection: what coredis logs there is about one of our connections.
_TIER_AT_WORK: ContextVar[RemoteTier | None] = ContextVar("warmenv_remote_tier", default=None)


@final
class _OurConnections(logging.Filter):
    """What coredis logs about the tier's own connections, as one DEBUG line of ours.

    coredis logs a connection attempt that failed (a server that never
    answers, one that stops) at ERROR with its traceback, to the `coredis`
    logger and so into the application's logs; the tier already said, in one
    warning per outage, that the server is unavailable and why. Records about
    the application's own coredis clients pass untouched.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        tier = _TIER_AT_WORK.get()
        if tier is None:
            return True
        error = record.exc_info[1] if record.exc_info else None
        log.debug(
            "%s: coredis says %r%s",
            tier.describe(),
            record.getMessage(),
            "" if error is None else f" ({type(error).__name__}: {clean(error)})",
        )
        return False


_OUR_CONNECTIONS: Final = _OurConnections()


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


@attrs.frozen
class RemoteStatistics:
    """What the shared tier did for this process, for `statistics()` and `warmenv stats`."""

    hits: int
    """Local misses answered by Redis."""
    misses: int
    """Local misses Redis could not answer either."""
    published: int
    """Values this process was first to put in Redis."""
    already_published: int
    """Values Redis already held when this process offered one (first writer won)."""
    too_large: int
    """Values kept local because they exceed `max_value_bytes`."""
    rejected: int
    """Values under our keys that were not ours (wrong type, garbled, oversized): misses."""
    failures: int
    """Operations that failed or timed out."""
    skipped: int
    """Operations not tried because the remote was backing off after a failure."""
    outages: int
    """Times the remote went from answering to failing."""
    available: bool
    """Whether the remote answered its last operation (or has not been tried)."""
    leases: int = 0
    """Computations this process ran holding the fleet's lease on the key."""
    lease_waits: int = 0
    """Computations this process waited for because another host held the lease."""
    leases_lost: int = 0
    """Leases that expired or were taken over while this process still computed."""
    woken: int = 0
    """Waits for another host's value ended by its message rather than by polling."""
    subscribed: bool = False
    """Whether waiters are woken by messages now (else they only poll)."""
    publish_blocked: int = 0
    """Values not published because what sits under the key in Redis is no warmenv value
    (another type, or a string warmenv did not frame): it stays until it is deleted."""


@attrs.frozen
class RemoteValue:
    """A value read from Redis, with what its entry carried (each believed, or None)."""

    value: bytes
    written_at: float | None
    """Unix seconds when the host that computed it stored it."""
    cost: float | None
    """Seconds its computation took there."""


@attrs.frozen
class Ping:
    """Whether the remote answered a PING within the timeout: what `warmenv` says of a probe."""

    remote: str
    """The server, as `describe()` says it (the password hidden)."""
    reachable: bool
    seconds: float | None
    """The round trip, connecting included, when it answered."""
    reason: str | None
    """Why it did not answer (the password hidden), when it did not."""

    def __str__(self) -> str:
        if self.reachable:
            return f"{self.remote} answered in {1000 * (self.seconds or 0.0):.1f} ms"
        return f"{self.remote} is unavailable ({self.reason})"


class _Down(Exception):
    """The remote did not answer (or is backing off): the caller falls back to local."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@final
@attrs.define(eq=False, repr=False)
class RemoteTier:
    """One environment's connection to Redis: the client, the backoff and the counters."""

    settings: RemoteSettings
    environment: str
    _client: coredis.Redis[bytes]
    _tls: ssl.SSLContext | None
    """The checked TLS context of a rediss:// URL, for every client of the tier."""
    _refused: type[Exception]
    """coredis's `WrongTypeError`: something not ours sits under our key."""
    _no_script: type[Exception]
    """coredis's `NoScriptError`: the server lost our scripts (a restart)."""
    _tasks: TaskGroup
    """Where the subscription runs, for as long as the tier is connected."""
    _prefix: bytes = attrs.field(init=False)
    _channel: bytes = attrs.field(init=False)
    _retry_at: float = attrs.field(init=False, default=0.0)
    _delay: float = attrs.field(init=False, default=0.0)
    _counts: dict[str, int] = attrs.field(init=False, factory=dict)
    # The waiters on each value key, woken by a message on the channel.
    _waiters: dict[bytes, set[anyio.Event]] = attrs.field(init=False, factory=dict)
    _listening: bool = attrs.field(init=False, default=False)
    # The keys whose unusable value was warned about (each once, up to a bound).
    _rejected: set[bytes] = attrs.field(init=False, factory=set)
    # The keys whose value kept ours from being published (each warned about once).
    _blocked: set[bytes] = attrs.field(init=False, factory=set)
    _subscribed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._prefix = f"warmenv:{self.environment}:".encode()
        self._channel = self._prefix + b"landed"

    @classmethod
    @asynccontextmanager
    async def connect(cls, settings: RemoteSettings, environment: str) -> AsyncIterator[RemoteTier]:
        """The tier for the duration of the block; connections open lazily, on first use."""
        try:
            from coredis.exceptions import NoScriptError, WrongTypeError
        except ImportError:
            raise RemoteError(
                f"remote {redact(settings.url)!r} needs the redis extra: "
                "pip install 'warmenv[redis]'"
            ) from None
        # Added once (a logger keeps one of each filter), only once coredis is used.
        logging.getLogger("coredis").addFilter(_OUR_CONNECTIONS)
        # Reading the TLS files (and the system's CAs) is file I/O: not on the loop.
        tls = await anyio.to_thread.run_sync(tls_context, settings.url)
        client = _client(settings, settings.max_connections, tls)
        # The pool runs its connections in a task group around the block, and
        # the subscription runs in ours: an exception from the block is carried
        # past both, so that callers get it as raised rather than wrapped in an
        # exception group.
        escaped: BaseException | None = None
        async with client, anyio.create_task_group() as tasks:
            try:
                yield cls(settings, environment, client, tls, WrongTypeError, NoScriptError, tasks)
            except BaseException as exc:
                escaped = exc
            tasks.cancel_scope.cancel()
        if escaped is not None:
            raise escaped

    def describe(self) -> str:
        return f"Redis at {redact(self.settings.url)}"

    def __repr__(self) -> str:
        return f"<RemoteTier {self.describe()} for environment {self.environment!r}>"

    def statistics(self) -> RemoteStatistics:
        c = self._counts
        return RemoteStatistics(
            hits=c.get("hits", 0),
            misses=c.get("misses", 0),
            published=c.get("published", 0),
            already_published=c.get("already_published", 0),
            too_large=c.get("too_large", 0),
            rejected=c.get("rejected", 0),
            failures=c.get("failures", 0),
            skipped=c.get("skipped", 0),
            outages=c.get("outages", 0),
            available=self._delay == 0.0,
            leases=c.get("leases", 0),
            lease_waits=c.get("lease_waits", 0),
            leases_lost=c.get("leases_lost", 0),
            woken=c.get("woken", 0),
            subscribed=self._subscribed,
            publish_blocked=c.get("publish_blocked", 0),
        )

    def redis_key(self, namespace: str, key: bytes) -> bytes:
        """Where `key` of `namespace` lives in Redis (see the module docstring)."""
        return b"%s%s:%s" % (self._prefix, namespace.encode(), key.hex().encode())

    async def ping(self) -> Ping:
        """Whether Redis answers now, within the timeout; never raises.

        Tried even while the tier backs off after a failure (the caller asks
        about now), and its outcome counts as any operation's: an answer ends
        an outage, a failure starts one (warned about once) or extends it.
        """
        started = time.perf_counter()
        try:
            await self._call(self._client.ping, probe=True)
        except _Down as down:
            return Ping(self.describe(), False, None, down.reason)
        return Ping(self.describe(), True, time.perf_counter() - started, None)

    async def fetch(self, namespace: str, key: bytes) -> RemoteValue | None:
        """The value Redis holds for the key, or `None` (absent, unusable or unreachable)."""
        rkey = self.redis_key(namespace, key)
        try:
            framed = await self._call(lambda: self._client.getrange(rkey, 0, self._read_limit))
        except _Down:
            return None
        except Exception as exc:  # a reply that is an error: a wrong type under our key
            self._reject(rkey, f"Redis refused to read it ({exc})")
            return None
        return self._unframe(rkey, framed)

    async def purge(self, namespace: str, key: bytes) -> str | None:
        """Delete the fleet's copy of the key; `None` if done, else why it could not be."""
        rkey = self.redis_key(namespace, key)
        try:
            await self._call(lambda: self._client.delete([rkey]))
        except _Down as down:
            return down.reason
        except Exception as exc:  # the server answered with an error (an ACL without DEL)
            return f"Redis refused to delete it ({exc})"
        return None

    @property
    def _read_limit(self) -> int:
        # GETRANGE reads at most one byte past the cap, so a huge value costs nothing.
        return _HEADER + self.settings.max_value_bytes

    def _unframe(self, rkey: bytes, framed: bytes) -> RemoteValue | None:
        """The value in what GETRANGE read under `rkey`, counted; `None` if absent or unusable."""
        if not framed:
            self._count("misses")
            return None
        too_large = f"larger than max_value_bytes={self.settings.max_value_bytes}"
        if len(framed) > self._read_limit:
            self._reject(rkey, too_large)
            return None
        magic = framed[: len(_MAGIC)]
        body = memoryview(framed)[_BODY:]
        if magic not in (_MAGIC, _MAGIC_V1) or framed[len(_MAGIC) : _BODY] != _digest(rkey, body):
            self._reject(rkey, "not a value warmenv published under this key")
            return None
        if magic == _MAGIC_V1:
            written_at = cost = None
            value = framed[_BODY:]
        elif len(body) < _CARRIED:
            self._reject(rkey, "a frame too short to hold what its entry carries")
            return None
        else:
            # What a value carries is believed as what a bundle's entry carries is.
            written_at, cost = carried.unpack(body[:_CARRIED])
            value = framed[_HEADER:]
        if len(value) > self.settings.max_value_bytes:
            self._reject(rkey, too_large)
            return None
        self._count("hits")
        return RemoteValue(value, written_at, cost)

    async def publish(
        self,
        namespace: str,
        key: bytes,
        value: bytes,
        *,
        cost: float | None = None,
        written_at: float | None = None,
    ) -> None:
        """Offer a value computed here; Redis keeps the first one offered fleet-wide.

        The value carries its `cost` and `written_at` (default: now), so that
        a host that fetches it records both, as an import does a bundle's.
        """
        if len(value) > self.settings.max_value_bytes:
            self._count("too_large")
            return
        rkey = self.redis_key(namespace, key)
        carrying = carried.pack(wall_clock() if written_at is None else written_at, cost)
        framed = b"".join((_MAGIC, _digest(rkey, carrying, value), carrying, value))
        args = (framed, self._channel)
        try:
            stored = await self._call(lambda: self._script(_PUBLISH, [rkey, rkey + _LEASE], args))
        except _Down:
            return
        except Exception as exc:
            log.warning("%s refused to store %r: %s", self.describe(), rkey, clean(exc))
            self._count("failures")
            return
        if stored == -1:
            self._count("publish_blocked")
            self._warn_once(
                self._blocked,
                "%s: not publishing under %r: it holds something warmenv did not publish, and"
                " the first value under a key stays; delete it (DEL) to let the fleet share it",
                rkey,
            )
            return
        self._count("published" if stored else "already_published")

    @asynccontextmanager
    async def lease(self, namespace: str, key: bytes) -> AsyncIterator[RemoteValue | None]:
        """The fleet's right to compute the key for the block, or the value another host stored.

        Yields `None` when this process should compute: it holds the lease
        (kept alive by a heartbeat until the block ends, then released), or
        Redis cannot arbitrate (down, slow, hostile) and computing locally is
        the fallback. Yields the value (already checked, as `fetch` does) when
        another host published it while this one waited.
        """
        rkey = self.redis_key(namespace, key)
        lkey = rkey + _LEASE
        token = os.urandom(16).hex().encode()
        held, landed = await self._await_turn(rkey, lkey, token)
        if not held:
            yield landed
            return
        self._count("leases")
        # As in `connect`: the block's exception is carried past the task group
        # so the caller gets it as raised, not wrapped in an exception group.
        escaped: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeat, lkey, token)
                try:
                    yield None
                except BaseException as exc:
                    escaped = exc
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._release(lkey, rkey, token)
        if escaped is not None:
            raise escaped

    async def _await_turn(
        self, rkey: bytes, lkey: bytes, token: bytes
    ) -> tuple[bool, RemoteValue | None]:
        """(True, None) once the lease is ours, else (False, the value or None to compute here)."""
        args = (token, round(self.settings.lease_ttl * 1000), self._read_limit)
        delay = FIRST_POLL_DELAY
        waited = False
        while True:
            # Watching before the claim: a message that comes between the two is not lost.
            with self._watching(rkey) as landed:
                try:
                    state = await self._call(lambda: self._script(_CLAIM, [lkey, rkey], args))
                except _Down:
                    return False, None
                except Exception as exc:
                    # A wrong type (what `_call` lets through) under the value's key:
                    # its GETRANGE is the claim's only command that cares (under the
                    # lease key, SET NX sees a key and PTTL says it never expires).
                    self._reject(rkey, f"Redis refused to read it ({exc})")
                    return False, None
                if isinstance(state, bytes):
                    return False, self._unframe(rkey, state)
                if state == 1:
                    return True, None
                if state != 0:
                    self._reject(lkey, "not a lease warmenv took (it never expires)")
                    return False, None
                if not waited:
                    waited = True
                    self._count("lease_waits")
                if self._subscribed:
                    poll = self.settings.lease_ttl / POLLS_PER_LEASE_TTL
                else:
                    poll, delay = delay, min(delay * 1.5, MAX_POLL_DELAY)
                with anyio.move_on_after(poll):
                    await landed.wait()

    @contextmanager
    def _watching(self, rkey: bytes) -> Iterator[anyio.Event]:
        """An event set when a message says the key's value landed or its lease was freed."""
        event = anyio.Event()
        self._waiters.setdefault(rkey, set()).add(event)
        try:
            yield event
        finally:
            events = self._waiters.get(rkey)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[rkey]

    def _listen_soon(self) -> None:
        """Start the tier's one subscription, once the server has answered.

        Not before: a tier whose server never answers opens nothing more.
        """
        if not self._listening:
            self._listening = True
            self._tasks.start_soon(self._listen)

    async def _listen(self) -> None:
        """Wake the waiters on each key announced on the channel, resubscribing after a loss."""
        from coredis.retry import NoRetryPolicy

        _TIER_AT_WORK.set(self)  # this task's own context: its connection's records are ours
        delay = FIRST_RETRY_DELAY
        while True:
            try:
                # A client of its own: the pool multiplexes commands over its
                # connections, and one that is subscribed must carry nothing else.
                async with (
                    _client(self.settings, 1, self._tls) as client,
                    client.pubsub(
                        channels=[self._channel],
                        ignore_subscribe_messages=True,
                        retry_policy=NoRetryPolicy(),
                        subscription_timeout=max(1.0, 4 * self.settings.timeout),
                        max_idle_seconds=self.settings.lease_ttl,
                    ) as subscription,
                ):
                    self._subscribed = True
                    delay = FIRST_RETRY_DELAY
                    async for message in subscription:
                        if isinstance(rkey := message["data"], bytes):
                            for event in self._waiters.pop(rkey, ()):
                                self._count("woken")
                                event.set()
            except* Exception as group:
                # Waiters poll meanwhile; an outage is reported by the calls themselves.
                # (`except*`: coredis's teardown may fail beside a cancellation,
                # which must go on while its failure is dropped.)
                log.debug("%s: the subscription ended (%r)", self.describe(), group.exceptions)
            finally:
                if self._subscribed:
                    self._subscribed = False
                    # Messages may be lost from now on and waiters poll slowly while
                    # subscribed: each looks again at once (and sees an outage, if any).
                    for events in self._waiters.values():
                        for event in events:
                            event.set()
            await anyio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)

    async def _heartbeat(self, lkey: bytes, token: bytes) -> None:
        args: tuple[bytes, int] = (token, round(self.settings.lease_ttl * 1000))
        while True:
            await anyio.sleep(self.settings.lease_ttl / 3)
            try:
                kept = await self._call(lambda: self._script(_EXTEND, [lkey], args))
            except Exception:
                continue  # not answering (counted) or refusing: the next beat tries again
            if kept != 1:
                self._count("leases_lost")
                log.warning(
                    "%s: the lease %r expired while this host computed; another host may compute"
                    " the value too (raise lease_ttl if computations stall this long)",
                    self.describe(),
                    lkey,
                )
                return

    async def _script(self, source: bytes, keys: list[bytes], args: Iterable[object]) -> Any:
        """Run our Lua `source` by its hash, loading it where the server lacks it (a restart).

        A plain EVALSHA: coredis's `Script` wraps each call in a retry and a
        transform, which cost as much again as the round trip's own Python.
        """
        sha = _sha1(source)
        arguments: Any = list(args)
        try:
            return await self._client.evalsha(sha, keys=keys, args=arguments)
        except self._no_script:
            await self._client.script_load(source)
            return await self._client.evalsha(sha, keys=keys, args=arguments)

    async def _release(self, lkey: bytes, rkey: bytes, token: bytes) -> None:
        args = (token, self._channel)
        try:
            await self._call(lambda: self._script(_RELEASE, [lkey, rkey], args))
        except Exception:
            pass  # the lease expires within lease_ttl instead

    async def _call(self, operation: Callable[[], Awaitable[T]], *, probe: bool = False) -> T:
        """`await operation()` within the timeout; `_Down` if it fails or the tier backs off.

        A `probe` is tried even while the tier backs off, and starts no
        subscription (a command that only asks whether Redis answers opens
        one connection).
        """
        if not probe and self._retry_at and time.monotonic() < self._retry_at:
            self._count("skipped")
            raise _Down(f"not tried: backing off for {self._delay:g} s after a failure")
        failure: BaseException | None = None
        at_work = _TIER_AT_WORK.set(self)  # for the connections opened meanwhile
        try:
            with anyio.move_on_after(self.settings.timeout):
                try:
                    result = await operation()
                except self._refused as exc:
                    self._recovered()
                    raise exc from None  # the server answered: hostile data, not an outage
                except Exception as exc:
                    failure = exc
                else:
                    self._recovered()
                    if not probe:
                        self._listen_soon()
                    return result
        finally:
            _TIER_AT_WORK.reset(at_work)
        raise _Down(self._failed(failure))

    def _failed(self, failure: BaseException | None) -> str:
        """Count the failure and back off; why it failed (the password hidden)."""
        self._count("failures")
        first = self._delay == 0.0
        self._delay = FIRST_RETRY_DELAY if first else min(self._delay * 2, MAX_RETRY_DELAY)
        self._retry_at = time.monotonic() + self._delay
        reason = (
            f"no answer within {self.settings.timeout} s"
            if failure is None
            else f"{type(failure).__name__}: {failure}"
        )
        cause = None if failure is None else (failure.__cause__ or failure.__context__)
        if cause is not None and str(cause) not in reason:
            # coredis says only "Unable to establish a connection"; the cause says
            # why (an untrusted certificate, a refused port).
            reason += f" ({type(cause).__name__}: {cause})"
        if self.settings.url in reason:
            reason = redact(reason)
        reason = clean(reason)  # a server's own words: no escape sequence reaches a log
        if first:
            self._count("outages")
            log.warning(
                "%s is unavailable (%s); serving from the local tier, retrying in %.1f s",
                self.describe(),
                reason,
                self._delay,
            )
        return reason

    def _recovered(self) -> None:
        if self._delay:
            log.warning("%s answers again; using the shared tier", self.describe())
            self._delay = 0.0
            self._retry_at = 0.0

    def _reject(self, rkey: bytes, why: str) -> None:
        self._count("rejected")
        self._warn_once(
            self._rejected, "%s: ignoring the value under %r: %s (a miss)", rkey, clean(why)
        )

    def _warn_once(self, warned: set[bytes], message: str, rkey: bytes, *args: object) -> None:
        """Log `message` (about `rkey`, after the tier) as a warning the first time for the key.

        Garbage under a key stays until it is evicted or deleted, and a warning
        per call that meets it would flood the log (each is counted all the
        same); past MAX_REJECTED_WARNED keys in `warned`, at DEBUG only.
        """
        if rkey in warned or len(warned) >= MAX_REJECTED_WARNED:
            log.debug(message, self.describe(), rkey, *args)
            return
        warned.add(rkey)
        last = len(warned) == MAX_REJECTED_WARNED
        log.warning(
            message + "%s",
            self.describe(),
            rkey,
            *args,
            "; further keys like it are logged at DEBUG only" if last else "",
        )

    def _count(self, name: str) -> None:
        self._counts[name] = self._counts.get(name, 0) + 1


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


def _client(
    settings: RemoteSettings, connections: int, tls: ssl.SSLContext | None
) -> coredis.Redis[bytes]:
    """A client that fails fast (the tier does the retrying) with a pool of `connections`;
    `tls`: the context `tls_context` made for a rediss:// URL."""
    import coredis
    from coredis.retry import NoRetryPolicy

    return coredis.Redis.from_url(
        settings.url,
        ssl_context=tls,  # None for redis://; for rediss:// coredis's own is never used
        decode_responses=False,
        verify_version=False,
        retry_policy=NoRetryPolicy(),
        max_connections=connections,
        connect_timeout=settings.timeout,
        pool_timeout=settings.timeout,
        # A connection that stops answering is torn down rather than kept.
        stream_timeout=max(1.0, 4 * settings.timeout),
    )


@functools.cache
def _sha1(script: bytes) -> str:
    """The hash EVALSHA runs our Lua `script` by (one of four constants)."""
    return hashlib.sha1(script, usedforsecurity=False).hexdigest()


def _digest(rkey: bytes, *body: bytes | memoryview) -> bytes:
    digest = hashlib.blake2b(rkey, digest_size=_DIGEST_SIZE)
    digest.update(b"\0")
    for part in body:
        digest.update(part)
    return digest.digest()


@final
class RemoteStorage(Storage):
    """A local storage with a shared tier behind it (see the module docstring)."""

    __slots__ = ("_local", "_namespace", "_tier")

    def __init__(self, local: Storage, tier: RemoteTier) -> None:
        self._local = local
        self._tier = tier
        self._namespace = local.namespace

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def local(self) -> Storage:
        """The first tier, this machine's storage."""
        return self._local

    @property
    def tier(self) -> RemoteTier:
        """The shared tier."""
        return self._tier

    async def get(self, key: bytes) -> bytes | None:
        value = await self._local.get(key)
        if value is not None:
            return value
        return await self._backfill(key)

    def get_blocking(self, key: bytes) -> bytes | None:
        # The local tier only: a miss here is `None`, and the caller then awaits
        # `get` on its event loop, which asks Redis there (within the tier's
        # timeout and backoff). Asking Redis from this thread would need a
        # client of its own per thread, or a wait on the loop thread anyway.
        return self._local.get_blocking(key)

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        keys = [check_key(key) for key in keys]
        found = await self._local.get_many(keys)
        for key in keys:
            if key not in found:
                value = await self._backfill(key)
                if value is not None:
                    found[key] = value
        return found

    async def insert(
        self,
        key: bytes,
        value: bytes,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        written_at: float | None = None,
    ) -> Insertion:
        if origin == Origin.LOCAL and written_at is None:
            written_at = wall_clock()  # one time, here and carried: the same entry
        result = await self._local.insert(key, value, origin, cost=cost, written_at=written_at)
        if origin == Origin.LOCAL and not isinstance(result, Conflict):
            # A write that failed locally (read-only disk) still helps the fleet.
            await self._tier.publish(self._namespace, key, value, cost=cost, written_at=written_at)
        return result

    async def insert_many(
        self,
        items: InsertItems,
        origin: Origin = Origin.LOCAL,
        *,
        cost: float | None = None,
        bundle: BundleRef | None = None,
    ) -> InsertSummary:
        if origin != Origin.LOCAL:
            return await self._local.insert_many(items, origin, cost=cost, bundle=bundle)
        pairs: list[tuple[bytes, bytes]] = []
        if isinstance(items, Iterable):
            pairs.extend(check_item(item) for item in items)
        else:
            pairs.extend([check_item(item) async for item in items])
        summary = await self._local.insert_many(pairs, origin, cost=cost, bundle=bundle)
        if summary.stored:
            for key, value in pairs:
                await self._tier.publish(self._namespace, key, value, cost=cost)
        return summary

    async def replace(
        self, key: bytes, value: bytes, origin: Origin = Origin.LOCAL, *, cost: float | None = None
    ) -> Stored | Failed:
        result = await self._local.replace(key, value, origin, cost=cost)
        if origin == Origin.LOCAL:
            await self._tier.publish(self._namespace, key, value, cost=cost)
        return result

    def scan(self, batch_size: int = DEFAULT_SCAN_BATCH) -> AsyncIterator[tuple[bytes, bytes]]:
        return self._local.scan(batch_size)

    async def purge(self) -> Purged | Failed:
        return await self._local.purge()

    async def purge_key(self, key: bytes) -> Purged | Failed:
        """Delete the entry here and the fleet's copy in Redis (see the module docstring).

        Redis first: a lookup here in between still finds the local entry,
        rather than fetching the copy back. The count is of this environment's
        entries. A copy that could not be deleted (Redis unavailable) is
        `Failed`, after the local entry is gone: it may come back from Redis,
        so the purge is worth repeating once Redis answers.
        """
        unreached = await self._tier.purge(self._namespace, check_key(key))
        purged = await self._local.purge_key(key)
        if unreached is None or isinstance(purged, Failed):
            return purged
        return Failed(
            f"the entry is purged from {self._local.describe()}, but not the shared copy"
            f" from {self._tier.describe()} ({unreached}); purge the key again once it answers"
        )

    async def summary(self) -> NamespaceSummary:
        return await self._local.summary()

    async def info(self, key: bytes) -> EntryInfo | None:
        return await self._local.info(key)

    async def touch(self, keys: Iterable[bytes]) -> int:
        return await self._local.touch(keys)

    def describe(self) -> str:
        return f"{self._local.describe()}, shared through {self._tier.describe()}"

    async def explain(self, key: bytes | None = None) -> Explanation | None:
        # The shared tier lists no namespaces: the local storage explains.
        return await self._local.explain(key)

    @asynccontextmanager
    async def lease(self, key: bytes) -> AsyncIterator[bytes | None]:
        """One computation of `key` fleet-wide (see `RemoteTier.lease`).

        A value another host computed is recorded locally, as a fetched one is.
        """
        async with self._tier.lease(self._namespace, check_key(key)) as landed:
            yield None if landed is None else await self._record(key, landed)

    async def _backfill(self, key: bytes) -> bytes | None:
        fetched = await self._tier.fetch(self._namespace, check_key(key))
        if fetched is None:
            return None
        return await self._record(key, fetched)

    async def _record(self, key: bytes, fetched: RemoteValue) -> bytes:
        value = check_value(fetched.value)
        result = await self._local.insert(
            key, value, Origin.REMOTE, cost=fetched.cost, written_at=fetched.written_at
        )
        if isinstance(result, Conflict):
            return result.existing  # a local value landed meanwhile: it wins
        return value
