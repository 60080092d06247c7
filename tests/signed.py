"""Signed bundles for the tests, and the ways an attacker changes one.

`rewrite_manifest` edits a bundle's manifest as an attacker with the file
would, in either format: the SQLite bundle's `meta` row, or the flat
bundle's header (its length field follows), leaving the entries alone.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

Document = dict[str, Any]


def read_manifest(path: Path) -> Document:
    found: list[Document] = []
    rewrite_manifest(path, found.append)
    return found[0]


def rewrite_manifest(
    path: Path, change: Callable[[Document], object], raw: Callable[[str], str] = str
) -> None:
    """Apply `change` to the manifest of the bundle at `path`, in place; `raw` then
    rewrites its JSON text (as no JSON library would write it)."""
    data = path.read_bytes()
    if data.startswith(b"SQLite format 3\x00"):
        conn = sqlite3.connect(path)
        try:
            (text,) = conn.execute("SELECT v FROM meta WHERE k = 'manifest'").fetchone()
            document = json.loads(text)
            change(document)
            text = raw(_dumps(document).decode())
            conn.execute("UPDATE meta SET v = ? WHERE k = 'manifest'", (text,))
            conn.commit()
        finally:
            conn.close()
        return
    assert data.startswith(b"WARMENV\x01"), path
    length = int.from_bytes(data[12:16], "little")
    document = json.loads(data[16 : 16 + length])
    change(document)
    new = raw(_dumps(document).decode()).encode()
    path.write_bytes(data[:12] + len(new).to_bytes(4, "little") + new + data[16 + length :])


def _dumps(document: Document) -> bytes:
    return json.dumps(document, sort_keys=True, ensure_ascii=False).encode("utf-8")
