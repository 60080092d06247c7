"""Reading a flat bundle's header with every length checked against what the file holds.

Every failure is a `CorruptBundleError`; a length that runs past the end is
the file cut short (a copy or download that stopped early), said with the byte
it ends at (`warmenv.bundle._kinds.cut_short`).
"""

from __future__ import annotations

from warmenv.bundle._kinds import cut_short
from warmenv.bundle.errors import CorruptBundleError
from warmenv.bundle.flat.layout import U32

__all__ = ["KIND", "Reader", "cut"]

KIND = "flat warmenv bundle"
"""What a flat bundle's file is called where it is cut short."""


def cut(source: str, size: int, needs: str) -> CorruptBundleError:
    """The error for the flat bundle `source` that ends at byte `size`, before what it `needs`."""
    return CorruptBundleError(cut_short(source, KIND, size, needs))


class Reader:
    """Bounds-checked reading of the header; every failure is a CorruptBundleError."""

    __slots__ = ("data", "pos", "source")

    def __init__(self, data: memoryview, source: str) -> None:
        self.data = data
        self.pos = 0
        self.source = source

    def u32(self, what: str) -> int:
        return U32.unpack(self.take(4, what))[0]  # type: ignore[no-any-return]

    def take(self, size: int, what: str) -> memoryview:
        end = self.pos + size
        if end > len(self.data):
            raise cut(
                self.source, len(self.data), f"{what} needs {size:,} bytes at offset {self.pos:,}"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk
