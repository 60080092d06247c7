"""Channels between tasks.

Bounded and unbounded channels are anyio's memory object streams, returned
as they are so that every anyio idiom (cloning, `async for`, closing) works.
The one shape anyio lacks is the oneshot: a single value handed from one task
to another, where the receiver must learn if the sender went away without
answering instead of waiting forever.

The constructors are classes for the same reason anyio's
`create_memory_object_stream` is one: `bounded[T](n)` names the item type
at the call, so a type checker holds every send and receive to it. Written
without a subscript they make `Any` channels, as they always did.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Generic, final

from anyio import Event, WouldBlock, create_memory_object_stream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from warmenv._errors import WarmenvError

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:
    from typing_extensions import TypeVar

__all__ = [
    "ChannelClosed",
    "OneshotReceiver",
    "OneshotSender",
    "bounded",
    "oneshot",
    "unbounded",
]

T = TypeVar("T")
# The item type of an unsubscripted `bounded(n)` is `Any`, not an error
# asking for an annotation: the 0.1 spelling keeps type-checking.
T_Item = TypeVar("T_Item", default=Any)


class ChannelClosed(WarmenvError):
    """The sending side of a oneshot channel closed without sending a value."""


@final
class bounded(tuple[MemoryObjectSendStream[T_Item], MemoryObjectReceiveStream[T_Item]]):
    """A channel holding at most `capacity` items; senders wait when it is full.

    `send, receive = bounded[T](capacity)` types both ends by `T`.
    """

    def __new__(  # type: ignore[misc]  # returns the pair, like anyio's constructor
        cls, capacity: int
    ) -> tuple[MemoryObjectSendStream[T_Item], MemoryObjectReceiveStream[T_Item]]:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        return create_memory_object_stream[T_Item](capacity)


@final
class unbounded(tuple[MemoryObjectSendStream[T_Item], MemoryObjectReceiveStream[T_Item]]):
    """A channel whose senders never wait (memory grows with the backlog).

    `send, receive = unbounded[T]()` types both ends by `T`.
    """

    def __new__(  # type: ignore[misc]  # returns the pair, like anyio's constructor
        cls,
    ) -> tuple[MemoryObjectSendStream[T_Item], MemoryObjectReceiveStream[T_Item]]:
        return create_memory_object_stream[T_Item](math.inf)


@final
class _Slot(Generic[T]):
    __slots__ = ("closed", "filled", "ready", "value")

    def __init__(self) -> None:
        self.ready = Event()
        self.filled = False
        self.closed = False
        self.value: T


@final
class OneshotSender(Generic[T]):
    """Sends exactly one value; closing it (or dropping it) unsent wakes the receiver."""

    __slots__ = ("__weakref__", "_slot")

    def __init__(self, slot: _Slot[T]) -> None:
        self._slot = slot

    def send(self, value: T) -> None:
        """Deliver `value`; never blocks. `RuntimeError` if already sent or closed."""
        slot = self._slot
        if slot.filled:
            raise RuntimeError("this oneshot channel has already sent its value; it sends once")
        if slot.closed:
            raise RuntimeError("this oneshot sender is closed; create a new oneshot() to send")
        slot.value = value
        slot.filled = True
        slot.ready.set()

    def close(self) -> None:
        """Give up sending: the receiver gets `ChannelClosed`. Idempotent."""
        slot = self._slot
        if not slot.filled and not slot.closed:
            slot.closed = True
            slot.ready.set()

    def __del__(self) -> None:
        self.close()


@final
class OneshotReceiver(Generic[T]):
    """Receives the one value of a oneshot channel."""

    __slots__ = ("_slot",)

    def __init__(self, slot: _Slot[T]) -> None:
        self._slot = slot

    async def receive(self) -> T:
        """Wait for the value; `ChannelClosed` if the sender closed without sending."""
        slot = self._slot
        await slot.ready.wait()
        return self._take()

    def receive_nowait(self) -> T:
        """The value if it was sent; `WouldBlock` if not yet, `ChannelClosed` if never."""
        if not self._slot.ready.is_set():
            raise WouldBlock
        return self._take()

    def _take(self) -> T:
        slot = self._slot
        if slot.filled:
            return slot.value
        raise ChannelClosed(
            "the oneshot sender was closed or garbage-collected without sending a value"
        )


@final
class oneshot(tuple[OneshotSender[T_Item], OneshotReceiver[T_Item]]):
    """A channel for a single value: `(sender, receiver)`.

    `sender, receiver = oneshot[T]()` types both ends by `T`.
    """

    def __new__(  # type: ignore[misc]  # returns the pair, like anyio's constructor
        cls,
    ) -> tuple[OneshotSender[T_Item], OneshotReceiver[T_Item]]:
        slot: _Slot[T_Item] = _Slot()
        return OneshotSender(slot), OneshotReceiver(slot)
