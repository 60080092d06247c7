"""What a Redis server may make us hold: every reply and message bounded before it is kept.

coredis reads whatever a server sends into its parser's buffer until a reply
is whole, and queues pub/sub messages without bound: a server (or anyone
between us and it) announcing a 2 GiB reply, sending a 4 GiB message or a
flood of small ones would grow our memory without end. So the tier's
connections read through `BoundedStream`, which follows the RESP3 framing as
the bytes pass (headers only: a bulk string's body is counted, not copied)
and refuses a frame whose announced or actual size is over the bound, before
coredis allocates for it; a frame nested deeper than `MAX_DEPTH` or holding
more than `MAX_ELEMENTS` elements, which no command of ours gets and which
would cost coredis's recursive parser (and ours) CPU time by the element (a
20 MB reply of one-element arrays nested 5 million deep took 2.8 s of a 0.5 s
timeout, as the tier's clock counts our own busy loop as no server time, then
a `RecursionError`); and what coredis would queue unasked: a connection
may only answer the commands sent on it, and only a subscription's connection
may carry pub/sub messages. A refusal breaks that connection, as a server
that stops answering would: the tier calls it an outage and warns once. On the
subscription's connection, bytes are taken from the socket only while fewer
than `MAX_UNREAD` messages wait to be handled, so a flood waits in the
server's buffers (which Redis bounds, `client-output-buffer-limit pubsub`),
not in ours.

The stream is given to coredis through its documented extension point, a
connection class's `_connect` (see `wire.client`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, final

import anyio
from anyio.abc import ByteStream

__all__ = [
    "MAX_DEPTH",
    "MAX_ELEMENTS",
    "MAX_LINE",
    "MAX_UNREAD",
    "BoundedStream",
    "OverBound",
    "Unread",
    "over_bound",
]

MAX_LINE: Final = 64 * 1024
"""The longest header or simple line (a RESP3 type, a length, an error text) we keep."""
MAX_UNREAD: Final = 64
"""Pub/sub messages read but not yet handled, past which the socket is left unread."""
MAX_DEPTH: Final = 8
"""The deepest nesting of aggregates a reply or message may have (HELLO's is 4: a map,
its module list, a module's map, its arguments)."""
MAX_ELEMENTS: Final = 4096
"""The most elements a reply or message may hold in all its aggregates (ours hold tens)."""

_BULK: Final = frozenset(b"$=!")  # bulk string, verbatim string, bulk error: a body follows
_AGGREGATE: Final = frozenset(b"*~>")  # array, set, push: that many elements follow
_PAIRS: Final = frozenset(b"%|")  # map, attribute: twice that many
_SIMPLE: Final = frozenset(b"+-:_,#(")
_PUSH: Final = ord(">")
_ATTRIBUTE: Final = ord("|")
_ARRAY: Final = ord("*")
_STRING: Final = ord("$")


class OverBound(Exception):
    """A server sent more than the tier reads; its text says what (a broken connection)."""


def over_bound(error: BaseException | None) -> OverBound | None:
    """The `OverBound` behind `error` (a group, or a cause), if a bound broke the connection."""
    if isinstance(error, OverBound) or error is None:
        return error
    if isinstance(error, BaseExceptionGroup):
        return next(filter(None, map(over_bound, error.exceptions)), None)
    return over_bound(error.__cause__ or error.__context__)


@final
class Unread:
    """How many pub/sub messages were read off the socket and not yet handled."""

    def __init__(self) -> None:
        self.read = 0  # set by the connection's stream
        self.handled = 0
        self._room = anyio.Event()

    def handled_one(self) -> None:
        self.handled += 1
        self._room.set()

    async def room(self) -> None:
        """Return once fewer than MAX_UNREAD messages wait."""
        while self.read - self.handled >= MAX_UNREAD:
            self._room = anyio.Event()
            await self._room.wait()


@final
class BoundedStream(ByteStream):
    """`stream`, refusing what the tier does not read (see the module docstring).

    `unread`: the subscription's count of messages (else none may come).
    """

    def __init__(self, stream: ByteStream, max_frame: int, unread: Unread | None) -> None:
        self._stream = stream
        self._unread = unread
        self._received = _Frames(max_frame)
        self._sent = _Frames(None)  # our own commands: one reply due for each at most
        self._partial = bytearray()  # a frame under way, not handed to coredis yet

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """The next bytes, ending where a frame ends.

        coredis empties its parser's buffer only when it has parsed all of it: a
        stream of frames cut anywhere would keep everything ever received there.
        So the part of a frame not yet whole waits here (one frame, bounded).
        """
        received = self._received
        while True:
            if self._unread is not None:
                await self._unread.room()
            data = await self._stream.receive(max_bytes)
            whole = received.follow(data)
            if received.replies > self._sent.frames:
                raise OverBound("a reply to no command (coredis would keep it)")
            if self._unread is None:
                if received.pushes:
                    raise OverBound("a pub/sub message on a connection subscribed to nothing")
            else:
                self._unread.read = received.pushes
            if whole < 0:
                self._partial += data
                continue
            if whole == len(data) and not self._partial:
                return data  # the common case (a reply in one read): nothing to copy
            ready = bytes(self._partial) + data[:whole]
            self._partial[:] = data[whole:]
            return ready

    async def send(self, item: bytes) -> None:
        self._sent.follow_commands(item)
        await self._stream.send(item)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self._stream.extra_attributes


@final
class _Frames:
    """Follows RESP3 framing through a byte stream (headers only), counting whole frames."""

    def __init__(self, max_frame: int | None) -> None:
        self._max_frame = max_frame
        self._line = bytearray()
        self._skip = 0  # bytes of a bulk body (and its CRLF) still to pass
        self._open: list[int] = []  # elements still due in each open aggregate
        self._size = 0  # bytes of the frame under way
        self._elements = 0  # elements announced by the frame under way's aggregates
        self._push = False  # whether the frame under way is a push (a pub/sub message)
        self.frames = 0
        self.pushes = 0

    @property
    def replies(self) -> int:
        return self.frames - self.pushes

    def follow(self, data: bytes) -> int:
        """Follow the framing through `data`; `OverBound` if a frame is too large.

        Where in `data` the last frame completed there ends (-1: none did).
        """
        pos, end = 0, len(data)
        whole = -1
        while pos < end:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                if not self._skip and self._element():
                    whole = pos
                continue
            newline = data.find(b"\n", pos)
            stop = end if newline == -1 else newline + 1
            self._line += data[pos:stop]
            self._grow(stop - pos)
            pos = stop
            if len(self._line) > MAX_LINE:
                raise OverBound(f"a line of more than {MAX_LINE} bytes")
            if newline != -1:
                line = bytes(self._line)
                self._line.clear()
                if self._header(line):
                    whole = pos
        return whole

    def follow_commands(self, data: bytes) -> None:
        """Count the commands in `data` we send, stepping from length to length.

        coredis sends whole commands, each an array of bulk strings: their
        lengths say where each ends, with no need to copy and read every line
        as `follow` does (a third of a remote hit's reading, at 5 lines a
        GETRANGE). Anything else (a command cut short, another type) is
        followed by `follow`, from where the frames stand.
        """
        if self._line or self._skip or self._open:
            self.follow(data)
            return
        pos, end, commands = 0, len(data), 0
        try:
            while pos < end:
                newline = data.index(b"\r\n", pos)
                if data[pos] != _ARRAY:
                    raise ValueError
                elements = int(data[pos + 1 : newline])
                pos = newline + 2
                for _ in range(elements):
                    newline = data.index(b"\r\n", pos)
                    if data[pos] != _STRING:
                        raise ValueError
                    length = int(data[pos + 1 : newline])
                    pos = newline + 4 + length
                    if length < 0 or data[pos - 2 : pos] != b"\r\n":
                        raise ValueError
                commands += 1
        except (ValueError, IndexError):
            self.follow(data)
            return
        self.frames += commands

    def _grow(self, size: int) -> None:
        self._size += size
        if self._max_frame is not None and self._size > self._max_frame:
            raise OverBound(f"a reply or message of more than {self._max_frame} bytes")

    def _header(self, line: bytes) -> bool:
        """Follow one header line; whether it completed a frame."""
        marker, body = line[0], line[1:].rstrip(b"\r\n")
        if not self._open:
            self._push = marker == _PUSH
        if marker in _SIMPLE:
            return self._element()
        try:
            length = int(body)
        except ValueError:
            raise OverBound(f"not RESP3: {line[:40]!r}") from None
        if marker in _BULK:
            if length < 0:
                return self._element()
            if self._max_frame is not None and length > self._max_frame:
                raise OverBound(f"a reply or message of {length} bytes announced")
            self._grow(length + 2)  # counted as announced, before any of it is kept
            self._skip = length + 2
            return False
        if marker in _PAIRS:
            # An attribute's pairs come before the value they annotate: one more element.
            length = 2 * length + (marker == _ATTRIBUTE)
        elif marker not in _AGGREGATE:
            raise OverBound(f"not RESP3: {line[:40]!r}")
        if length <= 0:
            return self._element()
        if self._max_frame is not None:
            # Bounded before the frame is parsed: the parsers' time grows by the element.
            if len(self._open) >= MAX_DEPTH:
                raise OverBound(f"a reply or message nested more than {MAX_DEPTH} deep")
            self._elements += length
            if self._elements > MAX_ELEMENTS:
                raise OverBound(f"a reply or message of more than {MAX_ELEMENTS} elements")
        self._open.append(length)
        return False

    def _element(self) -> bool:
        """One element is whole: close the aggregates it completes; whether the frame is."""
        while self._open:
            self._open[-1] -= 1
            if self._open[-1]:
                return False
            self._open.pop()
        self._size = self._elements = 0
        self.frames += 1
        self.pushes += self._push
        return True
