"""What a warm JAX start consists of, phase by phase, for workloads of several shapes.

Issue 20's target is "JAX warm >= 10x faster than cold". bench_caches_cpu.py
measures warmenv against JAX's own warm cache on the issue's workload; this
script asks the question under it: for which shapes of workload can any warm
start (JAX's own cache, in place, no warmenv at all) be 10x faster than the
cold one, and where does a warm start's time go. Each workload runs in fresh
processes: cold on an empty cache directory, then warm from it, alternated
--pairs times (a fresh directory per pair), so each ratio comes from runs a
minute apart on a shared machine. Hits and misses are JAX's own counters.

Run: python benchmarks/jax_warm_phases.py [--pairs 2] [WORKLOAD ...]
(or `nox -s bench_caches -- jax_warm_phases.py ...`, which installs JAX)

Workloads (NAME:ARGS):
- unrolled:N: the issue's body (`tanh(c @ w + sin(c) * i)` on 8x32) in one
  jit of an N-step `lax.scan` with `unroll=N`, bench_caches_cpu.py's app.
  JAX 0.10.2 unrolls in XLA, so lowering stays small and XLA's compile
  grows with N; loading it back from the cache crashes (SIGSEGV) from
  about 1,000 steps on.
- mlp_scan:T:U: a `lax.scan` of T steps over a 4-layer residual MLP
  (256 wide: dense, gelu, layer norm), `unroll=U`.
- transformer_grad:L: the gradient of a pre-LN transformer encoder of L
  layers written out (d=256, 4 heads, 128 tokens), a training step's
  compile; its parameters are made by `jax.random` (small jits, cached too).

Per run: wall and CPU (user + system) of the process, and the warm run's
phases: python (interpreter start to the script's first line), import jax,
the arguments (parameters), trace, lower (jaxpr to MLIR), load (JAX's
`cache_retrieval_time_sec`: reading the entry and loading the executable),
compile (the backend's compile less the load: the cache key, or on a miss
XLA's compile), run (the rest of the call: dispatch and the first
execution), exit (the interpreter's teardown). The load average is printed
beside each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

APP = """
    import time
    started = time.time()
    import json, sys
    cache, name, args = sys.argv[1], sys.argv[2], [int(a) for a in sys.argv[3:]]
    clock = time.perf_counter()
    import jax, jax.numpy as jnp
    from jax import lax, monitoring
    phases = {"import": time.perf_counter() - clock}
    counts = {"hits": 0, "misses": 0}
    durations = {}
    def on_event(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
        elif event == "/jax/compilation_cache/cache_misses":
            counts["misses"] += 1
    def on_duration(event, seconds, **_):
        durations[event] = durations.get(event, 0.0) + seconds
    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")

    def unrolled(steps):
        def f(x, w):
            def body(c, i):
                return jnp.tanh(c @ w + jnp.sin(c) * i), None
            c, _ = lax.scan(body, x, jnp.arange(steps, dtype=jnp.float32), unroll=steps)
            return c
        return f, lambda: (jnp.ones((8, 32)), jnp.ones((32, 32)))

    def mlp_scan(length, unroll, width=256, layers=4):
        def f(x, ws):
            def body(c, _):
                for w in ws:
                    h = jax.nn.gelu(c @ w)
                    h = (h - h.mean(-1, keepdims=True)) * lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)
                    c = c + h
                return c, None
            c, _ = lax.scan(body, x, None, length=length, unroll=unroll)
            return c
        return f, lambda: (jnp.ones((16, width)), [jnp.eye(width) / width] * layers)

    def transformer_grad(layers, d=256, heads=4, seq=128):
        def init(key):
            shapes = {n: (d, d) for n in "qkvo"} | {"w1": (d, 4 * d), "w2": (4 * d, d)}
            keys = jax.random.split(key, len(shapes))
            return {
                n: jax.random.normal(k, s) / s[0] ** 0.5 for k, (n, s) in zip(keys, shapes.items())
            }
        def norm(x):
            return (x - x.mean(-1, keepdims=True)) * lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)
        def layer(p, x):
            split = lambda t: t.reshape(seq, heads, d // heads).transpose(1, 0, 2)
            h = norm(x)
            q, k, v = (split(h @ p[n]) for n in "qkv")
            a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / (d // heads) ** 0.5, axis=-1) @ v
            x = x + a.transpose(1, 0, 2).reshape(seq, d) @ p["o"]
            return x + jax.nn.gelu(norm(x) @ p["w1"]) @ p["w2"]
        def loss(params, x):
            for p in params:
                x = layer(p, x)
            return (x ** 2).mean()
        def arguments():
            keys = jax.random.split(jax.random.PRNGKey(0), layers)
            return [init(k) for k in keys], jnp.ones((seq, d))
        return jax.grad(loss), arguments

    shapes = {"unrolled": unrolled, "mlp_scan": mlp_scan, "transformer_grad": transformer_grad}
    f, arguments = shapes[name](*args)
    clock = time.perf_counter()
    values = jax.block_until_ready(arguments())
    phases["arguments"] = time.perf_counter() - clock
    before = dict(durations)
    clock = time.perf_counter()
    jax.block_until_ready(jax.jit(f)(*values))
    phases["call"] = time.perf_counter() - clock
    for event, seconds in durations.items():
        phases[event.rsplit("/", 1)[1]] = seconds - before.get(event, 0.0)
    print(json.dumps({**counts, "phases": phases, "started": started, "finished": time.time()}))
"""

PHASES = ("python", "import", "arguments", "trace", "lower", "load", "compile", "run", "exit")


def run(app: Path, cache: Path, workload: str) -> dict[str, Any]:
    """One fresh process: its wall and CPU time, JAX's counts and its phases."""
    variables = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    name, *args = workload.split(":")
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()
    completed = subprocess.run(
        [sys.executable, str(app), str(cache), name, *args],
        env=variables,
        capture_output=True,
        text=True,
        check=False,
    )
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        return {"failed": completed.returncode, "load": load}
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    times = report["phases"]
    backend = times.get("backend_compile_duration", 0.0)
    load_seconds = times.get("cache_retrieval_time_sec", 0.0)
    trace = times.get("jaxpr_trace_duration", 0.0)
    lower = times.get("jaxpr_to_mlir_module_duration", 0.0)
    phases = {
        "python": report["started"] - launched,
        "import": times["import"],
        "arguments": times["arguments"],
        "trace": trace,
        "lower": lower,
        "load": load_seconds,
        "compile": backend - load_seconds,
        "run": times["call"] - trace - lower - backend,
        "exit": ended - report["finished"],
    }
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "wall": ended - launched,
        "cpu": cpu,
        "load": load,
        "hits": report["hits"],
        "misses": report["misses"],
        "phases": phases,
    }


def line(label: str, one: dict[str, Any]) -> str:
    if "failed" in one:
        return f"| {label} | load {one['load']:.1f} | failed (exit {one['failed']}) |"
    cells = [label, f"{one['load']:.1f}", f"{one['wall']:.2f}", f"{one['cpu']:.2f}"]
    cells.append(f"{one['hits']} / {one['misses']}")
    cells += [f"{one['phases'][p]:.2f}" for p in PHASES]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=["unrolled:800", "transformer_grad:16"])
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    header = ["workload, run", "load", "wall", "CPU", "hits / misses", *PHASES]
    print("| " + " | ".join(header) + " |")
    print("| --- " * len(header) + "|")
    ratios: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="jax-warm-phases-") as scratch_name:
        scratch = Path(scratch_name)
        app = scratch / "app.py"
        app.write_text(textwrap.dedent(APP))
        for workload in args.workloads:
            for pair in range(args.pairs):
                cache = scratch / f"cache-{workload.replace(':', '-')}-{pair}"
                cold = run(app, cache, workload)
                warm = run(app, cache, workload)
                print(line(f"{workload} cold", cold), flush=True)
                print(line(f"{workload} warm", warm), flush=True)
                if "failed" not in cold and "failed" not in warm:
                    wall, cpu = cold["wall"] / warm["wall"], cold["cpu"] / warm["cpu"]
                    ratios.setdefault(workload, []).append(f"{wall:.1f}x wall, {cpu:.1f}x CPU")
    print()
    for workload, pairs in ratios.items():
        print(f"{workload}: cold vs warm, each pair: {'; '.join(pairs)}")


if __name__ == "__main__":
    main()
