"""An export's digest is the digest of what it wrote, however the work is split (issue 23).

Export frames and hashes its rows on the digest's own thread, and the flat
writer packs a batch's sections in one call each, so that little Python runs
per entry on the export's thread. These tests pin that nothing of the
bundle's meaning moved with the work: the manifest's digest is the one
docs/bundle-format.md defines over the entries the file holds (recomputed
here from the spec, `hostile.entries_digest`), over several steps, several
namespaces, known and unknown carried values, from one source (copied inside
SQLite) and from two (merged in Python), in both formats and both format
versions; and a failure on the digest's thread reaches the caller instead of
leaving it waiting.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from hostile import entries_digest
from warmenv import Environment, open_environment
from warmenv.bundle import export_bundle, open_bundle
from warmenv.persistence import carried

pytestmark = pytest.mark.anyio

NAMESPACES = ("app/1/a", "app/1/b", "app/1/c")
PER_NAMESPACE = 900  # three namespaces: more entries than one export step holds (1,024)


async def _fill(env: Environment, parity: int) -> None:
    """Entries whose index has `parity`, carrying known and unknown values."""
    for namespace in NAMESPACES:
        await env.storage(namespace).insert_many(
            (b"k%05d" % i, b"v%d-" % i * (i % 7 + 1))
            for i in range(PER_NAMESPACE)
            if i % 2 == parity
        )
    # What entries carry, set in the file: a cost on every third, none on the rest, and
    # a written_at no reader believes (so exported as unknown) on every fifth.
    conn = sqlite3.connect(env.path)
    with conn:
        conn.execute("UPDATE entries SET cost = (rowid % 97) / 8.0 WHERE rowid % 3 = 0")
        conn.execute("UPDATE entries SET written_at = -1.0 WHERE rowid % 5 = 0")
    conn.close()


async def _held(path: Path, format_version: int) -> list[tuple[str, bytes, bytes, bytes | None]]:
    """The entries the bundle holds, in bundle order, each with its 16 carried bytes
    (format 2) or None (format 1), as read back through the bundle's reader."""
    held: list[tuple[str, bytes, bytes, bytes | None]] = []
    async with open_bundle(path) as bundle:
        for namespace in sorted(s.namespace for s in await bundle.namespaces()):
            async for key, value, written_at, cost in bundle.scan_with_provenance(namespace):
                packed = carried.pack(written_at, cost) if format_version == 2 else None
                held.append((namespace, key, value, packed))
    return held


@pytest.mark.parametrize("format_version", [1, 2])
@pytest.mark.parametrize("fmt", ["sqlite", "flat"])
@pytest.mark.parametrize("sources", [1, 2])
async def test_an_export_digest_is_the_documented_digest_of_what_it_wrote(
    tmp_path: Path, fmt: str, format_version: int, sources: int
) -> None:
    out = tmp_path / f"out.{fmt}"
    async with contextlib.AsyncExitStack() as stack:
        envs = []
        for parity in range(sources):
            env = await stack.enter_async_context(open_environment(f"e{parity}", root=tmp_path))
            await _fill(env, parity)
            envs.append(env)
        report = await export_bundle(
            envs if sources > 1 else envs[0],
            out,
            name="digest",
            version="1",
            format=fmt,
            format_version=format_version,
        )
    held = await _held(out, format_version)
    assert len(held) == report.entries == sources * len(NAMESPACES) * PER_NAMESPACE // 2
    assert [(n, k) for n, k, _, _ in held] == sorted((n, k) for n, k, _, _ in held)
    if format_version == 2:  # both kinds of carried value made it into the file
        assert carried.UNKNOWN * 2 in {c for *_, c in held}
        assert any(c is not None and c[8:] != carried.UNKNOWN for *_, c in held)
    assert report.manifest.digest == entries_digest(held, format_version)
    async with open_bundle(out) as bundle:
        assert await bundle.compute_digest() == report.manifest.digest
