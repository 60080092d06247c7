"""Signed bundles: who made a bundle, proven by an Ed25519 signature over its manifest.

The digest proves a bundle is whole, not who made it, and a compiler-cache
bundle is code. So a bundle may carry a signature (`Signature`, in its
manifest, in both formats) over the manifest's JSON without the signature,
which holds the digest, which covers every entry: a signature that holds
vouches for every byte an import takes in. What the signature does not
cover is refused: manifest bytes beyond its fields (`BundleManifest.uncovered`)
and, in a SQLite bundle, a `meta` row beyond the two a bundle holds. A key pair comes from
`generate_key` (`warmenv keygen`): the private key in a PEM file only its
owner can read, the public key as one line of text (`warmenv._keys`).

What is checked is a `Trust`: the keys trusted to sign, and whether a
signature is required. With no key and no requirement (the default)
nothing is checked and the cryptography library is not imported. With keys,
a signed bundle must be signed by one of them and its signature must hold;
an unsigned one still passes unless `require_signature`. Passing keys
explicitly (`trust=[...]`, `--trust`) requires a signature, since that is
what asking for one means. Every check happens on the private copy an
import reads, before anything is written to the environment.

Only this module imports cryptography (the `sign` extra), and
only inside the functions that sign or check.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

import attrs

from warmenv._errors import WarmenvError
from warmenv._fs import check_output_directory, kind_of, read_bounded
from warmenv._install import install_hint
from warmenv._keys import KEY_PREFIX, KeyFileError, PublicKey, b64decode, b64encode
from warmenv.bundle.errors import SignatureError
from warmenv.bundle.manifest import SIGNATURE_ALGORITHM, BundleManifest, Signature

if TYPE_CHECKING:
    from warmenv.config import Config

__all__ = [
    "SigningKey",
    "SigningUnavailableError",
    "Trust",
    "TrustLike",
    "check_signature",
    "generate_key",
    "resolve_trust",
]

_SIGNATURE_BYTES: Final = 64
_PLACEHOLDER: Final = b64encode(bytes(_SIGNATURE_BYTES))
_MAX_KEY_FILE: Final = 1 << 16


class SigningUnavailableError(WarmenvError):
    """Signing or checking a signature needs the cryptography package, which is missing."""


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningUnavailableError(
            f"signing bundles and checking their signatures needs the cryptography package; "
            f"install it with: {install_hint('sign')}"
        ) from None
    return ed25519


def _serialization() -> Any:
    _ed25519()  # the same hint if cryptography is missing
    from cryptography.hazmat.primitives import serialization

    return serialization


# --- keys ----------------------------------------------------------------------------


@final
class SigningKey:
    """An Ed25519 private key, loaded from its file (`SigningKey.load`), that signs manifests."""

    __slots__ = ("_key", "path", "public_key")

    def __init__(self, key: Any, path: Path | None = None) -> None:
        self._key = key
        self.path = path
        serialization = _serialization()
        self.public_key = PublicKey(
            key.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
        )

    def __repr__(self) -> str:
        return f"SigningKey({str(self.public_key)!r})"

    @classmethod
    def load(cls, path: str | Path) -> SigningKey:
        """The Ed25519 private key in the file `path`: PEM (as `generate_key` writes
        it) or unencrypted OpenSSH (`ssh-keygen -t ed25519 -N ''`).

        A file that other users may read or write is refused, as ssh refuses
        one: whoever can read it can sign as you. What the file is comes
        first (not a regular file, a public key, not a key at all): advice to
        chmod a file that could never sign would send the user the wrong way.
        """
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise KeyFileError(f"{path}: cannot open the private key ({exc.strerror})") from None
        try:
            mode = os.fstat(fd).st_mode
            if (kind := kind_of(mode)) is not None:
                raise KeyFileError(f"{path} is {kind}, not a private key file")
            read = read_bounded(fd, _MAX_KEY_FILE, path)
        finally:
            os.close(fd)
        if read.over is not None:
            raise KeyFileError(f"{read.over}: not a private key file")
        key = _parse_private(read.data, path)
        if mode & 0o077:
            raise KeyFileError(
                f"{path}: the private key may be read or written by other users "
                f"(mode {stat.S_IMODE(mode):04o}); make it yours alone: chmod 600 {path}"
            )
        return cls(key, path)

    def placeholder(self, manifest: BundleManifest) -> BundleManifest:
        """`manifest` with a signature of the final length that holds nothing (for a
        writer that reserves the manifest's bytes before the digest is known)."""
        return attrs.evolve(
            manifest, signature=Signature(key=str(self.public_key), value=_PLACEHOLDER)
        )

    def sign(self, manifest: BundleManifest) -> BundleManifest:
        """`manifest` (its digest final) with this key's signature over it."""
        value = self._key.sign(manifest.signed_payload())
        return attrs.evolve(
            manifest, signature=Signature(key=str(self.public_key), value=b64encode(value))
        )


# How the first line (past comments) of a public key file starts: ours (`warmenv
# keygen`'s .pub, a file of trusted keys), a PEM public key, an OpenSSH one
# (`ssh-ed25519 AAAA...`, as in `id_ed25519.pub`).
_PUBLIC_KEY_STARTS = (KEY_PREFIX.encode(), b"-----BEGIN PUBLIC KEY-----", b"ssh-")


_OPENSSH_PRIVATE = b"-----BEGIN OPENSSH PRIVATE KEY-----"


def _parse_private(data: bytes, path: Path) -> Any:
    """The Ed25519 private key in `data`: PEM (as `warmenv keygen` writes it) or
    OpenSSH (`ssh-keygen -t ed25519 -N ''`), the same key in another wrapping.
    Anything else is said in words (what the file holds), never as a class name."""
    ed25519 = _ed25519()
    serialization = _serialization()
    from cryptography.exceptions import UnsupportedAlgorithm

    lines = (line.strip() for line in data.splitlines())
    first = next((line for line in lines if line and not line.startswith(b"#")), b"")
    if first.startswith(_PUBLIC_KEY_STARTS):
        raise KeyFileError(_holds_public_keys(path))
    openssh = first.startswith(_OPENSSH_PRIVATE)
    load = serialization.load_ssh_private_key if openssh else serialization.load_pem_private_key
    try:
        key = load(data, password=None)
    except TypeError:  # cryptography's word for "encrypted, and no password given"
        raise KeyFileError(
            f"{path}: the private key is encrypted, which warmenv does not read; keep it "
            "unencrypted with mode 600, or in your CI's secret store"
        ) from None
    except UnsupportedAlgorithm:
        raise KeyFileError(
            f"{path} holds a private key of a kind warmenv does not sign with; make an "
            "Ed25519 one with `warmenv keygen`"
        ) from None
    except Exception:  # ValueError, or whatever else a garbled file makes it raise
        raise KeyFileError(
            f"{path} is not a private key (neither PEM nor OpenSSH); make one with `warmenv keygen`"
        ) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise KeyFileError(
            f"{path} holds {_kind_of_key(key)}, not an Ed25519 key; make one with `warmenv keygen`"
        )
    return key


def _holds_public_keys(path: Path) -> str:
    """What to say of a file of public keys given as the private key: a `.pub` has
    its private key beside it; a file of trusted keys has none to point to."""
    if path.suffix == ".pub":
        private = path.with_suffix("")
        return f"{path} holds a public key; sign with the private key ({private}, without .pub)"
    return (
        f"{path} holds public keys (as a file of trusted keys does), not a private key; "
        "sign with the private key that `warmenv keygen` made"
    )


def _kind_of_key(key: object) -> str:
    """`key`'s algorithm in words ("an RSA key"), for a user who gave the wrong key."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, rsa, x448, x25519

    kinds = (
        (rsa.RSAPrivateKey, "an RSA key"),
        (ec.EllipticCurvePrivateKey, "an ECDSA key"),
        (ed448.Ed448PrivateKey, "an Ed448 key"),
        (x25519.X25519PrivateKey, "an X25519 key (for key exchange, not signing)"),
        (x448.X448PrivateKey, "an X448 key (for key exchange, not signing)"),
    )
    found = next((words for kind, words in kinds if isinstance(key, kind)), None)
    # DSA and finite-field Diffie-Hellman by name: cryptography deprecates their modules,
    # and touching them would warn a user who gave such a key a second time.
    deprecated = {
        "DSAPrivateKey": "a DSA key",
        "DHPrivateKey": "a Diffie-Hellman key (for key exchange, not signing)",
    }
    return found or deprecated.get(type(key).__name__, "a key of another kind")


def generate_key(path: str | Path) -> PublicKey:
    """Make a key pair: the private key at `path` (PEM, mode 600, never replacing a file)
    and its public key, returned and written to `path` + ".pub" as one line."""
    ed25519 = _ed25519()
    serialization = _serialization()
    path = Path(path)
    public_path = path.with_name(path.name + ".pub")
    check_output_directory(path)
    for target in (path, public_path):
        if os.path.lexists(target):
            # Never "remove it": it may be the key that signs a fleet's bundles.
            raise FileExistsError(
                f"'{target}' exists and was left as it is (keygen never replaces a file): "
                "choose another path for the key"
            )
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = SigningKey(key).public_key
    _write_new(path, pem, 0o600)
    try:
        _write_new(public_path, f"{public}\n".encode(), 0o644)
    except BaseException:
        path.unlink()
        raise
    return public


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    os.close(fd)


# --- trust ---------------------------------------------------------------------------


def _as_keys(keys: Iterable[PublicKey]) -> tuple[PublicKey, ...]:
    return tuple(keys)


@final
@attrs.frozen
class Trust:
    """Who may sign the bundles imported here, and whether one must be signed."""

    keys: tuple[PublicKey, ...] = attrs.field(default=(), converter=_as_keys)
    require_signature: bool = False

    @property
    def checks(self) -> bool:
        """Whether anything is checked (with no key and no requirement, nothing is)."""
        return bool(self.keys) or self.require_signature

    @classmethod
    def of(cls, keys: Iterable[PublicKey | str]) -> Trust:
        """These keys, a signature by one of them required (`trust=[...]`, `--trust`)."""
        return cls(tuple(_key(k) for k in keys), require_signature=True)

    @classmethod
    def from_config(cls, config: Config) -> Trust:
        """The configured `trusted_keys` and `require_signature`."""
        return cls(config.trusted_keys, require_signature=config.require_signature)


TrustLike: TypeAlias = Trust | Iterable[PublicKey | str] | None
"""What `trust=` takes: a `Trust`; keys (a signature by one of them required); or `None`,
the configuration's (`trusted_keys`, `require_signature`)."""


def _key(key: PublicKey | str) -> PublicKey:
    return key if isinstance(key, PublicKey) else PublicKey.parse(key)


def resolve_trust(trust: TrustLike) -> Trust:
    """The `Trust` that `trust=` means; `None` reads the configuration (blocking: a file)."""
    if trust is None:
        from warmenv.config import load_config

        return Trust.from_config(load_config())
    if isinstance(trust, Trust):
        return trust
    if isinstance(trust, PublicKey | str):
        return Trust.of([trust])
    return Trust.of(trust)


def check_signature(manifest: BundleManifest, trust: Trust, label: str) -> PublicKey | None:
    """The trusted key that signed `manifest`, or `None` where nothing asks for one;
    `SignatureError` naming `label` (the bundle) when `trust` refuses it."""
    if not trust.checks:
        return None
    signature = manifest.signature
    if signature is None:
        if not trust.require_signature:
            return None
        raise SignatureError(
            f"{label} is not signed, and a signature is required (require_signature, or "
            "--trust); ask its maker to export it with --sign KEY"
        )
    if not trust.keys:
        raise SignatureError(
            f"{label}: a signature is required but no key is trusted; set trusted_keys "
            "(or WARMENV_TRUSTED_KEYS), or pass --trust KEY"
        )
    uncovered = manifest.uncovered()
    if uncovered is not None:
        raise SignatureError(
            f"{label}: its manifest holds {uncovered} that its signature does not cover "
            "(added after signing); do not import it"
        )
    if signature.algorithm != SIGNATURE_ALGORITHM:
        raise SignatureError(
            f"{label} is signed with {signature.algorithm!r}, which this warmenv does not "
            f"check (it checks {SIGNATURE_ALGORITHM!r}); upgrade warmenv"
        )
    try:
        signer = PublicKey.parse(signature.key)
    except ValueError as exc:
        raise SignatureError(f"{label}: its signature names no valid key ({exc})") from None
    if signer not in trust.keys:
        raise SignatureError(
            f"{label} is signed by {signer}, which is not a trusted key; trust it (--trust, "
            "trusted_keys) only if you know who holds it"
        )
    value = b64decode(signature.value)
    if value is None or len(value) != _SIGNATURE_BYTES:
        raise SignatureError(
            f"{label}: its signature is damaged (not {_SIGNATURE_BYTES} bytes of URL-safe "
            "base64); do not import it"
        )
    ed25519 = _ed25519()
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(signer.raw).verify(
            value, manifest.signed_payload()
        )
    except InvalidSignature:
        raise SignatureError(
            f"{label}: its signature by {signer} does not hold: the manifest (or its "
            "digest, and so the entries) changed after signing; do not import it"
        ) from None
    return signer
