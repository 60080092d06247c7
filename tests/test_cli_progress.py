"""Progress of import, export and verify: on a terminal (a real pseudo-terminal), in plain
lines elsewhere, and nothing of it with --quiet or --json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

from test_cli import terminal, warmenv
from test_download import BundleServer
from test_download import server as server  # the HTTP server fixture, over Redis's
from warmenv import open_environment
from warmenv.bundle import export_bundle

ENTRIES = 20_000
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RATE = re.compile(r"\d[\d,]* entries/s")
BYTES = re.compile(r"\d[\d,.]*/\d[\d,.]* (bytes|KiB|MiB)")
BYTES_RATE = re.compile(r"\d[\d,.]* (B|KiB|MiB|GiB)/s")
TIME_LEFT = re.compile(r"eta \d+:\d\d:\d\d")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A root whose environment 'big' holds 20,000 entries (about 2.4 MiB), and its bundle."""
    root = tmp_path_factory.mktemp("progress") / "root"
    bundle = root.parent / "big.bundle"

    async def fill() -> None:
        async with open_environment("big", root=root, remote="") as env:
            items = [(b"k%06d" % i, b"v" * 100) for i in range(ENTRIES)]
            await env.storage("app/1/kernels").insert_many(items)
            await export_bundle(env, bundle, name="big", version="1")

    anyio.run(fill)
    return root, bundle


def shown(*args: str) -> str:
    """What the command shows on a terminal, colours and cursor moves taken out."""
    status, output = terminal(*args)
    text = ANSI.sub("", output.decode("utf-8", "replace"))
    assert status == 0, text
    return text


def test_import_on_a_terminal_shows_rate_bytes_and_time_left(
    big: tuple[Path, Path], tmp_path: Path
) -> None:
    _, bundle = big
    text = shown("import", str(bundle), "--env", "tty", "--root", str(tmp_path / "t"))
    # The digest's own bar: bytes hashed of all of them, their rate, the time left.
    step = [line for line in text.splitlines() if line.startswith("verifying big.bundle")][-1]
    assert "━" in step and BYTES.search(step) and BYTES_RATE.search(step)
    assert TIME_LEFT.search(step)
    assert f"{ENTRIES:,}/{ENTRIES:,} entries" in text
    assert RATE.search(text) and BYTES.search(text) and BYTES_RATE.search(text)
    assert TIME_LEFT.search(text)
    assert f"imported {ENTRIES:,} entries" in text


def test_an_import_without_verification_shows_no_verifying_step(
    big: tuple[Path, Path], tmp_path: Path
) -> None:
    _, bundle = big
    text = shown("import", str(bundle), "--no-verify", "--env", "tty", "--root", str(tmp_path))
    assert "verifying" not in text
    assert RATE.search(text) and TIME_LEFT.search(text)


def test_export_on_a_terminal_shows_rate_bytes_and_time_left(
    big: tuple[Path, Path], tmp_path: Path
) -> None:
    root, _ = big
    out = tmp_path / "again.bundle"
    text = shown(
        "export", str(out), "--name", "n", "--app-version", "1", "--env", "big", "--root", str(root)
    )
    assert f"{ENTRIES:,}/{ENTRIES:,} entries" in text
    assert RATE.search(text) and BYTES.search(text) and BYTES_RATE.search(text)
    assert TIME_LEFT.search(text)


def test_a_download_on_a_terminal_shows_bytes_rate_and_time_left(
    big: tuple[Path, Path], server: BundleServer, tmp_path: Path
) -> None:
    _, bundle = big
    url = server.put("/big.bundle", bundle.read_bytes())
    text = shown("import", url, "--env", "web", "--root", str(tmp_path))
    frames = [line for line in text.splitlines() if line.startswith(f"downloading {url}")]
    line = frames[-1]  # the last drawn: the download complete
    assert BYTES.search(line) and BYTES_RATE.search(line) and TIME_LEFT.search(line)
    assert f"imported {ENTRIES:,} entries" in text


@pytest.mark.parametrize("command", ["verify", "check"])
def test_verify_and_check_on_a_terminal_show_the_digest_step(
    big: tuple[Path, Path], command: str
) -> None:
    _, bundle = big
    text = shown(command, str(bundle))
    step = [line for line in text.splitlines() if "verifying big.bundle" in line][-1]
    # A fraction (bytes hashed of all), the rate, and the time left.
    assert "━" in step and BYTES.search(step) and BYTES_RATE.search(step)
    assert TIME_LEFT.search(step)


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_quiet_and_json_show_no_progress_on_a_terminal(
    big: tuple[Path, Path], tmp_path: Path, flag: str
) -> None:
    _, bundle = big
    text = shown("import", str(bundle), "--env", "q", "--root", str(tmp_path), flag)
    assert "━" not in text and "verifying" not in text
    assert not (RATE.search(text) or BYTES_RATE.search(text) or TIME_LEFT.search(text))
    text = shown("verify", str(bundle), flag)
    assert "━" not in text and "verifying" not in text
    if flag == "--json":
        assert json.loads(text)["ok"] is True


def test_plain_output_says_the_verifying_step_and_the_rate(
    big: tuple[Path, Path], tmp_path: Path
) -> None:
    _, bundle = big
    completed = warmenv("import", str(bundle), "--env", "plain", root=tmp_path)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    # The digest as bytes of the whole, the last line at 100%.
    checked = [line for line in lines if line.startswith("verifying big.bundle: ")]
    assert checked and lines[0] == checked[0]
    assert re.match(r"verifying big\.bundle: 2\.\d MiB/2\.\d MiB \(100%\)", checked[-1])
    last = next(line for line in reversed(lines) if line.startswith("importing big.bundle:"))
    assert last.startswith(f"importing big.bundle: {ENTRIES:,}/{ENTRIES:,} (100%), 2.")
    assert RATE.search(last)


def test_the_verifying_step_counts_the_whole_bundle_when_one_version_is_imported(
    tmp_path: Path,
) -> None:
    root, bundle = tmp_path / "both-root", tmp_path / "both.bundle"

    async def fill() -> None:
        async with open_environment("both", root=root, remote="") as env:
            items = [(b"k%04d" % i, b"v" * 100) for i in range(1_000)]
            await env.storage("app/1/kernels").insert_many(items)
            await env.storage("app/2/kernels").insert(b"k", b"1")
            await export_bundle(env, bundle, name="both", version="1")

    anyio.run(fill)
    completed = warmenv(
        "import", str(bundle), "--app-version", "2", "--env", "plain", root=tmp_path / "r"
    )
    assert completed.returncode == 0, completed.stderr
    checked = [line for line in completed.stdout.splitlines() if line.startswith("verifying ")]
    # Every entry is hashed, the other version's too: the total is the whole bundle's.
    assert re.match(r"verifying both\.bundle: ([\d.]+ KiB)/\1 \(100%\)", checked[-1]), checked
