"""The bundle formats, listed once: telling a file's format by its first bytes.

Every way into a bundle file (`open_bundle`, an import's private copy, a
download, the commands, export deciding whether it may replace a file) asks
`sniff` which format a file's first bytes are, and then asks that format's
`FileFormat` (`warmenv.bundle.base`) to do what differs by format: open it
in place, open a private copy, read its header by range, say whether it may
be replaced. So adding a format is one class and one line here, and no
caller compares magic bytes or names a format to choose what to do.
"""

from __future__ import annotations

from typing import TypeAlias

from warmenv.bundle._kinds import not_a_bundle
from warmenv.bundle.base import BundleFormat
from warmenv.bundle.errors import NotABundleError
from warmenv.bundle.flat.bundle import FLAT, FlatFormat
from warmenv.bundle.sqlite.bundle import SQLITE, SqliteFormat
from warmenv.persistence.sqlite.opening import is_marked_environment

__all__ = ["FORMATS", "AnyFormat", "identify", "is_environment", "of", "sniff"]

AnyFormat: TypeAlias = SqliteFormat | FlatFormat

FORMATS: tuple[AnyFormat, ...] = (SQLITE, FLAT)
"""Every format warmenv reads and writes."""


def sniff(head: bytes) -> AnyFormat | None:
    """The format of a file that starts with `head` (by its magic), or `None`: no bundle.

    `head` is `_files.read_head`'s, or more of the file (a download's first range).
    """
    for format in FORMATS:
        if format.matches(head):
            return format
    return None


def is_environment(head: bytes) -> bool:
    """Whether a file that starts with `head` is a warmenv environment (a SQLite file with
    the environments' mark): what is said of it where it is refused as a bundle or a page
    to replace, rather than "not a bundle" (and never "remove it")."""
    return sniff(head) is SQLITE and is_marked_environment(head)


def identify(head: bytes, size: int, label: str, *, downloaded: bool = False) -> AnyFormat:
    """The format of the file `label` of `size` bytes that starts with `head`.

    Of neither format, `NotABundleError` says what the file is instead (empty, a gzip
    file...) and what to do (`downloaded`: `label` is the URL that answered it); a file shorter
    than its first bytes say it is raises `CorruptBundleError`: cut short at byte `size`.
    """
    found = sniff(head)
    if found is None:
        magics = {format.kind: format.magic for format in FORMATS}
        raise NotABundleError(not_a_bundle(label, head, size, magics, downloaded=downloaded))
    found.check_whole(head, size, label)
    return found


def of(format: BundleFormat) -> AnyFormat:
    """The format named `format`."""
    for candidate in FORMATS:
        if candidate.format == format:
            return candidate
    raise AssertionError(f"no format {format!r} is listed")  # BundleFormat lists them all
