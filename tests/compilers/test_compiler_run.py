"""`warmenv run --cache jax --cache numba -- python app.py` on two machines, through a bundle.

The application does not know warmenv: it uses JAX and Numba as it always
does, and `warmenv run` restores their caches before it starts, fixes both
traps through the variables it sets, and captures after. The warm run's hits
are the application's own reading of JAX's and Numba's counters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from compilers.machines import Machine, require, ship
from compilers.test_compiler_numba import KERNELS
from warmenv import open_environment

APP = """
    import json
    import jax, jax.numpy as jnp
    import numpy as np
    from jax import monitoring
    import kernels

    jax_hits = []
    def on_event(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            jax_hits.append(1)
    monitoring.register_event_listener(on_event)

    @jax.jit
    def f(x):
        for i in range(40):
            x = jnp.sin(x) * i + jnp.cos(x)
        return x

    f(jnp.ones(8)).block_until_ready()
    a = np.arange(10.0)
    kernels.dot(a, a), kernels.smooth(a), kernels.count_above(a, 3.0)
    numba_hits = sum(
        sum(d.stats.cache_hits.values()) for d in (kernels.dot, kernels.smooth, kernels.count_above)
    )
    print(json.dumps({"jax_hits": len(jax_hits), "numba_hits": numba_hits}), flush=True)
"""


def _run(machine: Machine) -> tuple[dict[str, Any], dict[str, Any]]:
    machine.write("kernels.py", KERNELS)
    machine.write("app.py", APP)
    minimum = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    return machine.warmenv_run(("jax", "numba"), "app.py", env=minimum)


def test_warmenv_run_warms_jax_and_numba_on_another_machine(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("jax")
    require("numba")
    first, second = machines
    cold, cold_report = _run(first)
    assert cold == {"jax_hits": 0, "numba_hits": 0}
    assert cold_report["tools"]["jax"]["captured"]["stored"] >= 1
    assert cold_report["tools"]["numba"]["captured"]["stored"] == 3 + 3

    ship(first, second, tmp_path)
    warm, warm_report = _run(second)
    assert warm_report["tools"]["jax"]["restored"]["written"] >= 1
    assert warm_report["tools"]["numba"]["restored"]["written"] == 6
    assert warm["numba_hits"] == 3
    assert warm["jax_hits"] >= 1
    assert warm_report["tools"]["numba"]["hits"] == 3  # Numba's count, reported to warmenv

    async def numba_hits() -> int:
        async with open_environment("default", root=second.root) as env:
            found = await env.statistics()
        return sum(n.hits for n in found.namespaces if n.namespace.startswith("caches.numba/"))

    assert anyio.run(numba_hits) == 3  # counted per entry, as `warmenv stats` shows them
