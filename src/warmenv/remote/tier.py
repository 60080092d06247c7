"""One environment's connection to the shared tier: bounded calls, leases and wake-ups.

Every remote call is bounded: `remote_timeout` per operation, a connection
pool of fixed size, a cap on value size (a larger value stays local) and a
backoff after a failure, so a Redis that is down, slow or hostile costs each
call at most one timeout and then nothing until the next retry. One warning is
logged per outage, not per call. A value read from Redis is checked against
its frame (`warmenv.remote.wire`) before anything else sees it; wrong types,
oversized or garbled values under our keys are misses plus a warning (each
key warned about once, since garbage stays until it is deleted).

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
a server that refuses pub/sub). A Redis that fails means computing locally, as
without a remote, except for a waiter whose server stops answering (rather than
refusing): that server still holds the lease it saw, so it waits on for up to
`lease_ttl` since it saw it. A timeout is the server's: time our own busy loop
ran late is not counted against it (`warmenv.remote.lag`).

Key layout: `warmenv:<environment>:<namespace>:<hex of the key bytes>`. The
environment name cannot hold `:` and the hex part cannot either, so the last
`:` splits the namespace from the key unambiguously. A lease lives under the
value's key plus `:lease`, which no value key can end with (`l` and `s` are
not hex digits).
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import anyio
import attrs

from warmenv._errors import RemoteError
from warmenv._install import install_hint
from warmenv._text import brief, brief_repr
from warmenv._url import redact, redact_in
from warmenv.persistence.storage import wall_clock
from warmenv.remote import wire
from warmenv.remote.backfill import Backfill
from warmenv.remote.lag import LoopClock
from warmenv.remote.reader import Unread, over_bound
from warmenv.remote.report import Ping, RemoteStatistics
from warmenv.remote.settings import RemoteSettings, tls_context
from warmenv.remote.wire import BadFrame, RemoteValue

if TYPE_CHECKING:
    import coredis
    from anyio.abc import TaskGroup

__all__ = ["RemoteTier"]

log = logging.getLogger("warmenv.remote")
T = TypeVar("T")

# Without a subscription a waiter polls first after this long, then 1.5 times
# longer each time, up to the cap; with one it polls every lease_ttl / this.
FIRST_POLL_DELAY: Final = 0.002
MAX_POLL_DELAY: Final = 0.1
POLLS_PER_LEASE_TTL: Final = 10
# Keys whose unusable value is warned about, each once; past this many, at DEBUG only.
MAX_REJECTED_WARNED: Final = 100
# The first retry after a failure, doubled per failed retry up to `RemoteSettings.backoff`.
FIRST_RETRY_DELAY: Final = 0.25


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
            brief(record.getMessage()),
            "" if error is None else f" ({type(error).__name__}: {brief(error)})",
        )
        return False


_OUR_CONNECTIONS: Final = _OurConnections()


class _Down(Exception):
    """The remote did not answer (or is backing off): the caller falls back to local.

    `misconfigured`: it answered, refusing the URL's settings (see `_misconfigured`).
    """

    def __init__(self, reason: str, misconfigured: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.misconfigured = misconfigured


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
    _misconfigured: Callable[[BaseException], bool]
    """Whether an error is the server refusing the URL's settings (`misconfiguration`)."""
    _tasks: TaskGroup
    """Where the subscription runs, for as long as the tier is connected."""
    backfill: Backfill = attrs.field(init=False)
    """Fetched values on their way to the local tier (`warmenv.remote.backfill`)."""
    _prefix: bytes = attrs.field(init=False)
    _channel: bytes = attrs.field(init=False)
    _clock: LoopClock = attrs.field(init=False)
    _backstop: float = attrs.field(init=False)
    """The bound of a call on the loop's own clock (`wire.backstop`; see `lag`)."""
    _retry_at: float = attrs.field(init=False, default=0.0)
    _delay: float = attrs.field(init=False, default=0.0)
    # Whether a call is trying the server after a backoff (the others wait for its outcome).
    _retrying: bool = attrs.field(init=False, default=False)
    # Whether the outage is a server that does not answer (rather than one that refuses).
    _unanswered: bool = attrs.field(init=False, default=False)
    _counts: dict[str, int] = attrs.field(init=False, factory=dict)
    # The waiters on each value key, woken by a message on the channel.
    _waiters: dict[bytes, set[anyio.Event]] = attrs.field(init=False, factory=dict)
    _listening: bool = attrs.field(init=False, default=False)
    # The keys whose unusable value was warned about (each once, up to a bound).
    _rejected: set[bytes] = attrs.field(init=False, factory=set)
    # The keys whose value kept ours from being published (each warned about once).
    _blocked: set[bytes] = attrs.field(init=False, factory=set)
    _subscribed: bool = attrs.field(init=False, default=False)
    _over_bound: bool = attrs.field(init=False, default=False)  # warned once, for pub/sub

    def __attrs_post_init__(self) -> None:
        self._prefix = f"warmenv:{self.environment}:".encode()
        self._channel = self._prefix + b"landed"
        self._clock = LoopClock(self._tasks)
        self._backstop = wire.backstop(self.settings)
        self.backfill = Backfill(self.settings.max_backfill)

    @classmethod
    @asynccontextmanager
    async def connect(cls, settings: RemoteSettings, environment: str) -> AsyncIterator[RemoteTier]:
        """The tier for the duration of the block; connections open lazily, on first use."""
        try:
            from coredis import exceptions
            from coredis.exceptions import NoScriptError, WrongTypeError
        except ImportError:
            raise RemoteError(
                f"remote {redact(settings.url)!r} needs the redis extra: {install_hint('redis')}"
            ) from None
        # Added once (a logger keeps one of each filter), only once coredis is used.
        logging.getLogger("coredis").addFilter(_OUR_CONNECTIONS)
        # Reading the TLS files (and the system's CAs) is file I/O: not on the loop.
        tls = await anyio.to_thread.run_sync(tls_context, settings.url)
        client = wire.client(settings, settings.max_connections, tls)
        # The pool runs its connections in a task group around the block, and
        # the subscription runs in ours: an exception from the block is carried
        # past both, so that callers get it as raised rather than wrapped in an
        # exception group.
        escaped: BaseException | None = None
        async with client, anyio.create_task_group() as tasks:
            tier = cls(
                settings,
                environment,
                client,
                tls,
                WrongTypeError,
                NoScriptError,
                functools.partial(wire.misconfiguration, exceptions),
                tasks,
            )
            tasks.start_soon(tier.backfill.run)
            try:
                yield tier
            except BaseException as exc:
                escaped = exc
            await tier.backfill.close()  # shielded: what was fetched is written locally
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
            retries=c.get("retries", 0),
            outages=c.get("outages", 0),
            available=self._delay == 0.0,
            leases=c.get("leases", 0),
            lease_waits=c.get("lease_waits", 0),
            leases_lost=c.get("leases_lost", 0),
            woken=c.get("woken", 0),
            subscribed=self._subscribed,
            publish_blocked=c.get("publish_blocked", 0),
            backfill_pending=len(self.backfill),
            backfill_waits=self.backfill.waits,
            backfill_failed=self.backfill.failed,
            waited=self._clock.waited,
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
            return Ping(self.describe(), False, None, down.reason, down.misconfigured)
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
        return wire.HEADER + self.settings.max_value_bytes

    def _unframe(self, rkey: bytes, framed: bytes) -> RemoteValue | None:
        """The value in what GETRANGE read under `rkey`, counted; `None` if absent or unusable."""
        if not framed:
            self._count("misses")
            return None
        try:
            fetched = wire.unframe(rkey, framed, self.settings.max_value_bytes)
        except BadFrame as bad:
            self._reject(rkey, str(bad))
            return None
        self._count("hits")
        return fetched

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
        framed = wire.frame(rkey, value, wall_clock() if written_at is None else written_at, cost)
        args = (framed, self._channel)
        try:
            stored = await self._call(
                lambda: self._script(wire.PUBLISH, [rkey, rkey + wire.LEASE], args)
            )
        except _Down:
            return
        except Exception as exc:
            log.warning("%s refused to store %s: %s", self.describe(), brief_repr(rkey), brief(exc))
            self._count("failures")
            return
        if stored == -1:
            self._count("publish_blocked")
            self._warn_once(
                self._blocked,
                "%s: not publishing under %s: it holds something warmenv did not publish, and"
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
        lkey = rkey + wire.LEASE
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
        seen = 0.0  # when the lease was last seen held by another host
        until = 0.0  # when waiting gives up (max_lease_wait)
        while True:
            # Watching before the claim: a message that comes between the two is not lost.
            with self._watching(rkey) as landed:
                try:
                    state = await self._call(lambda: self._script(wire.CLAIM, [lkey, rkey], args))
                except _Down:
                    # A server that does not answer still holds the lease we saw, and its
                    # holder may still be computing: wait on (polling) while it can be held,
                    # up to lease_ttl since it was seen. One that refuses may have lost it.
                    if not (waited and self._unanswered and self._lease_may_hold(seen)):
                        return False, None
                    state = None  # not known now; waiting on
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
                if state == 0:
                    seen = time.monotonic()
                elif state is not None:
                    self._reject(lkey, "not a lease warmenv took (it never expires)")
                    return False, None
                if not waited:
                    waited = True
                    self._count("lease_waits")
                    until = time.monotonic() + self.settings.max_lease_wait
                elif time.monotonic() >= until:
                    # A lease renewed forever (forged, or a computation that never ends
                    # while its heartbeat runs) holds no one past the bound.
                    log.warning(
                        "%s: waited max_lease_wait=%g s for another host's lease on %s;"
                        " computing here",
                        self.describe(),
                        self.settings.max_lease_wait,
                        brief_repr(rkey),
                    )
                    return False, None
                if self._subscribed and not self._delay:
                    poll = self.settings.lease_ttl / POLLS_PER_LEASE_TTL
                else:
                    poll, delay = delay, min(delay * 1.5, MAX_POLL_DELAY)
                poll = min(poll, max(0.0, until - time.monotonic()))
                with anyio.move_on_after(poll):
                    await landed.wait()

    def _lease_may_hold(self, seen: float) -> bool:
        """Whether a lease seen held at `seen` may still be (it outlives a heartbeat by its TTL)."""
        return time.monotonic() - seen < self.settings.lease_ttl

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
            unread = Unread()  # the messages its connection read that are not handled yet
            try:
                # A client of its own: the pool multiplexes commands over its
                # connections, and one that is subscribed must carry nothing else.
                async with (
                    wire.client(self.settings, 1, self._tls, unread, timers=True) as client,
                    client.pubsub(
                        channels=[self._channel],
                        ignore_subscribe_messages=True,
                        retry_policy=NoRetryPolicy(),
                        subscription_timeout=wire.backstop(self.settings),
                        max_idle_seconds=self.settings.lease_ttl,
                    ) as subscription,
                ):
                    self._subscribed = True
                    delay = FIRST_RETRY_DELAY
                    while True:  # each message handled is counted, ignored ones too
                        message = await subscription.get_message()
                        unread.handled_one()
                        if message is not None and isinstance(rkey := message["data"], bytes):
                            for event in self._waiters.pop(rkey, ()):
                                self._count("woken")
                                event.set()
            except* Exception as group:
                # Waiters poll meanwhile; an outage is reported by the calls themselves.
                # (`except*`: coredis's teardown may fail beside a cancellation,
                # which must go on while its failure is dropped.)
                log.debug("%s: the subscription ended (%r)", self.describe(), group.exceptions)
                if not self._over_bound and (over := over_bound(group)) is not None:
                    self._over_bound = True
                    log.warning("%s: dropped the subscription: %s", self.describe(), over)
            finally:
                if self._subscribed:
                    self._subscribed = False
                    # Messages may be lost from now on and waiters poll slowly while
                    # subscribed: each looks again at once (and sees an outage, if any).
                    for events in self._waiters.values():
                        for event in events:
                            event.set()
            await anyio.sleep(delay)
            delay = min(delay * 2, self.settings.backoff)

    async def _heartbeat(self, lkey: bytes, token: bytes) -> None:
        args: tuple[bytes, int] = (token, round(self.settings.lease_ttl * 1000))
        beat = self.settings.lease_ttl / 3
        while True:
            await anyio.sleep(beat)
            try:
                kept = await self._call(lambda: self._script(wire.EXTEND, [lkey], args))
            except Exception:
                # Not answering (counted) or refusing: try again soon, so that the lease
                # is extended as soon as Redis answers again, before it runs out.
                beat = min(self.settings.lease_ttl / 3, MAX_POLL_DELAY)
                continue
            beat = self.settings.lease_ttl / 3
            if kept != 1:
                self._count("leases_lost")
                log.warning(
                    "%s: the lease %s expired while this host computed; another host may compute"
                    " the value too (raise lease_ttl if computations stall this long)",
                    self.describe(),
                    brief_repr(lkey),
                )
                return

    async def _script(self, source: bytes, keys: list[bytes], args: Iterable[object]) -> Any:
        """Run our Lua `source` by its hash, loading it where the server lacks it (a restart).

        A plain EVALSHA: coredis's `Script` wraps each call in a retry and a
        transform, which cost as much again as the round trip's own Python.
        """
        sha = wire.sha1(source)
        arguments: Any = list(args)
        try:
            return await self._client.evalsha(sha, keys=keys, args=arguments)
        except self._no_script:
            await self._client.script_load(source)
            return await self._client.evalsha(sha, keys=keys, args=arguments)

    async def _release(self, lkey: bytes, rkey: bytes, token: bytes) -> None:
        args = (token, self._channel)
        try:
            await self._call(lambda: self._script(wire.RELEASE, [lkey, rkey], args))
        except Exception:
            pass  # the lease expires within lease_ttl instead

    async def _call(self, operation: Callable[[], Awaitable[T]], *, probe: bool = False) -> T:
        """`await operation()` within the timeout; `_Down` if it fails or the tier backs off.

        A `probe` is tried even while the tier backs off, and starts no
        subscription (a command that only asks whether Redis answers opens
        one connection). Once a backoff is over, one call tries the server and
        the others are served locally until it knows. The timeout is the
        server's: time our own loop ran late does not count (`LoopClock`).
        """
        retrying = False
        if not probe and self._retry_at:
            if self._retrying or time.monotonic() < self._retry_at:
                self._count("skipped")
                raise _Down(f"not tried: backing off for {self._delay:g} s after a failure")
            retrying = self._retrying = True
            self._count("retries")
        failure: BaseException | None = None
        at_work = _TIER_AT_WORK.set(self)  # for the connections opened meanwhile
        try:
            with self._clock.deadline(self.settings.timeout, self._backstop):
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
            if retrying:
                self._retrying = False
        misconfigured = failure is not None and self._misconfigured(failure)
        raise _Down(self._failed(failure, misconfigured, probe), misconfigured)

    def _failed(
        self, failure: BaseException | None, misconfigured: bool = False, probe: bool = False
    ) -> str:
        """Count the failure and back off; why it failed (the password hidden).

        A server that refuses the URL's settings (`misconfigured`) is warned
        about as the configuration error it is, never as an outage (nor counted
        as one); it is still served from the local tier, and tried again after
        the backoff (a password rotated on the server). A probe's caller says it
        itself (`Ping.misconfigured`: the command line fails with it).
        """
        self._count("failures")
        first = self._delay == 0.0
        backoff = self.settings.backoff
        self._delay = min(FIRST_RETRY_DELAY if first else self._delay * 2, backoff)
        self._retry_at = time.monotonic() + self._delay
        # coredis's own timers (connecting, the subscription: `wire.client`) raise TimeoutError.
        self._unanswered = failure is None or isinstance(failure, TimeoutError)
        reason = (
            f"no answer within {self.settings.timeout} s"
            if failure is None
            else f"{type(failure).__name__}: {self._quoted(failure)}"
        )
        cause = None if failure is None else (failure.__cause__ or failure.__context__)
        if cause is not None and str(cause) not in str(failure):
            # coredis says only "Unable to establish a connection"; the cause says
            # why (an untrusted certificate, a refused port).
            reason += f" ({type(cause).__name__}: {self._quoted(cause)})"
        if first and misconfigured:
            if not probe:
                log.warning(
                    "%s refused the remote URL's settings (%s): a configuration error, not "
                    "an outage; fix the password, user or database number in the URL "
                    "(remote, WARMENV_REMOTE or --remote); serving from the local tier",
                    self.describe(),
                    reason,
                )
        elif first:
            self._count("outages")
            log.warning(
                "%s is unavailable (%s); serving from the local tier, retrying in %.1f s",
                self.describe(),
                reason,
                self._delay,
            )
        return reason

    def _quoted(self, error: BaseException) -> str:
        """A server's own words in a log line: the URL's credentials hidden (before the cut,
        so none is cut in half and missed), escape sequences written out, at most
        `BRIEF_LIMIT` characters (an error reply may be 64 KiB)."""
        return brief(redact_in(str(error), self.settings.url))

    def _recovered(self) -> None:
        if self._delay:
            log.info("%s answers again; using the shared tier", self.describe())
            self._delay = 0.0
            self._retry_at = 0.0
            self._unanswered = False

    def _reject(self, rkey: bytes, why: str) -> None:
        self._count("rejected")
        self._warn_once(
            self._rejected, "%s: ignoring the value under %s: %s (a miss)", rkey, brief(why)
        )

    def _warn_once(self, warned: set[bytes], message: str, rkey: bytes, *args: object) -> None:
        """Log `message` (about `rkey`, after the tier) as a warning the first time for the key.

        Garbage under a key stays until it is evicted or deleted, and a warning
        per call that meets it would flood the log (each is counted all the
        same); past MAX_REJECTED_WARNED keys in `warned`, at DEBUG only.
        """
        if rkey in warned or len(warned) >= MAX_REJECTED_WARNED:
            log.debug(message, self.describe(), brief_repr(rkey), *args)
            return
        warned.add(rkey)
        last = len(warned) == MAX_REJECTED_WARNED
        log.warning(
            message + "%s",
            self.describe(),
            brief_repr(rkey),
            *args,
            "; further keys like it are logged at DEBUG only" if last else "",
        )

    def _count(self, name: str) -> None:
        self._counts[name] = self._counts.get(name, 0) + 1
