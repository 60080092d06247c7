"""The flat bundle's layout: what the reader and the writer agree on, written once.

The magic, the format versions with the bytes each entry carries in them,
and the fixed-size records (a u32, a 20-byte index entry). The reader
(`warmenv.bundle.flat.bundle`) checks a file against them and the writer
(`warmenv.bundle.flat.staging`) produces them, so a change to the layout is
made here and read the same way by both.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from warmenv.bundle.errors import UnsupportedSchemaError

__all__ = [
    "CARRIED_SIZE",
    "ENTRY",
    "FLAT_MAGIC",
    "FORMAT_VERSION",
    "MAX_U32",
    "U32",
    "check_format_version",
    "data_end",
]

FLAT_MAGIC = b"WARMENV\x01"
FORMAT_VERSION = 2
"""The version export writes by default; every version up to it is read (and written)."""
CARRIED_SIZE: Final = {1: 0, 2: 16}
"""Bytes each entry carries, per format version."""
U32: Final = struct.Struct("<I")
ENTRY: Final = struct.Struct("<IIIII")
"""An index entry: namespace id, key offset, key length, value offset, value length."""
MAX_U32: Final = 0xFFFFFFFF


def check_format_version(version: int, source: str) -> None:
    """`UnsupportedSchemaError` unless this warmenv reads flat format `version`."""
    if version not in CARRIED_SIZE:
        raise UnsupportedSchemaError(
            f"{source}: flat format version {version} is not supported "
            f"(this warmenv reads versions 1 to {FORMAT_VERSION}); upgrade warmenv"
        )


def data_end(words: Sequence[int]) -> int:
    """Where the data section's last key or value ends, by the index's `words` (`ENTRY`s
    as u32s); a file shorter than that was cut short."""
    keys = max(map(int.__add__, words[1::5], words[2::5]), default=0)
    return max(keys, max(map(int.__add__, words[3::5], words[4::5]), default=0))
