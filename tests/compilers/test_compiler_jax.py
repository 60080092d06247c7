"""JAX: a cache captured on one machine hits on another; a plain copy of it misses.

Each run is a fresh interpreter at its machine's absolute path compiling
three jitted functions (and JAX's small helper computations); hits and
misses are JAX's own `jax.monitoring` events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from compilers.machines import Machine, copy_tree, require, ship
from warmenv import Origin, open_environment

WORKLOAD = """
    import json, logging, sys, time
    started = time.monotonic()

    quiet = []  # what JAX logged below WARNING that reached the application's handlers
    class Seen(logging.Handler):
        def emit(self, record):
            if record.name.startswith("jax") and record.levelno < logging.WARNING:
                quiet.append(record.getMessage())
    logging.getLogger().addHandler(Seen())
    import jax, jax.numpy as jnp
    from jax import monitoring

    counts = {"hits": 0, "misses": 0}
    def on_event(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
        elif event == "/jax/compilation_cache/cache_misses":
            counts["misses"] += 1
    monitoring.register_event_listener(on_event)

    mode, cache = sys.argv[1], sys.argv[2]
    if mode == "ours":
        import warmenv.caches.jax
        warmed = warmenv.caches.jax.use(
            cache_dir=cache, min_compile_seconds=0, capture_at_exit=False
        )
        restored = warmed.restored.written
    elif mode == "run":  # under `warmenv run`: JAX configured by its variables alone
        restored = 0
    else:  # what users do today: JAX's own settings, the cache directory copied
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        restored = 0

    def make(steps, seed):
        def f(x):
            for i in range(steps):
                x = jnp.sin(x) * (i + seed) + jnp.cos(x * seed)
            return x
        return jax.jit(f)

    for seed in (1, 2, 3):
        make(60, seed)(jnp.ones(8)).block_until_ready()
    result = {"restored": restored, "seconds": time.monotonic() - started, **counts, "quiet": quiet}
    if mode == "ours":
        result["warmed_hits"] = warmed.hits
        result["captured"] = warmed.capture().stored
    print(json.dumps(result))
"""


def test_jax_is_installed() -> None:
    require("jax")
    require("jaxlib")


def test_a_jax_cache_captured_on_one_machine_hits_on_another(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("jax")
    first, second = machines
    cold = first.run("python", str(first.write("work.py", WORKLOAD)), "ours", str(first.cache))
    assert cold["hits"] == 0 and cold["misses"] >= 3, cold
    assert cold["captured"] == cold["misses"]

    ship(first, second, tmp_path)
    warm = second.run("python", str(second.write("work.py", WORKLOAD)), "ours", str(second.cache))
    assert warm["restored"] == cold["captured"]
    assert (warm["hits"], warm["misses"]) == (cold["misses"], 0), warm
    assert warm["warmed_hits"] == warm["hits"]  # what use() reports is JAX's own count
    assert warm["quiet"] == []  # hits read from JAX's DEBUG line; the application sees none

    # JAX's hits, per executable it loaded, are hits of the bundle's entries in `warmenv stats`.
    assert _statistics(second) == (warm["hits"],) * 3


def _statistics(machine: Machine) -> tuple[int, int, int]:
    """The JAX namespace's hits, its imported entries' and the bundle's (`warmenv stats`)."""

    async def main() -> tuple[int, int, int]:
        async with open_environment("default", root=machine.root) as env:
            found = await env.statistics()
        [jax] = [n for n in found.namespaces if n.namespace.startswith("caches.jax/")]
        [bundle] = found.bundles
        return jax.hits, jax.hits_by_origin.get(Origin.IMPORTED, 0), bundle.hits

    return anyio.run(main)


def test_warmenv_run_counts_its_commands_jax_hits_in_warmenv_stats(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("jax")
    first, second = machines

    def run(machine: Machine) -> tuple[dict[str, Any], dict[str, Any]]:
        machine.write("work.py", WORKLOAD)
        minimum = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
        return machine.warmenv_run(("jax",), "work.py", "run", "-", env=minimum)

    cold, _ = run(first)
    ship(first, second, tmp_path)
    warm, report = run(second)

    assert (warm["hits"], warm["misses"]) == (cold["misses"], 0), warm
    assert report["tools"]["jax"]["hits"] == warm["hits"]  # JAX's own count, from the command
    assert _statistics(second) == (warm["hits"],) * 3  # per executable, as `use()` counts them
    assert warm["quiet"] == []  # the hook reads JAX's DEBUG hit line; the command sees none


def test_a_plain_copy_of_a_jax_cache_misses(machines: tuple[Machine, Machine]) -> None:
    require("jax")
    first, second = machines
    cold = first.run("python", str(first.write("work.py", WORKLOAD)), "plain", str(first.cache))
    assert cold["misses"] >= 3
    copy_tree(first.cache, second.cache)
    copied = second.run(
        "python", str(second.write("work.py", WORKLOAD)), "plain", str(second.cache)
    )
    # JAX's default setting hashed the first machine's cache path into every key.
    assert (copied["hits"], copied["misses"]) == (0, cold["misses"]), copied


def test_reading_jax_hit_lines_leaves_its_logger_as_the_application_sets_it(
    machines: tuple[Machine, Machine],
) -> None:
    """Below the logger's level nothing new is seen; a level set afterwards still governs."""
    require("jax")
    first, _ = machines
    code = """
        import json, logging, sys
        import warmenv.caches.jax

        seen = []
        class Seen(logging.Handler):
            def emit(self, record):
                seen.append(record.getMessage())
        logging.getLogger().addHandler(Seen())
        logger = logging.getLogger("jax._src.compiler")
        warmenv.caches.jax.configure(sys.argv[1])
        logger.debug("before")
        logger.setLevel(logging.INFO)  # the application's own choice, after use()
        logger.info("chosen")
        logger.debug("below it")
        print(json.dumps({"seen": seen}))
    """
    found = first.run("python", str(first.write("levels.py", code)), str(first.cache))
    assert found["seen"] == ["chosen"]
