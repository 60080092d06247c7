"""A public key as text: who may sign bundles, written where people can paste it.

A signing key's public half travels in settings (`trusted_keys`), in a
variable, on a command line and in every signed bundle's manifest, so it is
one short line: `ed25519:` then the key's 32 bytes in unpadded URL-safe
base64 (43 characters). Reading that text needs no cryptography library,
so the configuration can check a key where it is written and name the file;
only checking a signature (`warmenv.bundle.signing`) needs one.

A key file (`warmenv keygen` writes `KEY.pub`) holds one key a line; blank
lines and lines starting with `#` are skipped.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import Final, final

import attrs

from warmenv._errors import WarmenvError
from warmenv._fs import close_unless_regular, read_bounded

__all__ = ["KEY_PREFIX", "KeyFileError", "PublicKey", "b64decode", "b64encode", "read_key_file"]

KEY_PREFIX: Final = "ed25519:"
KEY_BYTES: Final = 32
_MAX_KEY_FILE = 1 << 16  # a key file of a few hundred keys at most; anything larger is not one


class KeyFileError(WarmenvError):
    """A key, or a file of keys, that is not what warmenv reads or writes."""


def b64encode(raw: bytes) -> str:
    """Unpadded URL-safe base64, the text form of keys and signatures."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def b64decode(text: str) -> bytes | None:
    """The bytes of unpadded URL-safe base64 `text`, or `None` if it is not exactly that."""
    if not text.isascii() or "=" in text or any(c.isspace() for c in text):
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if b64encode(raw) == text else None  # one text per key: no stray bits


@final
@attrs.frozen
class PublicKey:
    """An Ed25519 public key; `str()` is its text form, `PublicKey.parse` reads it back."""

    raw: bytes = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        if len(self.raw) != KEY_BYTES:
            raise ValueError(f"an Ed25519 public key is {KEY_BYTES} bytes, not {len(self.raw)}")

    def __str__(self) -> str:
        return KEY_PREFIX + b64encode(self.raw)

    def __repr__(self) -> str:
        return f"PublicKey({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        """The key written as `text` (`ed25519:` and 43 characters); `ValueError` says why not."""
        if not isinstance(text, str):
            raise ValueError(f"a public key is text such as 'ed25519:...', not {type(text)!r}")
        stripped = text.strip()
        if not stripped.startswith(KEY_PREFIX):
            raise ValueError(
                f"{_shown(stripped)} is not a warmenv public key: it must start with "
                f"'{KEY_PREFIX}' (as `warmenv keygen` prints it)"
            )
        raw = b64decode(stripped[len(KEY_PREFIX) :])
        if raw is None or len(raw) != KEY_BYTES:
            raise ValueError(
                f"{_shown(stripped)} is not a warmenv public key: '{KEY_PREFIX}' must be "
                f"followed by the key's {KEY_BYTES} bytes in URL-safe base64 (43 characters)"
            )
        return cls(raw)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def read_key_file(path: Path) -> tuple[PublicKey, ...]:
    """The keys in the file `path`, one a line; `KeyFileError` names the file and line."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: never waited on
        if (kind := close_unless_regular(fd)) is not None:
            raise KeyFileError(f"{path} is {kind}, not a file of public keys")
        try:
            read = read_bounded(fd, _MAX_KEY_FILE, path)
        finally:
            os.close(fd)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read the key file ({exc.strerror})") from None
    if read.over is not None:
        raise KeyFileError(f"{read.over}: not a file of public keys")
    try:
        text = read.data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(
            f"{path}: not text, so not a file of public keys (a private key? pass its .pub)"
        ) from None
    keys: list[PublicKey] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-----BEGIN"):
            raise KeyFileError(
                f"{path}: line {number} starts a PEM block: this is a private key, never "
                "give it out; trust the public key (the .pub file `warmenv keygen` wrote)"
            )
        try:
            keys.append(PublicKey.parse(line))
        except ValueError as exc:
            raise KeyFileError(f"{path}: line {number}: {exc}") from None
    if not keys:
        raise KeyFileError(f"{path}: holds no public key ('{KEY_PREFIX}...', one a line)")
    return tuple(keys)
