"""`warmenv keygen`, `export --sign`, `verify`/`import --trust` and the configured policy,
run as users run them: in a subprocess, against a real HTTP server for URLs.

A refused bundle is one line on stderr, exit 1, and nothing created: no
environment file, no directory, no staging left behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from conftest import sample_entries
from helpers import CLONE, run_python
from signed import Document, rewrite_manifest
from test_cli import TOTAL, warmenv
from test_download import BundleServer
from warmenv import open_environment
from warmenv.bundle import export_bundle, generate_key
from warmenv.bundle.signing import SigningKey


@pytest.fixture
def warm_root(tmp_path: Path) -> Path:
    """A root whose environment 'warm' holds `sample_entries()`."""
    root = tmp_path / "root"

    async def fill() -> None:
        async with open_environment("warm", root=root) as env:
            for namespace, items in sample_entries().items():
                await env.storage(namespace).insert_many(items.items())

    anyio.run(fill)
    return root


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """Two key pairs (made in-process: the command is `test_keygen_...`'s)."""
    made = {}
    for name in ("ci", "mallory"):
        made[name] = tmp_path / "keys" / name
        made[name].parent.mkdir(exist_ok=True)
        generate_key(made[name])
    return made


def pub(key: Path) -> str:
    return str(key.with_name(key.name + ".pub"))


def export(root: Path, out: Path, bundle_format: str, key: Path | None) -> Path:
    """Export 'warm' (in-process: the command's `--sign` is tested once, below)."""

    async def run() -> None:
        async with open_environment("warm", root=root) as env:
            await export_bundle(
                env, out, name="H100 Linux", version="1", format=bundle_format, sign=key
            )

    anyio.run(run)
    return out


@pytest.fixture
def http_server() -> Iterator[BundleServer]:
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


def _strip(doc: Document) -> None:
    del doc["signature"]


def test_keygen_export_sign_verify_and_import_trust_work_together(
    warm_root: Path, tmp_path: Path, bundle_format: str
) -> None:
    made = warmenv("keygen", str(tmp_path / "ci"), root=None)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[-1] == (tmp_path / "ci.pub").read_text().strip()
    out = tmp_path / "b"
    exported = warmenv(
        "export", str(out), "--name", "n", "--app-version", "1", "--env", "warm",
        "--format", bundle_format, "--sign", str(tmp_path / "ci"), root=warm_root,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    keys = {"ci": tmp_path / "ci"}
    key = Path(pub(keys["ci"])).read_text().strip()
    verified = warmenv("verify", str(out), "--trust", pub(keys["ci"]), root=warm_root)
    assert verified.returncode == 0, verified.stderr
    assert f"signed by {key})" in verified.stdout
    imported = warmenv("import", str(out), "--env", "new", "--trust", key, "--json", root=warm_root)
    assert imported.returncode == 0, imported.stderr
    assert '"signer": "' + key + '"' in imported.stdout
    assert f'"imported": {TOTAL}' in imported.stdout


def test_keygen_never_replaces_a_key(tmp_path: Path, keys: dict[str, Path]) -> None:
    before = keys["ci"].read_bytes()
    completed = warmenv("keygen", str(keys["ci"]), root=None)
    assert completed.returncode == 1
    assert (
        completed.stderr.strip()
        == f"warmenv: error: '{keys['ci']}' exists and was left as it is (keygen never "
        "replaces a file): choose another path for the key"
    )
    assert keys["ci"].read_bytes() == before


def test_a_bundle_signed_by_a_stranger_is_refused_and_nothing_is_created(
    warm_root: Path, tmp_path: Path, keys: dict[str, Path], bundle_format: str
) -> None:
    out = export(warm_root, tmp_path / "b", bundle_format, keys["mallory"])
    for command in ("verify", "import"):
        completed = warmenv(
            command, str(out), "--env", "new", "--trust", pub(keys["ci"]), root=warm_root
        )
        assert completed.returncode == 1, (command, completed.stdout)
        (line,) = completed.stderr.splitlines()
        assert "which is not a trusted key" in line, command
    assert sorted(p.name for p in warm_root.iterdir()) == ["warm.db"]


def test_a_stripped_signature_by_url_is_refused_and_nothing_is_created(
    warm_root: Path,
    tmp_path: Path,
    keys: dict[str, Path],
    bundle_format: str,
    http_server: BundleServer,
) -> None:
    out = export(warm_root, tmp_path / "b", bundle_format, keys["ci"])
    rewrite_manifest(out, _strip)
    url = http_server.put("/b", out.read_bytes())
    fresh = tmp_path / "fresh-root"
    completed = warmenv("import", url, "--env", "new", "--trust", pub(keys["ci"]), root=fresh)
    assert completed.returncode == 1
    assert "is not signed, and a signature is required" in completed.stderr
    assert not fresh.exists()


def test_the_configured_policy_refuses_an_unsigned_import(
    warm_root: Path, tmp_path: Path, keys: dict[str, Path]
) -> None:
    out = export(warm_root, tmp_path / "b", "flat", None)
    policy = {"WARMENV_TRUSTED_KEYS": pub(keys["ci"]), "WARMENV_REQUIRE_SIGNATURE": "1"}
    completed = warmenv("import", str(out), "--env", "new", root=warm_root, env=policy)
    assert completed.returncode == 1
    assert "is not signed, and a signature is required" in completed.stderr
    assert sorted(p.name for p in warm_root.iterdir()) == ["warm.db"]
    signed = export(warm_root, tmp_path / "s", "flat", keys["ci"])
    completed = warmenv("import", str(signed), "--env", "new", root=warm_root, env=policy)
    assert completed.returncode == 0, completed.stderr
    assert "signed by ed25519:" in completed.stdout


def test_a_trust_that_is_not_a_key_is_bad_usage(warm_root: Path, tmp_path: Path) -> None:
    out = export(warm_root, tmp_path / "b", "sqlite", None)
    for given, why in (
        ("nope", "nope: cannot read the key file"),
        ("ed25519:AAAA", "43 characters"),
    ):
        completed = warmenv("verify", str(out), "--trust", given, root=warm_root)
        assert completed.returncode == 2
        assert why in completed.stderr


def test_export_with_a_key_others_can_read_is_refused_and_writes_nothing(
    warm_root: Path, tmp_path: Path, keys: dict[str, Path]
) -> None:
    keys["ci"].chmod(0o640)
    completed = warmenv(
        "export", str(tmp_path / "b"), "--name", "n", "--app-version", "1", "--env", "warm",
        "--sign", str(keys["ci"]), root=warm_root,
    )  # fmt: skip
    assert completed.returncode == 1
    assert f"chmod 600 {keys['ci']}" in completed.stderr
    assert not (tmp_path / "b").exists()


def test_export_signed_with_the_public_key_says_so_not_chmod(
    warm_root: Path, tmp_path: Path, keys: dict[str, Path]
) -> None:
    public = keys["ci"].with_name("ci.pub")  # mode 0644, as keygen writes it
    completed = warmenv(
        "export", str(tmp_path / "b"), "--name", "n", "--app-version", "1", "--env", "warm",
        "--sign", str(public), root=warm_root,
    )  # fmt: skip
    assert completed.returncode == 1
    assert f"{public} holds a public key" in completed.stderr
    assert "chmod" not in completed.stderr
    assert not (tmp_path / "b").exists()


def test_export_signs_with_an_openssh_ed25519_key(warm_root: Path, tmp_path: Path) -> None:
    # The review's case: `ssh-keygen -t ed25519 -N '' -f sk` is an Ed25519 key; it signs.
    assert shutil.which("ssh-keygen"), "install ssh-keygen: apt-get install openssh-client"
    sk = tmp_path / "sk"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(sk)], check=True)
    completed = warmenv(
        "export", str(tmp_path / "b"), "--name", "n", "--app-version", "1", "--env", "warm",
        "--sign", str(sk), root=warm_root,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    signer = str(SigningKey.load(sk).public_key)
    verified = warmenv("verify", str(tmp_path / "b"), "--trust", signer, root=warm_root)
    assert verified.returncode == 0, verified.stderr
    assert signer in verified.stdout


def test_export_signed_with_a_file_of_trusted_keys_says_it_holds_public_keys(
    warm_root: Path, tmp_path: Path, keys: dict[str, Path]
) -> None:
    trusted = tmp_path / "trusted"  # not named .pub: there is no private key beside it
    trusted.write_text(f"# ci\n{keys['ci'].with_name('ci.pub').read_text()}")
    completed = warmenv(
        "export", str(tmp_path / "b"), "--name", "n", "--app-version", "1", "--env", "warm",
        "--sign", str(trusted), root=warm_root,
    )  # fmt: skip
    assert completed.returncode == 1
    assert f"{trusted} holds public keys" in completed.stderr
    assert "sign with the private key that `warmenv keygen` made" in completed.stderr
    assert "without .pub" not in completed.stderr
    assert not (tmp_path / "b").exists()


_KEYGEN_WITHOUT_CRYPTOGRAPHY = """
import sys
sys.modules["cryptography"] = None  # as if it were not installed
from warmenv.cli import main
sys.exit(main(["keygen", sys.argv[1]]))
"""


def test_keygen_without_cryptography_says_how_to_install_it(tmp_path: Path) -> None:
    completed = run_python(_KEYGEN_WITHOUT_CRYPTOGRAPHY, str(tmp_path / "k"))
    assert completed.returncode == 1
    assert completed.stderr.strip().endswith(f"install it with: pip install -e '{CLONE}[sign]'")
    assert list(tmp_path.iterdir()) == []


def test_check_inspect_and_verify_take_a_url_as_import_does(
    warm_root: Path,
    tmp_path: Path,
    keys: dict[str, Path],
    bundle_format: str,
    http_server: BundleServer,
) -> None:
    """A bundle by URL is downloaded into a private copy, read, and removed after."""
    body = export(warm_root, tmp_path / "b", bundle_format, keys["ci"]).read_bytes()
    url = http_server.put("/x.bundle", body)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {"TMPDIR": str(temporary)}
    key = Path(pub(keys["ci"])).read_text().strip()
    shown = warmenv("inspect", url, "--json", root=warm_root, env=env)
    assert shown.returncode == 0, shown.stderr
    inspected = json.loads(shown.stdout)
    assert (inspected["path"], inspected["entries"]) == (url, TOTAL)
    assert inspected["manifest"]["name"] == "H100 Linux"
    verified = warmenv("verify", url, "--trust", key, "--json", root=warm_root, env=env)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["signer"] == key
    checked = warmenv("check", url, "--json", root=warm_root, env=env)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["digest_matches"] is True
    # What is not a bundle, or not signed by a trusted key, is one line naming the URL.
    bad = http_server.put("/bad.bundle", b"<html>not found</html>" * 100)
    for command in ("verify", "check", "inspect"):
        refused = warmenv(command, bad, root=warm_root, env=env)
        assert refused.returncode == 1, (command, refused.stdout)
        (line,) = refused.stderr.splitlines()
        assert "/bad.bundle is an HTML or XML page, not a warmenv bundle" in line, line
    stranger = warmenv("check", url, "--trust", pub(keys["mallory"]), root=warm_root, env=env)
    assert stranger.returncode == 1, stranger.stdout
    (line,) = stranger.stderr.splitlines()
    assert "which is not a trusted key" in line and "/x.bundle" in line, line
    missing = warmenv("inspect", url + ".gone", root=warm_root, env=env)
    assert missing.returncode == 1 and "404" in missing.stderr, missing.stderr
    assert list(temporary.iterdir()) == []  # no download left behind
    assert sorted(p.name for p in warm_root.iterdir()) == ["warm.db"]
