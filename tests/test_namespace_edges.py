"""Namespaces at the edges of what a file may hold, and a server's words in coredis's records.

An empty namespace row (another program's), a store's own text namespace that
ends like the tag of a non-text row, and coredis's exception text in the tier's
DEBUG line; each was found by a review and fails on the code before its fix.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from pathlib import Path

import anyio
import pytest

from test_cli import warmenv
from warmenv import Purged, open_environment
from warmenv.remote import tier


def _environment(root: Path) -> Path:
    async def fill() -> Path:
        async with open_environment("warm", root=root) as env:
            await env.storage("app/1/k").insert(b"k", b"v")
            await env.storage("solo").insert(b"k", b"v")
            return env.path

    path = anyio.run(fill)
    with sqlite3.connect(path) as conn:  # another program's row: an empty namespace
        conn.execute(
            "INSERT INTO entries (namespace, key, value, origin) VALUES ('', X'6b', X'76', 0)"
        )
    conn.close()
    return path


def test_explain_and_purge_beside_an_empty_namespace(tmp_path: Path) -> None:
    # Both failed with "unexpected ValueError: a namespace must be a non-empty str, got ''":
    # explain of any one-segment namespace, and purge of everything (nothing was deleted).
    root = tmp_path / "root"
    path = _environment(root)
    explained = warmenv("explain", "--env", "warm", "solo", root=root)
    assert explained.returncode == 0, explained.stderr
    purged = warmenv("purge", "--env", "warm", "--yes", root=root)
    assert purged.returncode == 0, purged.stderr
    assert "unexpected" not in purged.stderr and "''" in purged.stderr
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT namespace FROM entries").fetchall() == [("",)]
    conn.close()


@pytest.mark.anyio
async def test_gc_keeps_versions_of_a_text_namespace_ending_like_a_tag(
    tmp_path: Path,
) -> None:
    # A store's own namespace whose path ends in '<BLOB>' was taken for a BLOB row and
    # never evicted by keep_versions.
    async with open_environment("warm", root=tmp_path) as env:
        await env.storage("app/1/img <BLOB>").insert(b"k", b"v", written_at=1_000.0)
        await env.storage("app/2/img <BLOB>").insert(b"k", b"v", written_at=2_000.0)
        purged = await env.gc(keep_versions=1)
        listed = [s.namespace for s in await env.namespaces()]
    assert purged == Purged(1)
    assert listed == ["app/2/img <BLOB>"]


def test_purge_deletes_a_text_namespace_ending_like_a_tag_and_leaves_the_blob_one(
    tmp_path: Path,
) -> None:
    # A store's own namespace ending in ' <BLOB>' was taken for a BLOB row by its
    # name and left; whether a namespace is text is now read beside it, not from it.
    async def fill() -> Path:
        async with open_environment("warm", root=tmp_path) as env:
            await env.storage("app/1/img <BLOB>").insert(b"k", b"v")
            return env.path

    path = anyio.run(fill)
    with sqlite3.connect(path) as conn:  # another program's row: a BLOB namespace
        conn.execute(
            "INSERT INTO entries (namespace, key, value, origin) VALUES (?, X'6b', X'76', 0)",
            (b"app/1/img",),
        )
    conn.close()
    purged = warmenv("purge", "--env", "warm", "--yes", root=tmp_path)
    assert purged.returncode == 0, purged.stderr
    with sqlite3.connect(path) as conn:
        left = conn.execute("SELECT namespace FROM entries").fetchall()
    conn.close()
    assert left == [(b"app/1/img",)]


def test_coredis_s_error_text_is_escaped_in_our_debug_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An AuthorizationError's server text (CLIENT SETINFO answered -NOPERM) went raw.
    class Tier:
        def describe(self) -> str:
            return "Redis at redis://x"

    try:
        raise RuntimeError("\x1b[2J\x1b]0;pwned\x07 setinfo")
    except RuntimeError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("coredis", logging.INFO, __file__, 1, "denied", (), exc_info)
    token = tier._TIER_AT_WORK.set(Tier())  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.DEBUG, logger="warmenv.remote"):
            assert tier._OurConnections().filter(record) is False
    finally:
        tier._TIER_AT_WORK.reset(token)
    ours = [r.getMessage() for r in caplog.records if r.name == "warmenv.remote"]
    assert ours and "\\x1b[2J" in ours[0], ours
    assert not [m for m in ours if "\x1b" in m or "\x07" in m], ours
