"""A flat bundle's lookup finds every key and no other, whatever its fence stride.

A bundle within the fence budget keeps every key (one bisect per lookup); a
larger one keeps one key in 2, 4, 8... and searches the block after it. Both
paths are exercised here on the same exported bundle, over several
namespaces, with absent keys before, between and after the stored ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from warmenv import Namespace, open_environment
from warmenv.bundle import BundleFormat, FlatBundle, export_bundle
from warmenv.bundle.flat import bundle as flat

pytestmark = pytest.mark.anyio

NAMESPACES = [Namespace("app", name, version="1") for name in ("a", "b", "c")]


async def _exported(tmp_path: Path) -> bytes:
    async with open_environment("src", root=tmp_path) as env:
        for i, ns in enumerate(NAMESPACES):
            # Different sizes per namespace: blocks end mid-stride, one namespace is one entry.
            count = (1, 37, 100)[i]
            await env.storage(ns).insert_many(
                (b"k%04d" % (2 * j), b"v%d" % j) for j in range(count)
            )
    out = tmp_path / "b.flat"
    await export_bundle(tmp_path / "src.db", out, name="b", version="1", format=BundleFormat.FLAT)
    return out.read_bytes()


@pytest.mark.parametrize("fences", [1 << 17, 5, 1])
async def test_every_key_is_found_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fences: int
) -> None:
    monkeypatch.setattr(flat, "_MAX_FENCES", fences)
    bundle = FlatBundle.from_bytes(await _exported(tmp_path))
    for i, ns in enumerate(NAMESPACES):
        count = (1, 37, 100)[i]
        for j in range(count):
            assert await bundle.get(ns, b"k%04d" % (2 * j)) == b"v%d" % j
            assert await bundle.get(ns, b"k%04d" % (2 * j + 1)) is None  # between, and after
        assert await bundle.get(ns, b"") is None  # before every key
        assert await bundle.get(ns, b"\xff") is None
    assert await bundle.get("app/1/none", b"k0000") is None


def test_the_stride_keeps_the_fences_within_both_budgets() -> None:
    assert flat._stride(flat._MAX_FENCES, 100) == 1
    assert flat._stride(flat._MAX_FENCES + 1, 100) == 2
    assert flat._stride(10, flat._MAX_FENCE_BYTES * 3) == 4
