"""Text from outside (files, servers, arguments), made safe to print or log.

Bundle names, namespaces, paths and a server's error replies may carry
escape sequences; printed or logged as they are, they could move a
terminal's cursor, recolour it or forge a line. The command line prints
every such text through `clean`, and the library's log lines quote a
server's words through it too, so the one rule lives here.

Text that cannot be written as UTF-8 is the other rule here (`is_utf8`):
Python carries a byte that was not UTF-8 (in a file name, an argument,
text SQLite read with `surrogateescape`) as a lone surrogate, and a JSON
escape such as `"\\ud800"` decodes to one; neither can be written into a
manifest, a database or a bundle.

Text from outside quoted in a one-line message (a server's error reply, a
header, a bundle's name) is also bounded (`brief`): a server may answer with
64 KiB of text, and a log line quoting it whole is a flood, not a line.

And counts written for people (`plural`): "1 entry" but "2 entries", in
every command's lines and in the reports the library's `str()` gives.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = [
    "BRIEF_LIMIT",
    "brief",
    "brief_repr",
    "clean",
    "has_control_characters",
    "is_utf8",
    "plural",
    "utf8_safe",
]

# Control characters (C0, DEL, C1), invisible format characters (bidi overrides,
# zero-width joiners), line and paragraph separators, and lone surrogates (a
# byte that was not UTF-8 in a file name or argument): none of them may reach a
# terminal as they are.
_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def clean(text: object) -> str:
    """`text` with every character that could steer a terminal written as an escape.

    `"\\x1b[2J"` prints as `\\x1b[2J`, a newline as `\\n`, and a byte that was
    not UTF-8 (carried by Python as a lone surrogate) as `\\xff`.
    """
    value = text if isinstance(text, str) else str(text)
    if value.isprintable():  # the fast path: nothing to escape (spaces included)
        return value
    return "".join(_escape(ch) if unicodedata.category(ch) in _UNSAFE else ch for ch in value)


BRIEF_LIMIT: Final = 200
"""The most characters of outside text a one-line message quotes (`brief`)."""


def brief(text: object, limit: int = BRIEF_LIMIT) -> str:
    """`text` as `clean` writes it, cut to at most `limit` characters plus a note of how
    many more there were: outside text quoted in a one-line message (a log line, an error).

    `brief("x" * 1000)` is 200 `x` then `... (800 more characters)`; an escape is
    never cut in half.
    """
    value = text if isinstance(text, str) else str(text)
    if len(value) <= limit and value.isprintable():  # the fast path
        return value
    pieces: list[str] = []
    used = 0
    for at, ch in enumerate(value):
        piece = _escape(ch) if unicodedata.category(ch) in _UNSAFE else ch
        if used + len(piece) > limit:
            return "".join(pieces) + f"... ({len(value) - at:,} more characters)"
        pieces.append(piece)
        used += len(piece)
    return "".join(pieces)


def brief_repr(value: object, limit: int = BRIEF_LIMIT) -> str:
    """`repr(value)` cut as `brief` cuts text: a Redis key (which holds a caller's key,
    of any length) or other bytes quoted in a one-line message.
    """
    return brief(repr(value), limit)


def has_control_characters(text: str) -> bool:
    """Whether `text` holds a character `clean()` would escape (C0, C1, bidi controls...)."""
    return not text.isprintable() and any(unicodedata.category(ch) in _UNSAFE for ch in text)


def is_utf8(text: str | bytes) -> bool:
    """Whether `text` is UTF-8: text without a lone surrogate, or bytes that decode."""
    if text.isascii():  # the fast path: ASCII is UTF-8
        return True
    try:
        if isinstance(text, str):
            text.encode("utf-8")
        else:
            text.decode("utf-8")
    except UnicodeError:
        return False
    return True


def utf8_safe(text: str) -> str:
    """`text` with each lone surrogate written as `clean` writes it (`\\xff` for a byte
    that was not UTF-8), everything else as it is: text that can be written as UTF-8."""
    if is_utf8(text):
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) == "Cs" else ch for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _SHORT:
        return _SHORT[ch]
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the original byte
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def plural(count: int, word: str, many: str | None = None) -> str:
    """`count` and `word`, in the plural unless it is one: "1 namespace", "2 entries"."""
    if count == 1:
        return f"1 {word}"
    return f"{count:,} {many or word + 's'}"
