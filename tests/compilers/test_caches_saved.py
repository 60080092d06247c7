"""A compiler cache's hits save what the tool recorded that compiling them took.

JAX writes each cache entry as its compressor's output of the compile time
(whole seconds) and the executable. A capture stores that time as the
entry's `cost`, so that it travels in the bundle and a hit on the entry,
counted as `use()` and `warmenv run` count JAX's hits, saves it in the
statistics (once per entry per process), for its namespace and its bundle:
never "saved 0.000 s" for a kernel that took seconds to compile. The entries
here are written by JAX's own encoder, in a separate process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compilers.machines import require
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
