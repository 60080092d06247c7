"""Numba: a cache captured on one machine hits on another; a plain copy of it misses.

The application (a module of `@njit(cache=True)` functions and a script
calling them) is written afresh at each machine's absolute path, as a
checkout would be; hits and misses are Numba's own `dispatcher.stats`.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from compilers.machines import Machine, copy_tree, require, ship
from warmenv import Origin, open_environment

KERNELS = """
    import numpy as np
    from numba import njit

    @njit(cache=True)
    def dot(a, b):
        total = 0.0
        for i in range(a.shape[0]):
            total += a[i] * b[i]
        return total

    @njit(cache=True)
    def smooth(a):
        out = np.empty_like(a)
        for i in range(a.shape[0]):
            out[i] = 0.5 * a[i] + 0.25 * (a[i - 1] + a[(i + 1) % a.shape[0]])
        return out

    @njit(cache=True)
    def count_above(a, limit):
        return (a > limit).sum()
"""

MAIN = """
    import json, sys
    mode, cache = sys.argv[1], sys.argv[2]
    if mode == "ours":
        import warmenv.caches.numba
        warmed = warmenv.caches.numba.use(cache_dir=cache, capture_at_exit=False)
    else:  # what users do today: Numba's own cache directory, copied
        import os
        os.environ["NUMBA_CACHE_DIR"] = cache
    import numpy as np
    import kernels

    for dtype in (np.float64, np.float32):
        a = np.arange(10, dtype=dtype)
        kernels.dot(a, a)
        kernels.smooth(a)
        kernels.count_above(a, dtype(3))
    dispatchers = (kernels.dot, kernels.smooth, kernels.count_above)
    hits = sum(sum(d.stats.cache_hits.values()) for d in dispatchers)
    misses = sum(sum(d.stats.cache_misses.values()) for d in dispatchers)
    result = {"hits": hits, "misses": misses}
    if mode == "ours":
        result["warmed_hits"] = warmed.hits
        result["restored"] = warmed.restored.written
        result["captured"] = warmed.capture().stored
    print(json.dumps(result))
"""


def _app(machine: Machine) -> str:
    machine.write("kernels.py", KERNELS)
    return str(machine.write("main.py", MAIN))


def test_numba_is_installed() -> None:
    require("numba")


def test_a_numba_cache_captured_on_one_machine_hits_on_another(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("numba")
    first, second = machines
    cold = first.run("python", _app(first), "ours", str(first.cache))
    assert (cold["hits"], cold["misses"]) == (0, 6), cold
    assert cold["captured"] == 3 + 6  # an index per function, a data file per signature

    ship(first, second, tmp_path)
    warm = second.run("python", _app(second), "ours", str(second.cache))
    assert warm["restored"] == cold["captured"]
    assert (warm["hits"], warm["misses"]) == (6, 0), warm
    assert warm["warmed_hits"] == 6  # what use() reports is Numba's own count

    async def statistics() -> tuple[int, int, int]:
        async with open_environment("default", root=second.root) as env:
            found = await env.statistics()
        [numba] = [n for n in found.namespaces if n.namespace.startswith("caches.numba/")]
        [bundle] = found.bundles
        return numba.hits, numba.hits_by_origin.get(Origin.IMPORTED, 0), bundle.hits

    # Numba's hits, per function, are hits of the bundle's entries in `warmenv stats`.
    assert anyio.run(statistics) == (6, 6, 6)


def test_a_plain_copy_of_a_numba_cache_misses(machines: tuple[Machine, Machine]) -> None:
    require("numba")
    first, second = machines
    cold = first.run("python", _app(first), "plain", str(first.cache))
    assert cold["misses"] == 6
    copy_tree(first.cache, second.cache)
    copied = second.run("python", _app(second), "plain", str(second.cache))
    # Numba looks in `<parent>_<sha1(the source's absolute directory)>`: another one here.
    assert (copied["hits"], copied["misses"]) == (0, 6), copied


COUNTED_WALKS = """
    import gc, json, sys
    import warmenv.caches.numba
    warmed = warmenv.caches.numba.use(cache_dir=sys.argv[1], capture_at_exit=False)
    import numpy as np
    import kernels

    kernels.dot(np.arange(10.0), np.arange(10.0))
    walks = []
    every_object = gc.get_objects
    gc.get_objects = lambda *args: walks.append(1) or every_object(*args)
    captured = warmed.capture()
    print(json.dumps({"walks": len(walks), "stored": captured.stored}))
"""


def test_a_capture_walks_the_process_objects_once(machines: tuple[Machine, Machine]) -> None:
    # Numba's counts are found by walking every object of the process (tens of ms in a
    # large one): hits per entry and misses come from one walk, not one walk each.
    require("numba")
    first, _ = machines
    first.write("kernels.py", KERNELS)
    script = first.write("walks.py", COUNTED_WALKS)
    found = first.run("python", str(script), str(first.cache))
    assert found == {"walks": 1, "stored": 2}, found
