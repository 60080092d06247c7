"""The manifest: what a bundle says about itself, and the digest that proves it.

The digest is BLAKE2b-256 over the entries sorted by (namespace, key), each
field preceded by its length as a little-endian u64, so no two different
entry streams can hash alike and the two formats give the same digest for the
same entries. A bundle of format 2 also carries each entry's `written_at` and
`cost` (16 bytes, `warmenv.persistence.carried`), and its digest covers them:
they follow each entry's value, under a personalisation of their own, so
neither stream can pass for the other and a format-1 bundle verifies exactly
as before. The manifest names the algorithm, so a later warmenv can change it
without misreading old bundles.

A signed bundle's manifest also holds a `signature` (`Signature`): who
signed it (a public key) and an Ed25519 signature over `signed_payload()`,
the manifest's own JSON without the signature, so it covers the digest and
with it every entry. The signature signs the fields as parsed, so the bytes
a manifest was read from must be exactly those fields written out again
(`uncovered`): a field added to a signed manifest (which this warmenv would
ignore, and a later one might read) is refused, not carried along unsigned.
Reading one needs nothing but this module; checking it is
`warmenv.bundle.signing`'s. A reader that predates signatures ignores the
field and reads the bundle as an unsigned one.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import queue
import struct
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from warmenv._text import is_utf8
from warmenv.bundle.errors import InvalidManifestError, UnsupportedSchemaError
from warmenv.persistence.carried import pack as _pack_carried

__all__ = [
    "DIGEST_ALGORITHM",
    "MAX_MANIFEST_BYTES",
    "BackgroundDigest",
    "BundleManifest",
    "Digest",
    "EnvironmentInfo",
    "Signature",
    "U64",
    "check_manifest_size",
    "listing",
    "oversized_manifest",
    "this_machine",
]

SCHEMA = 1
DIGEST_ALGORITHM = "blake2b-256"
_DIGEST_PREFIX = DIGEST_ALGORITHM + ":"
# A placeholder of the final length, so a writer can reserve the digest's bytes.
DIGEST_PLACEHOLDER = _DIGEST_PREFIX + "0" * 64
_MAX_TEXT = 4096
MAX_MANIFEST_BYTES: Final = 1 << 20
"""The largest manifest (its UTF-8 JSON, in bytes) any reader accepts and export writes.

A real one is a few hundred bytes; the limit lets every reader refuse a
hostile one by its length alone, before reading it, where the flat format's
u32 length field alone would let a file make a reader allocate 4 GiB.
"""


def check_manifest_size(size: int, label: str = "") -> None:
    """`InvalidManifestError` for a manifest of `size` bytes over `MAX_MANIFEST_BYTES`,
    its message starting with `label` if given."""
    if size > MAX_MANIFEST_BYTES:
        raise oversized_manifest(size, label)


def oversized_manifest(size: int | None, label: str = "") -> InvalidManifestError:
    """The error for a manifest of `size` bytes, over `MAX_MANIFEST_BYTES` (`None`: one
    known only to be over it, refused unread), its message starting with `label` if given."""
    measured = "" if size is None else f" {size:,} bytes,"
    return InvalidManifestError(
        f"{label}{': ' if label else ''}the manifest is{measured} over the "
        f"{MAX_MANIFEST_BYTES:,} bytes a reader accepts (one warmenv writes is a few hundred)"
    )


def _os_name() -> str:
    return {"darwin": "macos", "win32": "windows"}.get(sys.platform, platform.system().lower())


def _arch_name() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@attrs.frozen(kw_only=True)
class EnvironmentInfo:
    """A machine a bundle's entries were captured on."""

    label: str
    os: str = attrs.field(factory=_os_name)
    arch: str = attrs.field(factory=_arch_name)
    devices: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """This machine's description as a JSON object."""
        return {
            "label": self.label,
            "os": self.os,
            "arch": self.arch,
            "devices": list(self.devices),
        }


SIGNATURE_ALGORITHM: Final = "ed25519"
SIGNATURE_CONTEXT: Final = b"warmenv bundle signature 1\n"
"""What every signed payload starts with, so no other message can pass for a manifest."""


@attrs.frozen(kw_only=True)
class Signature:
    """A manifest's signature as written: the algorithm, the signer's public key (its
    text form) and the signature (unpadded URL-safe base64). Whether it holds is
    `warmenv.bundle.signing.check_signature`'s to say."""

    algorithm: str = SIGNATURE_ALGORITHM
    key: str
    value: str

    def to_json(self) -> dict[str, str]:
        return {"algorithm": self.algorithm, "key": self.key, "value": self.value}


def this_machine(label: str | None = None, devices: tuple[str, ...] = ()) -> EnvironmentInfo:
    """The machine this process runs on, labelled (by default) "<OS> <arch>"."""
    info = EnvironmentInfo(label="", devices=devices)
    return attrs.evolve(info, label=label or f"{platform.system()} {info.arch}")


@attrs.frozen(kw_only=True)
class BundleManifest:
    """Name, version, origin machines and content digest of a bundle."""

    schema: int = SCHEMA
    name: str
    version: str
    created: str
    environments: tuple[EnvironmentInfo, ...]
    digest: str
    signature: Signature | None = None
    namespaces: tuple[str, ...] | None = None
    """The namespaces the bundle holds, sorted (as UTF-8 bytes), or None: not listed
    (format 1, a bundle from before the list, or too many to list). Where listed, a
    reader checks the list against the entries when it opens the bundle, and an
    import may refuse a stale bundle by it before reading its body (by range)."""
    read_from: bytes | None = attrs.field(
        default=None, eq=False, repr=False, metadata={"shown": False}
    )
    """The bytes this manifest was parsed from (`from_json`), or None: made here. Not
    shown (`--json` output leaves it out: it is the manifest again, as bytes)."""

    def to_json(self) -> bytes:
        """The manifest as UTF-8 JSON, keys sorted (no `signature` key when unsigned)."""
        document: dict[str, Any] = {
            "schema": self.schema,
            "name": self.name,
            "version": self.version,
            "created": self.created,
            "environments": [e.to_json() for e in self.environments],
            "digest": self.digest,
        }
        if self.signature is not None:
            document["signature"] = self.signature.to_json()
        if self.namespaces is not None:
            document["namespaces"] = list(self.namespaces)
        return json.dumps(document, sort_keys=True, ensure_ascii=False).encode("utf-8")

    def signed_payload(self) -> bytes:
        """What a signature signs: a fixed context, then this manifest's JSON without its
        signature (and so its digest, which covers every entry)."""
        return SIGNATURE_CONTEXT + attrs.evolve(self, signature=None).to_json()

    def uncovered(self) -> str | None:
        """What the bytes this manifest was read from hold beyond its fields, as a clause
        ("a field 'note'"), or None: they are exactly `to_json()`, which is what a
        signature covers (with the signature). A manifest made here holds nothing else."""
        if self.read_from is None or self.read_from == self.to_json():
            return None
        try:
            found = json.loads(self.read_from)
        except (ValueError, RecursionError):  # pragma: no cover (from_json parsed it)
            found = None
        extra = _extra_field(found, json.loads(self.to_json()), "")
        if extra is not None:
            return f"a field {extra!r}"
        return "bytes written otherwise than warmenv writes them (spacing, order or escapes)"

    def check_readable(self) -> None:
        """`ValueError` unless every reader would accept this manifest as written.

        Export calls it before writing anything, so it never publishes a
        bundle that inspect and import would then reject.
        """
        try:
            document = self.to_json()
        except UnicodeEncodeError as exc:
            field = next(
                (f for f in ("name", "version") if not is_utf8(getattr(self, f))), "a field"
            )
            raise ValueError(
                f"the bundle's {field} is not valid text ({exc.reason}); pass a UTF-8 string"
            ) from None
        try:
            BundleManifest.from_json(document)
        except (InvalidManifestError, UnsupportedSchemaError) as exc:
            raise ValueError(f"no reader would accept this bundle: {exc}") from None

    @classmethod
    def from_json(cls, data: bytes | str) -> BundleManifest:
        """Parse and check a manifest; `InvalidManifestError` names what is wrong."""
        if isinstance(data, str):  # a character is at least one byte: encode only a short one
            check_manifest_size(len(data))
            raw = data.encode("utf-8", "surrogatepass")
            check_manifest_size(len(raw))
        else:
            check_manifest_size(len(data))
            raw = bytes(data)
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise InvalidManifestError(f"the manifest is not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise InvalidManifestError("the manifest must be a JSON object")
        schema = document.get("schema")
        if type(schema) is not int:
            raise InvalidManifestError("manifest field 'schema' must be an integer")
        if schema != SCHEMA:
            raise UnsupportedSchemaError(
                f"manifest schema {schema} is not supported (this warmenv reads schema "
                f"{SCHEMA}); upgrade warmenv to read this bundle"
            )
        environments = document.get("environments")
        if not isinstance(environments, list):
            raise InvalidManifestError("manifest field 'environments' must be a list")
        digest = _text(document, "digest")
        if not digest.startswith(_DIGEST_PREFIX) or len(digest) != len(DIGEST_PLACEHOLDER):
            raise InvalidManifestError(
                f"manifest field 'digest' must be '{DIGEST_ALGORITHM}:' and 64 hex digits"
            )
        return cls(
            schema=schema,
            name=_text(document, "name"),
            version=_text(document, "version"),
            created=_text(document, "created"),
            environments=tuple(_environment(e, i) for i, e in enumerate(environments)),
            digest=digest,
            signature=_signature(document),
            namespaces=_namespaces(document),
            read_from=raw,
        )


def _extra_field(found: object, ours: object, where: str) -> str | None:
    """The first field (a dotted path) in `found` that `ours` (the same manifest as
    warmenv writes it) lacks, or None."""
    if isinstance(found, dict) and isinstance(ours, dict):
        for name, value in found.items():
            if name not in ours:
                return f"{where}{name}"
            if (extra := _extra_field(value, ours[name], f"{where}{name}.")) is not None:
                return extra
    elif isinstance(found, list) and isinstance(ours, list):
        for index, (value, mine) in enumerate(zip(found, ours, strict=False)):
            if (extra := _extra_field(value, mine, f"{where[:-1]}[{index}].")) is not None:
                return extra
    return None


def _text(document: Mapping[Any, Any], field: str | int, where: str = "") -> str:
    named = f"{where}[{field}]" if isinstance(field, int) else f"{where}{field}"
    value = document.get(field)
    if not isinstance(value, str):
        raise InvalidManifestError(f"manifest field '{named}' must be a string")
    if len(value) > _MAX_TEXT:
        raise InvalidManifestError(
            f"manifest field '{named}' is longer than {_MAX_TEXT} characters"
        )
    if not is_utf8(value):  # a JSON escape such as "\ud800" decodes to a lone surrogate
        raise InvalidManifestError(f"manifest field '{named}' is not valid Unicode text")
    return value


def _environment(document: object, index: int) -> EnvironmentInfo:
    where = f"environments[{index}]."
    if not isinstance(document, dict):
        raise InvalidManifestError(f"manifest field 'environments[{index}]' must be an object")
    devices = document.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(d, str) and is_utf8(d) for d in devices):
        raise InvalidManifestError(f"manifest field '{where}devices' must be a list of strings")
    return EnvironmentInfo(
        label=_text(document, "label", where),
        os=_text(document, "os", where),
        arch=_text(document, "arch", where),
        devices=tuple(devices),
    )


def _namespaces(document: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The namespaces a manifest lists, each a string (whether they are the bundle's
    is checked where the bundle is opened: `warmenv.bundle.base.check_listed`)."""
    if "namespaces" not in document:
        return None
    names = document["namespaces"]
    if not isinstance(names, list):
        raise InvalidManifestError("manifest field 'namespaces' must be a list of strings")
    by_position = dict(enumerate(names))
    return tuple(_text(by_position, i, "namespaces") for i in by_position)


def listing(manifest: BundleManifest, namespaces: Iterable[str]) -> BundleManifest:
    """`manifest` listing `namespaces` (sorted as UTF-8 bytes, as the digest sorts them),
    or `manifest` as it is where the list would not fit: a name longer than a manifest
    string may be, or a list that would take the manifest past `LISTED_BYTES`."""
    names = sorted(namespaces, key=lambda n: n.encode("utf-8", "surrogatepass"))
    if any(len(name) > _MAX_TEXT or not is_utf8(name) for name in names):
        return manifest
    listed = attrs.evolve(manifest, namespaces=tuple(names))
    if len(listed.to_json()) > LISTED_BYTES:
        return manifest
    return listed


LISTED_BYTES: Final = 256 << 10
"""The largest manifest export writes with its namespaces listed: a bundle of so
many namespaces that the list would pass it is exported without one (an import
then reads its names from its body, as from a bundle of before the list)."""


def _signature(document: Mapping[str, Any]) -> Signature | None:
    """The signature as written, its shape checked; whether it holds is checked elsewhere,
    so a damaged one still opens (and is refused where signatures are checked)."""
    if "signature" not in document:
        return None
    signature = document["signature"]
    if not isinstance(signature, dict) or set(signature) != {"algorithm", "key", "value"}:
        raise InvalidManifestError(
            "manifest field 'signature' must be an object of 'algorithm', 'key' and 'value'"
        )
    return Signature(
        algorithm=_text(signature, "algorithm", "signature."),
        key=_text(signature, "key", "signature."),
        value=_text(signature, "value", "signature."),
    )


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


# The personalisation per bundle format: the entries alone (1), or with the
# 16 bytes each carries (2).
_PERSON = {1: b"warmenv-entries", 2: b"warmenv-entries2"}


class Digest:
    """The running content digest of a sorted entry stream (of bundle format 1 or 2)."""

    __slots__ = ("_hash",)

    def __init__(self, format: int = 1) -> None:
        self._hash = hashlib.blake2b(digest_size=32, person=_PERSON[format])

    def update(self, namespace: bytes, key: bytes, value: bytes, carried: bytes = b"") -> None:
        """Add one entry; `carried` is its 16 bytes in format 2 (empty in format 1)."""
        update = self._hash.update
        update(len(namespace).to_bytes(8, "little"))
        update(namespace)
        update(len(key).to_bytes(8, "little"))
        update(key)
        update(len(value).to_bytes(8, "little"))
        update(value)
        update(carried)

    def update_framed(self, framed: bytes) -> None:
        """Add entries framed as `update` frames them (each length as 8 bytes, little-endian)."""
        self._hash.update(framed)

    def value(self) -> str:
        return _DIGEST_PREFIX + self._hash.hexdigest()


def _carrying_nothing(written_at: float | None, cost: float | None) -> bytes:
    """What an entry carries into a format-1 digest or file: nothing."""
    return b""


U64 = struct.Struct("<Q").pack
"""A length as the digest frames it: 8 bytes, little-endian."""
_U64 = U64


class BackgroundDigest:
    """The same digest, fed a batch at a time and computed on a thread of its own.

    hashlib lets go of the GIL while it hashes a large buffer, so hashing one
    batch overlaps reading and writing the next; on two cores that hides most
    of the hashing. At most a few batches wait, so memory stays bounded.
    """

    def __init__(self, format: int = 1) -> None:
        self._digest = Digest(format)
        self.format = format
        self._prefixes: dict[str, bytes] = {}
        self._batches: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._thread: threading.Thread | None = None  # started by the first batch

    def add(self, entries: Iterable[tuple[str, bytes, bytes]]) -> None:
        """Hash `(namespace, key, value)` entries, in the order of the digest (format 1)."""
        assert self.format == 1, "a format-2 digest covers what entries carry: add_carrying"
        parts: list[bytes] = []
        prefixes, new_prefix = self._prefixes, self._new_prefix
        for namespace, key, value in entries:
            prefix = prefixes.get(namespace) or new_prefix(namespace)
            parts += (prefix, _U64(len(key)), key, _U64(len(value)), value)
        self._put(parts)

    def add_carrying(self, entries: Iterable[tuple[str, bytes, bytes, bytes]]) -> None:
        """Hash `(namespace, key, value, carried)` entries, `carried` their 16 bytes (format 2)."""
        assert self.format == 2, "a format-1 digest covers the entries alone: add"
        parts: list[bytes] = []
        prefixes, new_prefix = self._prefixes, self._new_prefix
        for namespace, key, value, carried in entries:
            prefix = prefixes.get(namespace) or new_prefix(namespace)
            parts += (prefix, _U64(len(key)), key, _U64(len(value)), value, carried)
        self._put(parts)

    def add_rows(
        self,
        rows: Iterable[tuple[str, bytes, bytes, float | None, float | None]],
        packed: list[tuple[str, bytes, bytes, bytes]] | None = None,
    ) -> int:
        """Hash entries as export reads them, `(namespace, key, value, written_at, cost)`
        in the order of the digest, what they carry packed (`carried.pack`) in format 2 and
        left out in format 1; the bytes of their keys and values. `packed`, if given,
        receives each entry as a writer stores it: `(namespace, key, value, carried)`, the
        carried bytes empty in format 1. (One loop for all of it: per entry, this is most
        of the Python an export runs.)"""
        parts: list[bytes] = []
        prefixes, new_prefix, u64 = self._prefixes, self._new_prefix, _U64
        pack = _pack_carried if self.format == 2 else _carrying_nothing
        size = 0
        keep = packed.append if packed is not None else None
        for namespace, key, value, written_at, cost in rows:
            prefix = prefixes.get(namespace) or new_prefix(namespace)
            key_size, value_size = len(key), len(value)
            carrying = pack(written_at, cost)
            parts += (prefix, u64(key_size), key, u64(value_size), value, carrying)
            size += key_size + value_size
            if keep is not None:
                keep((namespace, key, value, carrying))
        self._put(parts)
        return size

    def prefix(self, namespace: str) -> bytes:
        """How a namespace is framed in the digest (its length as 8 bytes, then its UTF-8)."""
        return self._prefixes.get(namespace) or self._new_prefix(namespace)

    def add_framed(self, parts: list[bytes]) -> None:
        """Hash entries a reader framed itself, as `Digest.update` frames them (each
        namespace as `prefix` gives it, each length as `U64`), in the digest's order."""
        self._put(parts)

    def _new_prefix(self, namespace: str) -> bytes:
        raw = namespace.encode("utf-8")
        prefix = self._prefixes[namespace] = _U64(len(raw)) + raw
        return prefix

    def _put(self, parts: list[bytes]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._hash, name="warmenv-digest", daemon=True)
            self._thread.start()
        self._batches.put(b"".join(parts))

    def value(self) -> str:
        """The digest of everything added; ends the thread."""
        self.close()
        return self._digest.value()

    def close(self) -> None:
        """End the thread (after what is queued); safe to call twice."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._batches.put(None)
            thread.join()

    def _hash(self) -> None:
        update = self._digest.update_framed
        while (batch := self._batches.get()) is not None:
            update(batch)
