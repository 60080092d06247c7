"""A compiler's misses are its cache's misses, counted by its own counters, in `warmenv stats`.

A miss is a compilation the tool looked up in its cache and did not find:
Numba's `dispatcher.stats.cache_misses` of the functions that cache (its
own internal functions, compiled without a cache, are never looked up),
JAX's lookups (`compile_requests_use_cache`) without a hit, Triton's kernel
lookups its cache manager did not find (counted in `.../groups`, where
Triton looks a kernel up), Inductor's `fxgraph_cache_miss` (in
`.../fxgraph`). They are counted as misses of the tool's namespace, as hits
are counted as its hits, by `use()` and by `warmenv run`; and `warmenv run` says that JAX left
compilations uncached (below its minimum compile time) only when it did.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio

from compilers.machines import Machine, require, ship
from compilers.test_compiler_numba import KERNELS
from compilers.test_compiler_torch import APP as TORCH_APP
from compilers.test_compiler_torch import VARIABLES as TORCH_VARIABLES
from compilers.test_compiler_triton import KERNELS as TRITON_KERNELS
from compilers.test_compiler_triton import WORKLOAD as TRITON_APP
from warmenv import open_environment
from warmenv._text import plural

NUMBA_APP = """
    import json, sys
    import warmenv.caches.numba
    warmed = warmenv.caches.numba.use(cache_dir=sys.argv[1], capture_at_exit=False)
    import numpy as np
    import kernels

    for dtype in (np.float64, np.float32):
        a = np.arange(10, dtype=dtype)
        kernels.dot(a, a)
        kernels.smooth(a)
        kernels.count_above(a, dtype(3))
    dispatchers = (kernels.dot, kernels.smooth, kernels.count_above)
    misses = sum(sum(d.stats.cache_misses.values()) for d in dispatchers)
    result = {"misses": misses, "warmed_misses": warmed.misses, "warmed_hits": warmed.hits}
    warmed.capture()
    print(json.dumps(result))
"""

JAX_APP = """
    import json
    import jax, jax.numpy as jnp
    from jax import monitoring

    counts = {"requests": 0, "hits": 0}
    def on_event(event, **_):
        if event == "/jax/compilation_cache/compile_requests_use_cache":
            counts["requests"] += 1
        elif event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
    monitoring.register_event_listener(on_event)

    @jax.jit
    def f(x):
        return jnp.sin(x) * 2 + jnp.cos(x)

    f(jnp.ones(8)).block_until_ready()
    print(json.dumps({"misses": counts["requests"] - counts["hits"]}), flush=True)
"""

_NOTE = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 for the command to capture every one"


def _misses(machine: Machine, tool: str, part: str = "files") -> tuple[int, int]:
    """The misses and hits of the tool's namespace of `part`, as `warmenv stats` shows them."""

    async def main() -> tuple[int, int]:
        async with open_environment("default", root=machine.root) as env:
            found = await env.statistics()
        [namespace] = [
            n
            for n in found.namespaces
            if n.namespace.startswith(f"caches.{tool}/") and n.namespace.endswith(f"/{part}")
        ]
        return namespace.misses, namespace.hits

    return anyio.run(main)


def _numba(machine: Machine) -> dict[str, Any]:
    machine.write("kernels.py", KERNELS)
    return machine.run("python", str(machine.write("app.py", NUMBA_APP)), str(machine.cache))


def test_numbas_own_uncached_functions_are_not_counted_as_misses(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("numba")
    first, second = machines
    cold = _numba(first)
    # Three functions, two signatures each; Numba's internal functions (the
    # array methods' implementations) compile too, and were counted before.
    assert cold["misses"] == 6 and cold["warmed_misses"] == 6, cold

    ship(first, second, tmp_path)
    warm = _numba(second)
    assert (warm["warmed_hits"], warm["warmed_misses"]) == (6, 0), warm


def test_numbas_misses_are_counted_in_warmenv_stats(machines: tuple[Machine, Machine]) -> None:
    require("numba")
    first, _ = machines
    cold = _numba(first)
    assert _misses(first, "numba") == (cold["misses"], 0) == (6, 0)


def _jax_run(machine: Machine, environ: dict[str, str]) -> tuple[dict[str, Any], str]:
    """`warmenv run --cache jax -- python app.py`: the app's line and warmenv's lines."""
    machine.write("app.py", JAX_APP)
    completed = machine.process(
        *("python", "-m", "warmenv", "run", "--cache", "jax", "--", sys.executable, "app.py"),
        env=environ,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    app = next(line for line in completed.stdout.splitlines() if line.startswith("{"))
    found = json.loads(app)
    assert isinstance(found, dict)
    return found, completed.stderr


def test_warmenv_run_counts_the_commands_jax_misses_in_warmenv_stats(
    machines: tuple[Machine, Machine],
) -> None:
    require("jax")
    first, _ = machines
    app, said = _jax_run(first, {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
    assert app["misses"] >= 1
    misses = plural(app["misses"], "miss", "misses")
    assert f"jax: 0 cache hits, {misses} (its own counters)" in said, said
    assert _misses(first, "jax") == (app["misses"], 0)


def test_warmenv_run_says_jax_left_compilations_uncached_when_it_did(
    machines: tuple[Machine, Machine],
) -> None:
    require("jax")
    first, second = machines
    # Sub-second compilations, below the minimum the user chose: none is cached.
    app, said = _jax_run(first, {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1.0"})
    assert said.count(_NOTE) == 1, said
    uncached = app["misses"]
    assert f"jax: JAX left {uncached} compilation" in said, said
    # Every compilation cached: nothing to say.
    _, said = _jax_run(second, {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
    assert "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in said, said


def test_warmenv_run_counts_the_commands_triton_misses_in_warmenv_stats(
    machines: tuple[Machine, Machine],
) -> None:
    require("triton")
    first, _ = machines
    first.write("kernels.py", TRITON_APP)
    app, report = first.warmenv_run(("triton",), "kernels.py", "plain")
    assert (app["hits"], app["misses"]) == (0, TRITON_KERNELS), app
    assert report["tools"]["triton"]["misses"] == TRITON_KERNELS
    assert _misses(first, "triton", "groups") == (TRITON_KERNELS, 0)


def test_torchs_graph_misses_are_counted_in_warmenv_stats(
    machines: tuple[Machine, Machine],
) -> None:
    require("torch")
    first, _ = machines
    variables = {**TORCH_VARIABLES, "TORCHINDUCTOR_CACHE_DIR": str(first.cache)}
    app = first.run("python", str(first.write("app.py", TORCH_APP)), "ours", env=variables)
    assert (app["hits"], app["misses"]) == (0, 1), app
    assert _misses(first, "torch", "fxgraph") == (1, 0)
