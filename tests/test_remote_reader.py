"""The commands we send are counted from their lengths, as many as `follow` counts.

A connection may only answer the commands sent on it (`reader.BoundedStream`):
the count of commands sent is what bounds the replies taken. coredis's own
packer builds the commands here, as on a connection. A reply's shape is
bounded as its size is: nested deeper, or holding more elements, than any reply
to our commands, it is refused at the header that goes too far.
"""

from __future__ import annotations

import pytest
from coredis._packer import Packer

from warmenv.remote.reader import MAX_DEPTH, MAX_ELEMENTS, OverBound, _Frames

# GETRANGE (a hit), EVALSHA with a value over coredis's 6,000-byte chunk, a two-word
# command (split in two), an argument holding what looks like framing.
_COMMANDS: list[tuple[bytes, ...]] = [
    (b"GETRANGE", b"warmenv:key", b"0", b"1048616"),
    (b"EVALSHA", b"f" * 40, b"2", b"a", b"b", b"x" * 10_000, b"chan"),
    (b"SCRIPT LOAD", b"return 1"),
    (b"SET", b"k", b"*3\r\n$1\r\n\r\n+OK\r\n"),
]


def _packed(commands: list[tuple[bytes, ...]]) -> bytes:
    return b"".join(Packer("utf-8").pack_commands(list(commands)))


def _counted(*pieces: bytes) -> int:
    frames = _Frames(None)
    for piece in pieces:
        frames.follow_commands(piece)
    return frames.frames


def test_whole_commands_are_counted_from_their_lengths() -> None:
    data = _packed(_COMMANDS)
    assert _counted(data) == len(_COMMANDS)
    assert _counted(*(_packed([command]) for command in _COMMANDS)) == len(_COMMANDS)
    followed = _Frames(None)
    followed.follow(data)
    assert followed.frames == len(_COMMANDS)


def test_commands_cut_anywhere_are_followed_across_sends() -> None:
    data = _packed(_COMMANDS)
    for cut in (*range(1, 60), *range(60, len(data), 97)):
        assert _counted(data[:cut], data[cut:]) == len(_COMMANDS), cut


def test_what_is_no_command_is_followed_as_a_reply_would_be() -> None:
    # Not an array of bulk strings: counted by `follow` (a simple string, a null
    # bulk inside an array), or refused as `follow` refuses it (a bulk's length short).
    assert _counted(b"+PING\r\n", b"*2\r\n$-1\r\n$1\r\na\r\n") == 2
    with pytest.raises(OverBound, match="not RESP3"):
        _counted(b"*1\r\n$1\r\nab\r\n")


# What a Redis with modules answers HELLO with: the deepest reply our commands get.
_HELLO_WITH_MODULES = (
    b"%3\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n"
    b"$7\r\nmodules\r\n*1\r\n%4\r\n$4\r\nname\r\n$6\r\nsearch\r\n$3\r\nver\r\n:1\r\n"
    b"$4\r\npath\r\n$3\r\n/so\r\n$4\r\nargs\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"
)


def _received(*pieces: bytes) -> int:
    frames = _Frames(64 * 1024 * 1024)
    for piece in pieces:
        frames.follow(piece)
    return frames.frames


def test_a_reply_nested_deeper_than_ours_is_refused_at_its_depth() -> None:
    assert _received(_HELLO_WITH_MODULES, b"*1\r\n" * MAX_DEPTH + b":1\r\n") == 2
    # 20 MB of one-element arrays: refused in its first read, not at the size bound
    # (coredis's recursive parser, and the tier's clock, spent seconds on it).
    nested = b"*1\r\n" * 5_000_000 + b":1\r\n"
    with pytest.raises(OverBound, match=f"nested more than {MAX_DEPTH} deep"):
        _received(nested[:65536])


def test_a_reply_of_more_elements_than_ours_is_refused_at_its_header() -> None:
    assert _received(b"*4096\r\n" + b":1\r\n" * 4096) == 1
    for header in (b"*2000000\r\n", b"%3000\r\n", b"*2\r\n*4000\r\n:1\r\n*97\r\n"):
        with pytest.raises(OverBound, match=f"more than {MAX_ELEMENTS} elements"):
            _received(header)
