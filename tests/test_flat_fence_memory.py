"""A flat bundle of a few MiB cannot make its reader allocate hundreds.

Keys and values are read from ranges of the data section, and the fence keys
kept at open are copies. A hostile file can point many ranges at one region
(here 254 fence keys, each 1 MiB, all over one 1 MiB run of zeros in a file
of 1.3 MiB): the reader must refuse it before copying, at open, import,
preflight (a signature required) and `warmenv inspect`, each measured in a
child process by its peak RSS. An honest bundle whose long keys fall at fence
positions keeps its fences within their byte budget by a longer stride.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from warmenv import Namespace, open_environment
from warmenv.bundle import BundleFormat, FlatBundle, export_bundle
from warmenv.bundle.flat import bundle as flat
from warmenv.bundle.flat.layout import ENTRY, FLAT_MAGIC, U32

pytestmark = pytest.mark.anyio

MIB = 1 << 20
GROWTH_LIMIT_MIB = 64  # the hostile file claims 254 MiB of fence keys

CHILD = """
import anyio, json, resource, sys, tempfile
from pathlib import Path
from warmenv import open_environment
from warmenv.bundle import BundleError, generate_key, import_bundle, open_bundle, preflight
from warmenv.cli import main as cli

op, path = sys.argv[1], sys.argv[2]
tmp = Path(tempfile.mkdtemp())

async def run():
    if op == "open":
        async with open_bundle(path):
            pass
    elif op == "import":
        async with open_environment("dst", root=tmp) as env:
            await import_bundle(path, env=env)
    elif op == "preflight":
        await preflight(path, trust=[generate_key(tmp / "k.pem")])

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    outcome = repr(cli(["inspect", path])) if op == "inspect" else repr(anyio.run(run))
except BundleError as exc:
    outcome = type(exc).__name__
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"outcome": outcome, "grown_mib": grown}))
"""


async def _aliased_fences(tmp_path: Path, key_len: int) -> Path:
    """A real export's header, then an index of 254 fence keys over one shared region
    (first bytes increasing, so sorted) with short keys between them."""
    async with open_environment("src", root=tmp_path) as env:
        await env.storage(Namespace("app", "x", version="1")).insert(b"k", b"v")
    real = tmp_path / "real.flat"
    await export_bundle(tmp_path / "src.db", real, name="b", version="1", format="flat")
    data = real.read_bytes()
    pos = len(FLAT_MAGIC) + 4
    pos += 4 + U32.unpack_from(data, pos)[0]  # the manifest
    names = U32.unpack_from(data, pos)[0]
    pos += 4
    for _ in range(names):
        pos += 4 + U32.unpack_from(data, pos)[0]
    header = data[:pos]
    firsts = bytes(range(1, 255))
    blob = bytearray(firsts) + bytes(key_len)
    stride = flat._stride(len(firsts), len(firsts) * key_len)
    entries = []
    for j in range(len(firsts)):
        entries.append((j, key_len))  # a fence: blob[j : j + key_len], all overlapping
        for i in range(1, stride):
            entries.append((len(blob), 4))
            blob += bytes([firsts[j], 0xFF]) + i.to_bytes(2, "big")
    value_at = len(blob)
    blob += b"v"
    index = b"".join(ENTRY.pack(0, off, size, value_at, 1) for off, size in entries)
    hostile = tmp_path / "fences.flat"
    carried = bytes(16 * len(entries))  # format 2: what each entry carries, unchecked at open
    hostile.write_bytes(header + U32.pack(len(entries)) + index + carried + bytes(blob))
    return hostile


@pytest.mark.parametrize("op", ["open", "import", "preflight", "inspect"])
async def test_aliased_key_ranges_are_refused_before_they_are_copied(
    tmp_path: Path, op: str
) -> None:
    hostile = await _aliased_fences(tmp_path, MIB)
    assert hostile.stat().st_size < 2 * MIB
    with anyio.fail_after(120):
        done = await anyio.run_process([sys.executable, "-c", CHILD, op, str(hostile)])
    report = json.loads(done.stdout.decode().splitlines()[-1])
    assert report["grown_mib"] < GROWTH_LIMIT_MIB, report
    assert report["outcome"] in ("CorruptBundleError", "1"), (report, done.stderr.decode())
    if op == "inspect":
        assert b"their ranges overlap" in done.stderr


async def _skewed(tmp_path: Path, namespaces: int, count: int) -> bytes:
    """An exported bundle whose every 4th key in each namespace is 1,000 bytes, the
    others 8: each namespace's first key is long, and so is every fence at a stride
    of 4 or more."""
    async with open_environment("src", root=tmp_path) as env:
        for n in range(namespaces):
            await env.storage(Namespace("app", f"n{n}", version="1")).insert_many(
                (_key(i), b"v%d" % i) for i in range(count)
            )
    out = tmp_path / "skewed.flat"
    await export_bundle(tmp_path / "src.db", out, name="b", version="1", format=BundleFormat.FLAT)
    return out.read_bytes()


def _key(i: int) -> bytes:
    return b"%08d" % i + (b"x" * 992 if i % 4 == 0 else b"")


def _fence_bytes(bundle: FlatBundle) -> int:
    return sum(len(key) for _, _, keys in bundle._lookup.values() for key in keys)


async def _all_found(bundle: FlatBundle, namespaces: int, count: int) -> None:
    for n in range(namespaces):
        ns = Namespace("app", f"n{n}", version="1")
        for i in range(count):
            assert await bundle.get(ns, _key(i)) == b"v%d" % i
            assert await bundle.get(ns, _key(i) + b"\x00") is None
        assert await bundle.get(ns, b"") is None


async def test_long_keys_at_fence_positions_lengthen_the_stride(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 64 keys, 16,384 bytes: a stride of 16 by the average, whose 4 fences are all long.
    monkeypatch.setattr(flat, "_MAX_FENCE_BYTES", 2000)
    bundle = FlatBundle.from_bytes(await _skewed(tmp_path, 1, 64))
    assert _fence_bytes(bundle) <= 2000
    assert bundle._stride == 32
    await _all_found(bundle, 1, 64)


async def test_first_keys_over_the_budget_are_kept_and_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each namespace's first key is a fence whatever the stride: 3 of them, 3,000 bytes.
    monkeypatch.setattr(flat, "_MAX_FENCE_BYTES", 2000)
    bundle = FlatBundle.from_bytes(await _skewed(tmp_path, 3, 40))
    assert [len(keys) for _, _, keys in bundle._lookup.values()] == [1, 1, 1]
    await _all_found(bundle, 3, 40)
