"""No file can steer the terminal: text from bundles, environments and paths is escaped.

A hostile environment and hostile bundles carry every C0 and C1 control
character, DEL, and a payload that would clear the screen, retitle the
window and forge an "ok" line, in bundle names, manifest fields, namespaces
and file names. Every command prints them in plain output, in JSON and on a
real terminal (rich), on success and in error lines: no control character
reaches the output raw, and the escaped form is what the user reads.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import anyio
import pytest

from test_cli import run_raw, terminal
from warmenv import open_environment
from warmenv._text import brief, clean
from warmenv.bundle import export_bundle

CONTROLS = [chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]]
PAYLOAD = "\x1b[2J\x1b]0;pwned\x07\x9b31m[bold red]FAKE[/] :warning:\r\n- bundle 'x' can hit: ok"
NAME = "evil " + "".join(CONTROLS) + PAYLOAD
# Escaped, and literal: rich markup and emoji codes are not interpreted either.
ESCAPED_PAYLOAD = "\\x1b[2J\\x1b]0;pwned\\x07\\x9b31m[bold red]FAKE[/] :warning:\\r\\n- bundle"
UNSAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}
# What rich itself writes to a terminal: CSI sequences (colour, cursor, erase),
# a redrawn progress line starting with a carriage return.
RICH_CSI = re.compile(r"\r?\x1b\[[0-9;?]*[ -/]*[@-~]")


class Hostile(NamedTuple):
    root: Path  # holds the environment "evil"
    bundles: dict[str, Path]  # by format; the file names carry a payload too
    tampered: Path  # a flat bundle whose content no longer matches its digest


def _namespaces() -> list[str]:
    # One namespace per control character, between letters, so a raw one can
    # never hide inside something a terminal would parse as a whole sequence.
    return [f"app/1/c{ord(ch):02x}{ch}z" for ch in CONTROLS] + [f"app/1/{PAYLOAD}", "app/2/x"]


def _with_manifest(blob: bytes, manifest: bytes) -> bytes:
    """A flat bundle with another manifest (offsets are relative to the data section)."""
    old = int.from_bytes(blob[12:16], "little")
    return blob[:12] + len(manifest).to_bytes(4, "little") + manifest + blob[16 + old :]


def _hostile_manifest(document: dict[str, object]) -> bytes:
    document = dict(document)
    document["name"] = NAME
    document["version"] = "1" + PAYLOAD
    document["created"] = "2024" + PAYLOAD
    environments = document["environments"]
    assert isinstance(environments, list)
    document["environments"] = [
        {**environments[0], "label": "box" + PAYLOAD, "devices": ["gpu" + PAYLOAD]}
    ]
    return json.dumps(document).encode()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    base = tmp_path_factory.mktemp("hostile")
    root = base / "root"

    async def fill() -> None:
        async with open_environment("evil", root=root) as env:
            for namespace in _namespaces():
                await env.storage(namespace).insert(b"key\x1b[2J", b"value")
        for form in ("sqlite", "flat"):
            await export_bundle(
                root / "evil.db",
                base / f"plain.{form}",
                name="placeholder",
                version="1",
                format=form,
            )

    anyio.run(fill)
    bundles = {}
    for form in ("sqlite", "flat"):
        target = base / f"evil\x1b[2J\x9b{form}.bundle"
        source = base / f"plain.{form}"
        if form == "flat":
            blob = source.read_bytes()
            length = int.from_bytes(blob[12:16], "little")
            manifest = _hostile_manifest(json.loads(blob[16 : 16 + length]))
            target.write_bytes(_with_manifest(blob, manifest))
        else:
            shutil.copy(source, target)
            conn = sqlite3.connect(target)
            with conn:
                (text,) = conn.execute("SELECT v FROM meta WHERE k = 'manifest'").fetchone()
                manifest = _hostile_manifest(json.loads(text))
                conn.execute(
                    "UPDATE meta SET v = ? WHERE k = 'manifest'", (manifest.decode("ascii"),)
                )
            conn.close()
        bundles[form] = target
    tampered = base / "tampered\x1b[2J.bundle"
    damaged = bytearray(bundles["flat"].read_bytes())
    damaged[-1] ^= 0xFF  # the last value byte: the structure stays valid, the digest does not
    tampered.write_bytes(bytes(damaged))
    return Hostile(root, bundles, tampered)


def assert_nothing_raw(data: bytes, *, terminal_output: bool = False) -> str:
    """`data` holds no control character but line ends (and, on a terminal, rich's own CSI)."""
    text = data.decode("utf-8")  # strict: no stray byte either
    if terminal_output:
        text = RICH_CSI.sub("", text).replace("\r\n", "\n")
    raw = sorted(
        {f"U+{ord(ch):04X}" for ch in text if unicodedata.category(ch) in UNSAFE and ch != "\n"}
    )
    assert raw == [], f"raw control characters reached the output: {raw}\n{text[:2000]!r}"
    return text


Command = Callable[[Hostile, Path], list[str]]


def _foreign_file(tmp: Path) -> Path:
    path = tmp / "notes\x1b[2J.txt"
    path.write_text("not a bundle")
    return path


COMMANDS: dict[str, Command] = {
    "ls": lambda h, tmp: ["ls", "--env", "evil", "--root", str(h.root)],
    "export": lambda h, tmp: [
        "export",
        str(tmp / "out\x1b[2J\x9b.bundle"),
        "--name",
        "evil",  # a name with control characters is refused (FAILING's export-hostile-name)
        "--app-version",
        "1",
        "--env",
        "evil",
        "--root",
        str(h.root),
    ],
    "purge": lambda h, tmp: [
        "purge",
        "--env",
        "evil",
        "--yes",
        "--root",
        str(shutil.copytree(h.root, tmp / "copy")),
    ],
}


def _bundle_commands(form: str) -> dict[str, Command]:
    return {
        f"inspect-{form}": lambda h, tmp: ["inspect", str(h.bundles[form])],
        f"verify-{form}": lambda h, tmp: ["verify", str(h.bundles[form])],
        f"check-{form}": lambda h, tmp: ["check", str(h.bundles[form]), "--version", "2"],
        f"import-{form}": lambda h, tmp: [
            "import",
            str(h.bundles[form]),
            "--env",
            "fresh",
            "--root",
            str(tmp / "fresh"),
        ],
    }


COMMANDS |= _bundle_commands("sqlite") | _bundle_commands("flat")
# Commands that fail: their one error line names a hostile file or value.
FAILING: dict[str, Command] = {
    "verify-tampered": lambda h, tmp: ["verify", str(h.tampered)],
    "check-tampered": lambda h, tmp: ["check", str(h.tampered)],
    "import-tampered": lambda h, tmp: ["import", str(h.tampered), "--root", str(tmp / "r")],
    "inspect-missing": lambda h, tmp: ["inspect", str(tmp / "gone\x1b[2J\x07.bundle")],
    "ls-bad-name": lambda h, tmp: ["ls", "--env", "bad\x1b[2J", "--root", str(h.root)],
    "ls-missing": lambda h, tmp: ["ls", "--env", "evil", "--root", str(tmp / "no\x1b[2J")],
    "export-onto-a-foreign-file": lambda h, tmp: [
        "export",
        str(_foreign_file(tmp)),
        "--name",
        "n",
        "--app-version",
        "1",
        "--env",
        "evil",
        "--root",
        str(h.root),
    ],
    "bad-option": lambda h, tmp: ["inspect", "x", "--colour\x1b[2J"],
    "export-hostile-name": lambda h, tmp: [
        "export",
        str(tmp / "out.bundle"),
        "--name",
        NAME.replace("\x00", ""),  # argv cannot carry NUL
        "--app-version",
        "1",
        "--env",
        "evil",
        "--root",
        str(h.root),
    ],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_plain_output_escapes_every_control_character(
    hostile: Hostile, tmp_path: Path, command: str
) -> None:
    completed = run_raw(*COMMANDS[command](hostile, tmp_path))
    assert completed.returncode == 0, completed.stderr
    stdout = assert_nothing_raw(completed.stdout)
    assert_nothing_raw(completed.stderr)
    if command.split("-")[0] in ("ls", "inspect", "check"):
        assert ESCAPED_PAYLOAD in stdout  # shown, escaped: not dropped


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_json_output_escapes_every_control_character_and_keeps_the_text(
    hostile: Hostile, tmp_path: Path, command: str
) -> None:
    completed = run_raw(*COMMANDS[command](hostile, tmp_path), "--json")
    assert completed.returncode == 0, completed.stderr
    document = json.loads(assert_nothing_raw(completed.stdout))
    assert_nothing_raw(completed.stderr)
    if command.startswith("inspect"):
        assert document["manifest"]["name"] == NAME  # the exact text, for scripts
        assert f"app/1/{PAYLOAD}" in {n["namespace"] for n in document["namespaces"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_terminal_output_escapes_every_control_character(
    hostile: Hostile, tmp_path: Path, command: str
) -> None:
    status, output = terminal(*COMMANDS[command](hostile, tmp_path))
    text = assert_nothing_raw(output, terminal_output=True)
    assert status == 0, text
    if command.split("-")[0] in ("ls", "inspect", "check"):
        assert ESCAPED_PAYLOAD in text


@pytest.mark.parametrize("json_mode", [False, True], ids=["plain", "json"])
@pytest.mark.parametrize("command", sorted(FAILING))
def test_error_lines_escape_every_control_character(
    hostile: Hostile, tmp_path: Path, command: str, json_mode: bool
) -> None:
    completed = run_raw(*FAILING[command](hostile, tmp_path), *(["--json"] if json_mode else []))
    assert completed.returncode in (1, 2)
    stderr = assert_nothing_raw(completed.stderr)
    assert stderr.startswith("warmenv: error: ")
    assert stderr.count("\n") == 1
    assert "\\x1b[2J" in stderr or "\\x1b" in stderr
    stdout = assert_nothing_raw(completed.stdout)
    if json_mode:
        document = json.loads(stdout)
        assert document["exit"] == completed.returncode
        # The exact text (JSON escapes it), of which the line is the escaped form; a
        # message that quotes a bad argument escaped (ls-bad-name) holds no raw ESC.
        if "tampered" in command or "missing" in command:
            assert "\x1b" in document["error"]
        assert f"warmenv: error: {clean(document['error'])}\n" == stderr


def test_error_lines_on_a_terminal_escape_control_characters(
    hostile: Hostile, tmp_path: Path
) -> None:
    status, output = terminal(*FAILING["verify-tampered"](hostile, tmp_path))
    text = assert_nothing_raw(output, terminal_output=True)
    assert status == 1
    assert "tampered\\x1b[2J.bundle" in text


def test_brief_cuts_outside_text_to_its_limit_and_says_how_much_more() -> None:
    assert brief("x" * 1000) == "x" * 200 + "... (800 more characters)"
    assert brief("short \x1b[2J") == "short \\x1b[2J"


def test_brief_never_cuts_an_escape_in_half() -> None:
    cut = brief("\x1b" * 100, limit=10)
    assert cut == "\\x1b\\x1b... (98 more characters)"
