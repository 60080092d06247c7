"""How a `Store` turns typed keys and values into the bytes storage holds.

The default is canonical JSON (sorted keys, no spaces, UTF-8): the same value
always encodes to the same bytes, so a key computed on one machine finds the
entry a bundle brought from another. Pickle is never an option: bundles come
from elsewhere, and unpickling untrusted bytes runs code.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, TypeVar, final

__all__ = ["BytesCodec", "Codec", "JsonCodec"]

K = TypeVar("K")
V = TypeVar("V")
K_contra = TypeVar("K_contra", contravariant=True)


class Codec(Protocol[K_contra, V]):
    """Encodes keys and values to bytes, and values back."""

    def encode_key(self, key: K_contra) -> bytes:
        """The bytes a key is stored under; equal keys must give equal bytes."""
        ...

    def encode_value(self, value: V) -> bytes:
        """The bytes a value is stored as."""
        ...

    def decode_value(self, data: bytes) -> V:
        """The value, or `ValueError` if `data` does not decode (a miss, then repaired)."""
        ...


@final
class JsonCodec(Codec[K, V]):
    """Canonical JSON for keys and values."""

    __slots__ = ()

    def encode_key(self, key: K) -> bytes:
        return _canonical(key, "key")

    def encode_value(self, value: V) -> bytes:
        return _canonical(value, "value")

    def decode_value(self, data: bytes) -> V:
        try:
            decoded: V = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not canonical JSON: {exc}") from exc
        return decoded

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonCodec)

    def __hash__(self) -> int:
        return hash(JsonCodec)


@final
class BytesCodec(Codec[bytes, bytes]):
    """Passes `bytes` keys and values through unchanged."""

    __slots__ = ()

    def encode_key(self, key: bytes) -> bytes:
        if not isinstance(key, bytes):
            raise TypeError(f"BytesCodec keys are bytes, got {type(key).__name__}")
        return key

    def encode_value(self, value: bytes) -> bytes:
        if not isinstance(value, bytes):
            raise TypeError(f"BytesCodec values are bytes, got {type(value).__name__}")
        return value

    def decode_value(self, data: bytes) -> bytes:
        return data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BytesCodec)

    def __hash__(self) -> int:
        return hash(BytesCodec)


def _canonical(obj: Any, what: str) -> bytes:
    try:
        text = json.dumps(
            obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(f"JsonCodec cannot encode this {what}: {exc}") from exc
    return text.encode("utf-8")
