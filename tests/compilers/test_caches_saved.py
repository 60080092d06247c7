"""A compiler cache's hits save what the tool recorded that compiling them took.

JAX writes each cache entry as its compressor's output of the compile time
(whole seconds) and the executable. A capture stores that time as the
entry's `cost`, so that it travels in the bundle and a hit on the entry,
counted as `use()` and `warmenv run` count JAX's hits, saves it in the
statistics (once per entry per process), for its namespace and its bundle:
never "saved 0.000 s" for a kernel that took seconds to compile. The entries
here are written by JAX's own encoder, in a separate process.

Where an entry hit recorded no compile time (JAX's under a second, every
Numba entry: Numba records none), `warmenv stats` claims no number it does
not know: "at least" what the others saved, or "unknown", and
`saved_seconds` is null in `--json`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compilers.machines import Machine, require, ship
from compilers.test_caches_misses import NUMBA_APP
from compilers.test_compiler_numba import KERNELS
from warmenv import open_environment
from warmenv.bundle import export_bundle, import_bundle
from warmenv.caches import jax as jax_cache
from warmenv.caches._tree import record_hits

SLOW = "jit_slow-0123abcd-cache"  # compiled in 3 s
FAST = "jit_fast-4567ef01-cache"  # compiled in under a second: JAX records 0

_WRITE = """
import sys
from pathlib import Path
from jax._src import compilation_cache as cc
for name, seconds in ((sys.argv[2], 3), (sys.argv[3], 0)):
    data = cc.compress_executable(cc.combine_executable_and_time(b"exe " * 100, seconds))
    (Path(sys.argv[1]) / name).write_bytes(data)
"""


@pytest.fixture(scope="module")
def jax_entries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("jax")  # JAX's own encoder writes the entries
    where = tmp_path_factory.mktemp("jax-cache")
    subprocess.run([sys.executable, "-c", _WRITE, str(where), SLOW, FAST], check=True, timeout=120)
    return where


@pytest.mark.anyio
async def test_an_imported_jax_hit_saves_the_compile_time_jax_recorded(
    jax_entries: Path, tmp_path: Path, root: Path
) -> None:
    bundle = tmp_path / "jax.bundle"
    async with open_environment("ci", root=tmp_path / "ci") as env:
        await jax_cache.capture(env, jax_entries)
        await export_bundle(env, bundle, name="CPU pods", version="1.0")
    async with open_environment("pod", root=root) as env:
        await import_bundle(bundle, env, version="1.0")
        tree = jax_cache.tree()
        assert await record_hits(env, tree, {SLOW: 2, FAST: 1}) == 3
        stats = await env.statistics()
    (namespace,) = stats.namespaces
    assert namespace.namespace == str(tree.namespace) and namespace.hits == 3
    assert namespace.saved_seconds == 3.0  # once for the slow entry; the fast one unknown
    (imported,) = stats.bundles
    assert imported.distinct_hits == 2 and imported.saved_seconds == 3.0


def _stats(root: Path, name: str, *options: str) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [sys.executable, "-m", "warmenv", "stats", "--root", str(root), "--env", name, *options],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return completed


def _stats_json(root: Path, name: str) -> dict[str, Any]:
    found = json.loads(_stats(root, name, "--json").stdout)
    assert isinstance(found, dict)
    return found


async def _imported_and_hit(
    jax_entries: Path, tmp_path: Path, root: Path, served: dict[str, int]
) -> None:
    bundle = tmp_path / "jax.bundle"
    async with open_environment("ci", root=tmp_path / "ci") as env:
        await jax_cache.capture(env, jax_entries)
        await export_bundle(env, bundle, name="CPU pods", version="1.0")
    async with open_environment("pod", root=root) as env:
        await import_bundle(bundle, env, version="1.0")
        await record_hits(env, jax_cache.tree(), served)


@pytest.mark.anyio
async def test_stats_says_at_least_what_jax_hits_saved_when_one_recorded_no_compile_time(
    jax_entries: Path, tmp_path: Path, root: Path
) -> None:
    await _imported_and_hit(jax_entries, tmp_path, root, {SLOW: 2, FAST: 1})
    found = _stats_json(root, "pod")
    (namespace,) = found["namespaces"]
    assert (namespace["saved_seconds"], namespace["hit_without_cost"]) == (None, 1)
    assert found["saved_seconds"] is None  # 3 s and a saving not known: no total claimed
    (imported,) = found["bundles"]
    assert imported["saved_seconds"] is None
    assert imported["figure"] == "imported 2, hit 2 distinct, saved at least 3.000 s"
    text = _stats(root, "pod").stdout
    assert "the hits saved at least 3.000 s of computation in 1 namespace" in text, text


@pytest.mark.anyio
async def test_stats_says_what_jax_hits_saved_when_each_recorded_its_compile_time(
    jax_entries: Path, tmp_path: Path, root: Path
) -> None:
    await _imported_and_hit(jax_entries, tmp_path, root, {SLOW: 2})
    found = _stats_json(root, "pod")
    (namespace,) = found["namespaces"]
    assert (namespace["saved_seconds"], namespace["hit_without_cost"]) == (3.0, 0)
    assert found["saved_seconds"] == 3.0


def test_stats_says_what_numba_hits_saved_is_unknown(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("numba")
    first, second = machines
    for machine in (first, second):
        machine.write("kernels.py", KERNELS)
        machine.write("app.py", NUMBA_APP)
    first.run("python", "app.py", str(first.cache))
    ship(first, second, tmp_path)
    warm = second.run("python", "app.py", str(second.cache))
    assert warm["warmed_hits"] == 6

    found = _stats_json(second.root, "default")
    [numba] = [n for n in found["namespaces"] if n["namespace"].startswith("caches.numba/")]
    assert numba["hits"] == 6 and numba["saved_seconds"] is None  # Numba records no time
    assert found["saved_seconds"] is None and found["bundles"][0]["saved_seconds"] is None
    text = _stats(second.root, "default").stdout
    assert "what the hits saved is unknown (no cost recorded) in 1 namespace" in text, text
