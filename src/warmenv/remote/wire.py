"""What the tier says to Redis: the frame around a published value and the Lua scripts.

A value in Redis is framed (a magic marker, a digest bound to its key, what
its entry carries, the value) so that a host reads back only what a warmenv
host published under that very key: anything else under our keys (another
type, a string without the marker, a frame copied from another key, one cut
short) is told apart from a value and becomes a miss, never bytes handed to a
codec. The checks that must be one step with a write (publish if absent,
claim a lease or get the value, extend or release a lease only while it is
ours) are Lua scripts run by their hash, so each is one atomic round trip.

The client is built here too, with every coredis retry switched off: the
tier does its own bounded retrying and backing off.
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING, Any, Final

import attrs

from warmenv.persistence import carried
from warmenv.remote.reader import MAX_LINE, BoundedStream

if TYPE_CHECKING:
    import ssl

    import coredis
    from anyio.abc import ByteStream

    from warmenv.remote.reader import Unread
    from warmenv.remote.settings import RemoteSettings

__all__ = [
    "CLAIM",
    "EXTEND",
    "HEADER",
    "LEASE",
    "PUBLISH",
    "RELEASE",
    "BadFrame",
    "backstop",
    "RemoteValue",
    "client",
    "frame",
    "misconfiguration",
    "sha1",
    "unframe",
]


# A published value is framed: magic, then a digest of the key and the body, then the
# body: what the entry carries (`carried.pack`: written_at, cost), then the value.
# Frames of version 1 (warmenv 0.2.0.dev before costs were carried) have the value
# alone for a body; they still read, carrying nothing (unknown).
_MAGIC: Final = b"warmenv2"
_MAGIC_V1: Final = b"warmenv1"
_DIGEST_SIZE: Final = 16
_BODY: Final = len(_MAGIC) + _DIGEST_SIZE
_CARRIED: Final = 16
HEADER: Final = _BODY + _CARRIED
"""The bytes of a frame before its value."""
LEASE: Final = b":lease"  # a key's lease is its Redis key with this suffix
BACKSTOP: Final = 10.0

# KEYS: the value, its lease. ARGV: the framed value, the channel. 1 if stored, 0 if a
# value was there, -1 if what is there is no warmenv frame (another type, or a string
# without the marker or too short for a frame): it blocks the key until deleted, as the
# first value under a key stays. Told apart on the server, after SET NX failed: the
# publication that stores (every one but the first fleet-wide) stays one round trip of
# the same commands. Only a host waiting for a lease's holder listens for the message,
# so it is sent only while the key's lease is held: a plain insert costs no message (a
# waiter whose holder died finds the value by polling). Sent with pcall: a server that
# refuses PUBLISH still stores the value.
PUBLISH: Final = b"""
if redis.call('set', KEYS[1], ARGV[1], 'NX') then
  if redis.call('exists', KEYS[2]) == 1 then redis.pcall('publish', ARGV[2], KEYS[1]) end
  return 1
end
local head = redis.pcall('getrange', KEYS[1], 0, %d)
if type(head) ~= 'string' then return -1 end
local magic = string.sub(head, 1, %d)
if (magic == '%s' and #head >= %d) or (magic == '%s' and #head >= %d) then return 0 end
return -1
""" % (HEADER - 1, len(_MAGIC), _MAGIC, HEADER, _MAGIC_V1, _BODY)
# KEYS: the lease, the value. ARGV: our token, the TTL in ms, the last byte to read.
# The value (framed, read up to the byte given) if there is one, so that a waiter gets
# it in the same round trip; else 1: the lease is now ours; 0: another host holds it;
# -1: something sits under the lease key that no warmenv host took: it never expires,
# or expires later than any lease can (a lease never holds more than its TTL). A lease
# under our own token is ours: a claim whose answer came too late for the host (which
# then asks again, with the same token) took it.
CLAIM: Final = b"""
local framed = redis.call('getrange', KEYS[2], 0, ARGV[3])
if framed ~= '' then return framed end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.pcall('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
local left = redis.call('pttl', KEYS[1])
if left == -1 or left > tonumber(ARGV[2]) then return -1 end
return 0
"""
# KEYS: the lease. ARGV: our token, the TTL in ms. 1 if the lease was still ours.
EXTEND: Final = b"""
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: the lease, the value. ARGV: our token, the channel. Deletes the lease only if it
# is still ours; with no value behind it (the computation raised) waiters are woken to
# take over (after a value, its publication woke them already).
RELEASE: Final = b"""
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('del', KEYS[1])
if redis.call('exists', KEYS[2]) == 0 then redis.pcall('publish', ARGV[2], KEYS[2]) end
return 1
"""


@attrs.frozen
class RemoteValue:
    """A value read from Redis, with what its entry carried (each believed, or None)."""

    value: bytes
    written_at: float | None
    """Unix seconds when the host that computed it stored it."""
    cost: float | None
    """Seconds its computation took there."""


class BadFrame(Exception):
    """What sits under a key is no value warmenv published there; its text says why.

    A reason the tier counts and logs (a miss), never raised past it.
    """


def frame(rkey: bytes, value: bytes, written_at: float, cost: float | None) -> bytes:
    """`value` framed for Redis under `rkey`, carrying when it was written and its cost."""
    carrying = carried.pack(written_at, cost)
    return b"".join((_MAGIC, _digest(rkey, carrying, value), carrying, value))


def unframe(rkey: bytes, framed: bytes, max_value_bytes: int) -> RemoteValue:
    """The value in what GETRANGE read under `rkey` (up to `HEADER + max_value_bytes + 1`
    bytes, never empty); `BadFrame` if it is not a usable one."""
    too_large = f"larger than max_value_bytes={max_value_bytes}"
    if len(framed) > HEADER + max_value_bytes:
        raise BadFrame(too_large)
    magic = framed[: len(_MAGIC)]
    body = memoryview(framed)[_BODY:]
    if magic not in (_MAGIC, _MAGIC_V1) or framed[len(_MAGIC) : _BODY] != _digest(rkey, body):
        raise BadFrame("not a value warmenv published under this key")
    if magic == _MAGIC_V1:
        written_at = cost = None
        value = framed[_BODY:]
    elif len(body) < _CARRIED:
        raise BadFrame("a frame too short to hold what its entry carries")
    else:
        # What a value carries is believed as what a bundle's entry carries is.
        written_at, cost = carried.unpack(body[:_CARRIED])
        value = framed[HEADER:]
    if len(value) > max_value_bytes:
        raise BadFrame(too_large)
    return RemoteValue(value, written_at, cost)


def client(
    settings: RemoteSettings,
    connections: int,
    tls: ssl.SSLContext | None,
    unread: Unread | None = None,
    *,
    timers: bool = False,
) -> coredis.Redis[bytes]:
    """A client that fails fast (the tier does the retrying) with a pool of `connections`;
    `tls`: the context `tls_context` made for a rediss:// URL; `unread`: the count of a
    subscription's messages (only its connection may carry them).

    Connecting is bounded by coredis's timer at `backstop`; a command and a wait
    for a pooled connection are not (`timers=False`): the tier's clock bounds
    each of its calls, backstop included (`lag.LoopClock.deadline`), and
    coredis's two timers per command cost a remote hit a twentieth of its
    instructions. `timers=True` keeps them (a subscription, which no deadline
    of the tier's bounds).

    Its connections read through `reader.BoundedStream`: no reply or message over what
    the tier reads (a value at the cap, framed) is kept, nor any that no one asked for.
    """
    import coredis
    from coredis.connection import TCPConnection
    from coredis.retry import NoRetryPolicy

    max_frame = HEADER + settings.max_value_bytes + MAX_LINE

    class Bounded(TCPConnection):
        # coredis's documented extension point: a connection class makes its transport.
        async def _connect(self) -> ByteStream:
            return BoundedStream(await super()._connect(), max_frame, unread)

    pool = coredis.ConnectionPool.from_url(
        settings.url,
        ssl_context=tls,  # None for redis://; for rediss:// coredis's own is never used
        decode_responses=False,
        max_connections=connections,
        # coredis's timers run on the loop's clock, which a busy host makes late: they
        # are a backstop only, far past the tier's own bound (`lag.LoopClock`).
        connect_timeout=backstop(settings),
        timeout=backstop(settings) if timers else None,
        stream_timeout=backstop(settings) if timers else None,
    )
    pool.connection_class = Bounded
    return coredis.Redis(
        connection_pool=pool,
        decode_responses=False,
        verify_version=False,
        retry_policy=NoRetryPolicy(),
    )


def backstop(settings: RemoteSettings) -> float:
    """How long coredis itself waits, on the loop's clock, before giving up on a server."""
    return max(BACKSTOP, 8 * settings.timeout)


@functools.cache
def sha1(script: bytes) -> str:
    """The hash EVALSHA runs our Lua `script` by (one of four constants)."""
    return hashlib.sha1(script, usedforsecurity=False).hexdigest()


def _digest(rkey: bytes, *body: bytes | memoryview) -> bytes:
    digest = hashlib.blake2b(rkey, digest_size=_DIGEST_SIZE)
    digest.update(b"\0")
    for part in body:
        digest.update(part)
    return digest.digest()


def misconfiguration(exceptions: Any, error: BaseException) -> bool:
    """Whether `error` is the server refusing the URL's settings, not failing to answer.

    The one list of them (`exceptions` is `coredis.exceptions`): a wrong or
    missing password or user (`WRONGPASS`, `NOAUTH`: AuthenticationError), an
    ACL that forbids warmenv's commands (`NOPERM`: AuthorizationError), and a
    database number the server does not have ("DB index is out of range").
    """
    if isinstance(error, exceptions.AuthenticationError | exceptions.AuthorizationError):
        return True
    return isinstance(error, exceptions.ResponseError) and "DB index" in str(error)
