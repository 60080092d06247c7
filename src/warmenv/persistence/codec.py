"""How a `Store` turns typed keys and values into the bytes storage holds.

The default is canonical JSON (sorted keys, no spaces, UTF-8): the same value
always encodes to the same bytes, so a key computed on one machine finds the
entry a bundle brought from another. Pickle is never an option: bundles come
from elsewhere, and unpickling untrusted bytes runs code.

`JsonCodec` is strict about values because a cache must return what was put
in: a warm run has to see exactly what the cold run computed. JSON turns a
tuple into a list, `{1: x}` into `{"1": x}` and an enum into its value, so
such values are refused when they are stored, with the place in the value
that is at fault, rather than coming back changed on the next start.
"""

from __future__ import annotations

import json
import json.scanner
import math
import sys
from collections.abc import Callable
from typing import Any, Protocol, final

from warmenv._text import is_utf8

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:
    from typing_extensions import TypeVar

__all__ = ["BytesCodec", "Codec", "JsonCodec"]

# `JsonCodec()` with nothing to infer its types from is a JsonCodec[Any, Any]
# (PEP 696 defaults): a store's annotation, if any, says what it holds.
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
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
    """Canonical JSON for keys and values.

    Values must come back equal and of the same type: `dict` with `str` keys,
    `list`, `str`, `int`, finite `float`, `bool` and `None`, exactly those
    types (no subclasses such as enums). Anything else raises `TypeError`
    naming the type and where it sits. Keys follow the same rules except that
    a tuple is accepted and encodes as a list (keys are never decoded, and a
    tuple is the natural key).
    """

    __slots__ = ()

    def encode_key(self, key: K) -> bytes:
        if isinstance(key, str) and type(key) is str:
            try:
                return encode_str(key).encode("utf-8")
            except UnicodeEncodeError:
                pass  # a lone surrogate: the general path says where and why
        return _canonical(key, "key", tuples=True)

    def encode_value(self, value: V) -> bytes:
        return _canonical(value, "value", tuples=False)

    def decode_value(self, data: bytes) -> V:
        try:
            decoded: V = json.loads(data, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            # RecursionError: a bundle may nest deeper than Python can parse.
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


# What json.dumps(s, ensure_ascii=False) does for a str, without its dispatch:
# the hit path of a store encodes a str key on every call. For the package's
# hot paths (a store's memory, the statistics flush), not part of the API.
encode_str: Callable[[str], str] = json.encoder.encode_basestring


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


# json.loads without its checks for untrusted input (encoding detection,
# whitespace, trailing data): for text that has already decoded once, as a
# store's held values have. Returns (value, end), as JSONDecoder.scan_once.
# For a store's memory (`warmenv.persistence._held`), not part of the API.
scan_canonical: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder(parse_constant=_reject_constant)  # type: ignore[arg-type]
)


def canonical_arguments(arguments: dict[str, object], where: str) -> bytes:
    """The key of a memoized call: the JSON list of its argument values, in order.

    A list rather than an object so that `store.get([a, b])` reads what
    `f(a, b)` stored. Each argument is checked under its own name, so an
    error says which argument of `where` cannot be part of a key.
    """
    for name, value in arguments.items():
        _require_json(value, f"{where} argument {name!r}", tuples=True)
    return _dump(list(arguments.values()), "arguments", tuples=True)


def _canonical(obj: object, what: str, *, tuples: bool) -> bytes:
    _require_json(obj, what, tuples=tuples)
    return _dump(obj, what, tuples=tuples)


def _require_json(obj: object, what: str, *, tuples: bool, utf8: bool = False) -> None:
    try:
        _check(obj, tuples, utf8)
    except _NotJson as exc:
        raise TypeError(exc.describe(what)) from None


def _dump(obj: object, what: str, *, tuples: bool) -> bytes:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        _require_json(obj, what, tuples=tuples, utf8=True)
        raise  # pragma: no cover - _check finds every string json.dumps kept


class _NotJson(Exception):
    """Raised inside `_check`; each container on the way out adds its index."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.path: list[str] = []

    def describe(self, what: str) -> str:
        return f"{what}{''.join(reversed(self.path))}: {self.problem}"


_ADVICE: dict[type, str] = {
    tuple: "tuple is not JSON; use a list",
    set: "set is not JSON; use a sorted list",
    frozenset: "frozenset is not JSON; use a sorted list",
    bytes: "bytes is not JSON; decode it to str, or store bytes with BytesCodec",
    bytearray: "bytearray is not JSON; decode it to str, or store bytes with BytesCodec",
}
_BASES = (bool, int, float, str, list, dict, tuple)


def _check(obj: object, tuples: bool, utf8: bool = False) -> None:
    # Exact types throughout: a subclass (an enum, a namedtuple) encodes as
    # its base and would come back as one.
    kind = type(obj)
    if isinstance(obj, str) and kind is str:
        if utf8 and not is_utf8(obj):
            raise _NotJson("str with a lone surrogate is not UTF-8 JSON")
        return
    if kind is int or kind is bool or obj is None:
        return
    if isinstance(obj, float) and kind is float:
        if not math.isfinite(obj):
            raise _NotJson(f"{obj!r} is not JSON; JSON has no NaN or infinity")
        return
    if isinstance(obj, (list, tuple)) and (kind is list or (tuples and kind is tuple)):
        for index, item in enumerate(obj):
            try:
                _check(item, tuples, utf8)
            except _NotJson as exc:
                exc.path.append(f"[{index}]")
                raise
        return
    if isinstance(obj, dict) and kind is dict:
        for name, item in obj.items():
            if type(name) is not str:
                raise _NotJson(
                    f"dict key {name!r} is {type(name).__name__}, not str; JSON object keys"
                    " are strings, so it would come back as a str"
                )
            try:
                if utf8:
                    _check(name, tuples, utf8)
                _check(item, tuples, utf8)
            except _NotJson as exc:
                exc.path.append(f"[{name!r}]")
                raise
        return
    advice = _ADVICE.get(kind)
    if advice is not None:
        raise _NotJson(advice)
    name = kind.__qualname__
    for base in _BASES:
        if isinstance(obj, base):
            raise _NotJson(
                f"{name} is a subclass of {base.__name__} and would come back as a plain "
                f"{base.__name__}; convert it first, or {_OWN_CODEC.format(name=name)}"
            )
    raise _NotJson(f"{name} is not JSON; convert it first, or {_OWN_CODEC.format(name=name)}")


# How to keep a type JSON cannot: the store's codec is the one place encoding happens.
_OWN_CODEC = (
    "store {name} values with a Codec of your own "
    "(warmenv.persistence.Codec: encode_key, encode_value, decode_value) passed as "
    "env.store(namespace, codec=...)"
)
