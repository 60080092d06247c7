from __future__ import annotations

import gc
import math

import anyio
import pytest
from anyio import WouldBlock, wait_all_tasks_blocked
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from warmenv import WarmenvError
from warmenv.channel import ChannelClosed, bounded, oneshot, unbounded

pytestmark = pytest.mark.anyio


async def test_bounded_returns_anyio_memory_streams_with_that_capacity() -> None:
    send, receive = bounded(2)
    assert isinstance(send, MemoryObjectSendStream)
    assert isinstance(receive, MemoryObjectReceiveStream)
    assert send.statistics().max_buffer_size == 2
    send.send_nowait(1)
    send.send_nowait(2)
    with pytest.raises(WouldBlock):
        send.send_nowait(3)
    assert [receive.receive_nowait(), receive.receive_nowait()] == [1, 2]
    send.close()
    receive.close()


async def test_bounded_rejects_a_negative_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        bounded(-1)


async def test_unbounded_never_makes_a_sender_wait() -> None:
    send, receive = unbounded()
    assert send.statistics().max_buffer_size == math.inf
    for i in range(10_000):
        send.send_nowait(i)
    send.close()
    with receive:
        assert [item async for item in receive] == list(range(10_000))


async def test_oneshot_delivers_its_value_to_a_waiting_receiver() -> None:
    sender, receiver = oneshot()
    got: list[object] = []

    async def receive() -> None:
        got.append(await receiver.receive())

    async with anyio.create_task_group() as tg:
        tg.start_soon(receive)
        await wait_all_tasks_blocked()
        sender.send("value")
    assert got == ["value"]


async def test_oneshot_send_never_blocks_without_a_receiver() -> None:
    sender, receiver = oneshot()
    sender.send(1)
    assert receiver.receive_nowait() == 1


async def test_oneshot_second_send_raises() -> None:
    sender, _ = oneshot()
    sender.send(1)
    with pytest.raises(RuntimeError, match="sends once"):
        sender.send(2)


async def test_oneshot_send_after_close_raises() -> None:
    sender, _ = oneshot()
    sender.close()
    with pytest.raises(RuntimeError, match="closed"):
        sender.send(1)


async def test_oneshot_receiver_learns_the_sender_closed_without_sending() -> None:
    sender, receiver = oneshot()

    async def close_later() -> None:
        await wait_all_tasks_blocked()
        sender.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(close_later)
        with pytest.raises(ChannelClosed):
            await receiver.receive()
    assert issubclass(ChannelClosed, WarmenvError)


async def test_oneshot_sender_garbage_collected_unsent_closes_the_channel() -> None:
    sender, receiver = oneshot()
    del sender
    gc.collect()
    with pytest.raises(ChannelClosed, match="garbage-collected"):
        await receiver.receive()


async def test_oneshot_receive_nowait_before_send_would_block() -> None:
    _sender, receiver = oneshot()
    with pytest.raises(WouldBlock):
        receiver.receive_nowait()


async def test_oneshot_receiver_cancelled_while_waiting_can_receive_later() -> None:
    sender, receiver = oneshot()
    with anyio.move_on_after(0) as scope:
        await receiver.receive()
    assert scope.cancelled_caught
    sender.send("late")
    assert await receiver.receive() == "late"
