"""A remote call's deadline: ours when it falls due, the caller's when the caller cancels.

A real redis-server behind a proxy of the test's own that can hold the
server's replies, all of a reply or all but its first bytes, until the test
releases them: a server that stops answering mid-call, without sleeps. The
tier's deadline falling due inside a caller's cancel scope is the tier's
timeout (a miss, an outage counted), never the caller's cancellation; a
caller's scope that falls due first cancels the call and nothing else (no
outage, and on asyncio no cancellation request left behind on the task). A
reply that comes after its call gave up is read by no other call: the next
call on the connection gets its own answer.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest

from redis_server import COREDIS_UNCLOSED_STREAMS, RedisServer
from warmenv import Namespace, open_environment
from warmenv.remote import RemoteSettings, RemoteTier

pytestmark = [pytest.mark.anyio, *COREDIS_UNCLOSED_STREAMS]

NS = Namespace("app", "kernels", version="1").full
TIMEOUT = 0.25
VALUES = {b"a": b"A" * 300, b"b": b"B" * 300, b"c": b"C" * 300}
ASYNCIO_ONLY = pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param("asyncio", id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ],
)


class HoldingProxy:
    """A TCP proxy to a server that forwards the server's bytes until told to hold them.

    Threads of its own, so that it runs whatever the test's event loop does.
    `hold(after)`: each connection forwards `after` more bytes from the server,
    then holds the rest; `release()`: everything held flows again, in order.
    """

    def __init__(self, port: int) -> None:
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        self._state = threading.Condition()
        self._held = False
        self._after = 0
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def hold(self, after: int = 0) -> None:
        with self._state:
            self._held, self._after = True, after

    def release(self) -> None:
        with self._state:
            self._held = False
            self._state.notify_all()

    def close(self) -> None:
        self.release()
        self._listener.close()
        with self._state:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(("127.0.0.1", self._target))
            with self._state:
                self._sockets += [client, server]
            for pump in (self._to_server, self._to_client):
                thread = threading.Thread(target=pump, args=(client, server), daemon=True)
                thread.start()

    def _to_server(self, client: socket.socket, server: socket.socket) -> None:
        self._pump(client, server, held=False)

    def _to_client(self, client: socket.socket, server: socket.socket) -> None:
        self._pump(server, client, held=True)

    def _pump(self, source: socket.socket, sink: socket.socket, held: bool) -> None:
        allowed: int | None = None  # this connection's bytes left before holding
        try:
            while data := source.recv(65536):
                while data:
                    with self._state:
                        if not (held and self._held):
                            allowed = None
                            part = len(data)
                        else:
                            if allowed is None:
                                allowed = self._after
                            while self._held and allowed == 0:
                                self._state.wait()
                            part = len(data) if not self._held else min(allowed, len(data))
                            if self._held:
                                allowed -= part
                    sink.sendall(data[:part])
                    data = data[part:]
        except OSError:
            pass  # closed by `close` or by the other side
        finally:
            sink.close()


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[HoldingProxy]:
    running = HoldingProxy(server.port)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
async def tier(proxy: HoldingProxy, tmp_path: Path) -> AsyncIterator[RemoteTier]:
    """A tier whose calls go through the proxy, the values of `VALUES` published, connected."""
    async with _tier(proxy, tmp_path, TIMEOUT) as tier:
        yield tier


@pytest.fixture
async def patient_tier(proxy: HoldingProxy, tmp_path: Path) -> AsyncIterator[RemoteTier]:
    """`tier` with a deadline 8x as far (the most the default lease allows): the caller cancels."""
    async with _tier(proxy, tmp_path, 2.0) as tier:
        yield tier


@asynccontextmanager
async def _tier(proxy: HoldingProxy, tmp_path: Path, seconds: float) -> AsyncIterator[RemoteTier]:
    settings = RemoteSettings(proxy.url, timeout=seconds)
    async with open_environment("fleet", root=tmp_path, remote=settings) as env:
        assert env.remote is not None
        for key, value in VALUES.items():
            await env.remote.publish(NS, key, value)
        assert env.remote.statistics().published == len(VALUES)
        yield env.remote


async def _value(tier: RemoteTier, key: bytes) -> bytes | None:
    fetched = await tier.fetch(NS, key)
    return None if fetched is None else fetched.value


def _no_cancellation_left() -> None:
    """On asyncio, the task holds no request to cancel it (each one ours made, undone)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return  # trio: a cancellation is a scope's state, nothing left on the task
    assert task is not None and task.cancelling() == 0


@contextmanager
def _outer(kind: str) -> Iterator[anyio.CancelScope]:
    if kind == "scope":
        with anyio.CancelScope() as scope:
            yield scope
    elif kind == "far deadline":
        with anyio.move_on_after(60) as scope:
            yield scope
    else:
        with anyio.CancelScope(shield=True) as scope:
            yield scope


async def test_a_caller_s_scope_cancels_a_call_in_flight_and_is_no_outage(
    tier: RemoteTier, proxy: HoldingProxy
) -> None:
    proxy.hold()
    with anyio.move_on_after(TIMEOUT / 5) as outer:  # the tier's own deadline is further
        await tier.fetch(NS, b"a")
        pytest.fail("the caller's scope did not cancel the call")
    assert outer.cancelled_caught
    _no_cancellation_left()
    stats = tier.statistics()
    assert (stats.failures, stats.outages, stats.available) == (0, 0, True)
    proxy.release()
    assert await _value(tier, b"b") == VALUES[b"b"]
    assert await _value(tier, b"a") == VALUES[b"a"]


@pytest.mark.parametrize("kind", ["scope", "far deadline", "shielded scope"])
async def test_the_tier_s_deadline_inside_a_caller_s_scope_is_its_timeout(
    tier: RemoteTier, proxy: HoldingProxy, kind: str
) -> None:
    proxy.hold()
    reached = False
    with _outer(kind) as outer:
        assert await _value(tier, b"a") is None
        reached = True
    assert reached and not outer.cancelled_caught and not outer.cancel_called
    _no_cancellation_left()
    stats = tier.statistics()
    assert (stats.failures, stats.outages, stats.available) == (1, 1, False)
    # The caller goes on in its scope: awaiting there is not cancelled either.
    with anyio.fail_after(10):
        await anyio.lowlevel.checkpoint()


@pytest.mark.parametrize("after", [0, 10], ids=["no byte of it", "its first bytes"])
async def test_a_reply_that_comes_after_its_call_gave_up_is_read_by_no_other_call(
    tier: RemoteTier, proxy: HoldingProxy, after: int
) -> None:
    proxy.hold(after)
    assert await _value(tier, b"a") is None  # the tier's timeout, the reply held
    proxy.release()
    ping = await tier.ping()  # ends the outage: the server answers again
    assert ping.reachable, ping
    assert await _value(tier, b"b") == VALUES[b"b"]
    assert await _value(tier, b"a") == VALUES[b"a"]
    assert await _value(tier, b"c") == VALUES[b"c"]


async def test_replies_to_calls_side_by_side_that_gave_up_are_read_by_no_other_call(
    tier: RemoteTier, proxy: HoldingProxy
) -> None:
    proxy.hold(10)
    got: dict[bytes, bytes | None] = {}

    async def fetch(key: bytes) -> None:
        got[key] = await _value(tier, key)

    async with anyio.create_task_group() as tasks:
        for key in VALUES:
            tasks.start_soon(fetch, key)
    assert got == dict.fromkeys(VALUES)  # each call's timeout
    proxy.release()
    assert (await tier.ping()).reachable
    for key in (b"c", b"a", b"b"):
        assert await _value(tier, key) == VALUES[key]


@ASYNCIO_ONLY
async def test_an_asyncio_timeout_around_a_call_cancels_it_and_is_no_outage(
    tier: RemoteTier, proxy: HoldingProxy
) -> None:
    proxy.hold()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(TIMEOUT / 5):
            await tier.fetch(NS, b"a")
    _no_cancellation_left()
    stats = tier.statistics()
    assert (stats.failures, stats.outages) == (0, 0)
    proxy.release()
    assert await _value(tier, b"a") == VALUES[b"a"]


@ASYNCIO_ONLY
async def test_the_tier_s_deadline_inside_an_asyncio_timeout_is_its_own(
    tier: RemoteTier, proxy: HoldingProxy
) -> None:
    proxy.hold()
    async with asyncio.timeout(60) as outer:
        assert await _value(tier, b"a") is None
    assert not outer.expired()
    _no_cancellation_left()
    assert tier.statistics().outages == 1


@ASYNCIO_ONLY
async def test_a_task_cancelled_during_a_call_is_cancelled(
    patient_tier: RemoteTier, proxy: HoldingProxy
) -> None:
    # A patient tier: on a loaded machine a 0.25 s deadline could fall due before the
    # cancel below, and the call would end as the tier's timeout (another test's case).
    tier = patient_tier
    proxy.hold()
    call = asyncio.ensure_future(tier.fetch(NS, b"a"))
    await anyio.wait_all_tasks_blocked()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert tier.statistics().failures == 0


@pytest.mark.parametrize("first", ["caller", "deadline"])
async def test_a_caller_s_cancel_and_the_deadline_in_one_tick_never_leak_past_the_caller_s_scope(
    first: str,
) -> None:
    """The two cancellations land in the same loop pass while the call waits at a bare
    checkpoint (the attacker review's HIGH: ours, made second, replaced anyio's message,
    and anyio's scope let the `CancelledError` through to kill the caller's task)."""
    from warmenv.remote.lag import Deadline, LoopClock

    parked = anyio.Event()
    deadline: list[Deadline] = []
    after_the_call: list[str] = []

    async def call(clock: LoopClock) -> None:
        with clock.deadline(60) as due:
            deadline.append(due)
            parked.set()
            while True:
                await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tasks:
        clock = LoopClock(tasks)
        with anyio.CancelScope() as caller:

            async def cancel_both() -> None:
                await parked.wait()
                if first == "caller":
                    caller.cancel()
                    deadline[0].fall_due()
                else:
                    deadline[0].fall_due()
                    caller.cancel()

            tasks.start_soon(cancel_both)
            await call(clock)
            await anyio.lowlevel.checkpoint()
            after_the_call.append("a checkpoint inside the cancelled scope went on")
        assert caller.cancelled_caught
        assert not after_the_call
        _no_cancellation_left()
        tasks.cancel_scope.cancel()  # the clock's ticker
