"""What a file given as a bundle is when it is not one, said in one line with the fix.

A new user's first bad bundle is rarely hostile: an empty file (an export
that never ran), the bundle gzipped for the upload, a download's error page,
a copy cut short, a Git LFS pointer checked out in its place. "Not a warmenv
bundle" or "malformed" leaves them guessing;
naming what the file is instead ("a gzip file", "cut short at byte 4,096")
says what to do. This table of other files' first bytes is the one place
they are told apart, for a file given by path and a download's body alike;
which bundle format a file is stays `formats.sniff`'s.
"""

from __future__ import annotations

from typing import Final

__all__ = ["cut_short", "not_a_bundle"]

_AGAIN = "copy or download it again"
# (first bytes, at, what the file is, what to do with it).
_OTHERS: Final = (
    (b"\x1f\x8b", 0, "a gzip file", "decompress it first (gunzip)"),
    (b"PK\x03\x04", 0, "a zip archive", "extract the bundle from it first (unzip)"),
    (b"\xfd7zXZ\x00", 0, "an xz file", "decompress it first (unxz)"),
    (b"BZh", 0, "a bzip2 file", "decompress it first (bunzip2)"),
    (b"ustar", 257, "a tar archive", "extract the bundle from it first (tar -xf)"),
    (
        b"version https://git-lfs.github.com/spec/v1",
        0,
        "a Git LFS pointer",
        "it stands for the file: git lfs pull",
    ),
)
_BOM: Final = b"\xef\xbb\xbf"
_PAGES: Final = (b"<!doctype html", b"<html", b"<head", b"<?xml")


def not_a_bundle(
    label: str, head: bytes, size: int, magics: dict[str, bytes], *, downloaded: bool = False
) -> str:
    """The line for the file `label`, `size` bytes starting with `head`, that starts with
    none of `magics` (each format's magic, by the format's `kind`); `downloaded`: it is
    the body a URL (`label`) answered."""
    if size == 0:
        return f"{label} is empty (0 bytes), not a warmenv bundle; export it (or {_AGAIN})"
    for kind, magic in magics.items():
        if size < len(magic) and magic.startswith(head):
            return cut_short(label, kind, size, f"its magic alone is {len(magic)} bytes")
    for start, at, what, fix in _OTHERS:
        if head[at : at + len(start)] == start:
            return f"{label} is {what}, not a warmenv bundle; {fix}"
    text = head.removeprefix(_BOM).lstrip().lower()
    if text.startswith(_PAGES):
        return (
            f"{label} is an HTML or XML page, not a warmenv bundle (a download that saved an "
            "error page?); check the URL and download it again"
        )
    if text.startswith((b"{", b"[")):
        return (
            f"{label} is a JSON document, not a warmenv bundle (a download that saved an "
            "API's answer?); check the URL and download it again"
        )
    if len(magics) == 1:  # a format's own opener: the file may be of the other format
        (kind,) = magics
        return (
            f"{label} is not a {kind} (it does not start with its magic); open_bundle "
            "opens a bundle of either format"
        )
    if downloaded:
        return (
            f"{label} is not a warmenv bundle (the body starts with neither the SQLite nor "
            "the flat magic); check the URL"
        )
    return (
        f"{label} is not a warmenv bundle (it starts with neither the SQLite nor the flat "
        "magic); give a file `warmenv export` wrote"
    )


def cut_short(label: str, kind: str, size: int, needs: str) -> str:
    """The line for a file of a bundle's `kind` ("a SQLite file", the format's `kind`) that
    ends at `size` bytes, before what it `needs`."""
    return f"{label} is a {kind} cut short at byte {size:,} ({needs}); {_AGAIN}"
