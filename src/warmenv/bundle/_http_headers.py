"""What a download reads from an HTTP response's headers: its validator, its lengths.

Plain functions over the headers (any `Mapping[str, str]`, such as httpx's
`Headers`), so that they import nothing of httpx, whose one room is
`warmenv.bundle.download`. A value that does not parse is `None`: the
download then does without it (starts over rather than resumes, or reads
until the body ends), never trusting a guess.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["content_range", "int_header", "range_validator"]


def range_validator(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """What proves a later range is of the same file (the `If-Range` value, and the
    header it came from): a strong ETag, else Last-Modified; None without either."""
    etag = headers.get("etag")
    if etag and not etag.startswith("W/"):
        return str(etag), "etag"
    modified = headers.get("last-modified")
    return (str(modified), "last-modified") if modified else None


def int_header(headers: Mapping[str, str], name: str) -> int | None:
    """The header `name` as an int of 0 or more, or None."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number >= 0 else None


def content_range(value: str) -> tuple[int | None, int | None]:
    """(first byte, complete length) of a `Content-Range: bytes a-b/n` header."""
    unit, _, spec = value.strip().partition(" ")
    if unit.lower() != "bytes":
        return None, None
    span, _, size = spec.partition("/")
    first = span.split("-", 1)[0]
    try:
        start = int(first)
    except ValueError:
        return None, None
    try:
        total: int | None = int(size)
    except ValueError:
        total = None
    return start, total
