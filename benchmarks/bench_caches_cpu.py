"""JAX and Numba caches carried by warmenv: cold vs warm, our restore vs `cp -r`, in one run.

(bench_caches.py measures Triton and torch.compile.)

Run: python benchmarks/bench_caches_cpu.py [--tool jax --tool numba] [--size issue|one-jit]
[--jax-steps N] [--rounds 5]
(`nox -s caches_demo` runs the JAX row alone: the README's one-command demo.)

--size picks the workload (--jax-steps overrides its JAX steps per jit):
- default: the issue's workload as written, one jit of a 400-step unrolled
  `lax.scan` (JAX); 5 `cache=True` functions, 8 compiled versions, two of
  them `parallel=True` (Numba). On a quiet machine of today these compile
  in under 5 s, so the start-up floor caps the warm/cold ratio.
- issue: as long a cold start as the issue measured (JAX 31 s, Numba
  15.6 s) on this machine when quiet. JAX: 5 jits of 600 unrolled steps,
  each its own computation: one jit of more steps does not do, as JAX
  0.10.2 crashes (SIGSEGV, a thread's stack overflowing in
  libjax_common.so) loading such an executable from its cache at 1,600
  steps (800 load). XLA's compile took 6.0, 12.1, 27.5 and 45.6 s of CPU
  for one jit of 400, 800, 1,600 and 2,400 steps, about 65 s for 5 jits
  of 700, on about 1.8 cores when quiet (so 5 of 600: about 55 s of CPU,
  near 31 s on a quiet machine).
  Numba: the 5 functions defined 14 times over, 70 functions and
  112 compiled versions (16.0 s cold, 0.7 s warm). `--tool jax --size
  issue --rounds 1` takes about two minutes on a quiet machine (three cold
  starts), `--tool numba` one.
- one-jit: the issue's shape (one jit, as in the issue's table) at a cold
  start near the issue's: one jit of an 800-step unrolled `lax.scan`, the
  same app and body (4 executables: the jit and 3 small ones making its
  arguments). It is here to answer whether one jit gets to 10x where
  `issue`'s 5 do not (docs/benchmarks.md, "What a warm JAX start consists
  of"): 800 is the most of the sizes tried that JAX 0.10.2 loads back from
  its own cache (1,000 and 1,200 crash it, SIGSEGV in LLVM's ORC JIT link
  recursing on a worker thread). Cold about 28 to 34 s of CPU on this
  machine at load 3 to 8; JAX's own warm start about 3 s of CPU, of which
  lowering the 800 steps, loading the executable (XLA:CPU rebuilds its
  thunk graph from the serialized module) and the first run (YNNPACK
  builds its runtime for each fused dot) are 2 to 3.5 ms a step. Numba as
  `issue`.

With JAX, the table is followed by the cold and warm processes phase by
phase (medians), from the app's own clock and JAX's monitoring timers:
Python's start, `import jax`, the cache's set-up (warmenv's import and
restore), the arguments, tracing, lowering, the executable's load from the
cache (`cache_retrieval_time_sec`), the rest of the backend's compile, the
rest of the call (dispatch, first run), and the exit, with the load average.

Per tool, each run a fresh interpreter at its own "machine" (a directory at
another absolute path), wall time from the process's start to its end:
- cold: an empty cache; `use()` captures what was compiled at exit;
- the bundle: export from the first machine, import into a fresh root on the
  second;
- plain copy: the first machine's cache directory copied as it is (`cp -r`)
  to a third, the tool at its own default settings (what users do today);
- warm: the second machine, `use()` restoring from the environment into
  an empty cache directory, alternated with the tool's own warm run: the
  third machine's tool reading the cache it wrote there, in place, without
  warmenv; the median of --rounds each, wall and CPU (user + system of the
  process). Their difference is warmenv's cost over the tool itself
  (importing warmenv, the environment's open, the restore, the capture at
  exit);
- restore vs cp -r: the files of the warm run's restore written into an
  empty directory by `warmenv.caches.restore`, and the same files copied
  with `cp -r` from a directory holding them (the floor), alternating, the
  median of --rounds each; wall time, and CPU time (user + system: the
  restore's in this process, every thread's; cp's from `getrusage` of the
  child), which moves less with the machine's load. cp's row includes its
  own process start (fork, exec), ours neither Python's start nor the
  environment's open: the row favours us by that much.
- start-up floor: a process that only imports the tool and
  `warmenv.caches.<tool>` and exits (median of 3): what no cache can save.
warmenv itself is byte-compiled first (`compileall`), as a wheel is when pip
installs it: under `PYTHONDONTWRITEBYTECODE=1` (set on the development
machine) an editable install compiles its 79 modules from source in every
process, 0.3 s of CPU no user pays.
Targets (issue 20): warm >= 10x faster than cold (JAX, Numba); restore
<= 1.5x of `cp -r`.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Final

import anyio
import attrs

import warmenv
from _report import RestoreBesideCp
from warmenv import open_environment
from warmenv.bundle import export_bundle, import_bundle
from warmenv.caches import restore

JAX_APP = """
    import time
    started = time.time()
    import json, sys
    mode, cache, steps, jits = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    clock = time.perf_counter()
    import jax, jax.numpy as jnp
    from jax import monitoring
    phases = {"import": time.perf_counter() - clock}
    counts = {"hits": 0, "misses": 0}
    def on_event(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
        elif event == "/jax/compilation_cache/cache_misses":
            counts["misses"] += 1
    # JAX's own timers: tracing, lowering to MLIR, the backend's compile (on a hit: the
    # cache key, the read and the executable's load; the load alone is the retrieval).
    durations = {}
    def on_duration(event, seconds, **_):
        durations[event] = durations.get(event, 0.0) + seconds
    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
    clock = time.perf_counter()
    # Every compilation is cached (JAX's default skips those under 1 s, which on a
    # loaded machine makes the set cached differ from run to run).
    if mode == "ours":
        import warmenv.caches.jax
        warmenv.caches.jax.use(cache_dir=cache, min_compile_seconds=0)
    else:
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    phases["setup"] = time.perf_counter() - clock

    # The issue's workload: a `steps`-step unrolled loop (400 in the issue), one jit,
    # compile-bound; `jits` of them, each its own computation (a constant k added).
    calls = 0.0
    for k in range(jits):
        def f(x, w, k=k):
            def body(c, i):
                step = jnp.tanh(c @ w + jnp.sin(c) * i)
                return (step + k if k else step), None
            c, _ = jax.lax.scan(body, x, jnp.arange(steps, dtype=jnp.float32), unroll=steps)
            return c

        clock = time.perf_counter()
        x, w = jax.block_until_ready((jnp.ones((8, 32)), jnp.ones((32, 32))))
        phases["arguments"] = phases.get("arguments", 0.0) + time.perf_counter() - clock
        before = dict(durations)
        clock = time.perf_counter()
        jax.jit(f)(x, w).block_until_ready()
        calls += time.perf_counter() - clock
        for event, seconds in durations.items():
            phases[event] = phases.get(event, 0.0) + seconds - before.get(event, 0.0)
    phases["calls"] = calls
    print(json.dumps({**counts, "started": started, "phases": phases}), flush=True)
"""

NUMBA_HEADER = """
    import numpy as np
    from numba import njit, prange

    KERNELS = []
"""

# Defined once per copy (`_{k}` names); each copy is its own 5 functions, 8 versions.
NUMBA_KERNELS = """
    @njit(cache=True, parallel=True)
    def pairwise_{k}(a):
        n = a.shape[0]
        out = np.empty((n, n))
        for i in prange(n):
            for j in range(n):
                d = 0.0
                for k in range(a.shape[1]):
                    t = a[i, k] - a[j, k]
                    d += t * t
                out[i, j] = np.sqrt(d)
        return out

    @njit(cache=True, parallel=True)
    def scale_{k}(a, s):
        out = np.empty_like(a)
        for i in prange(a.shape[0]):
            out[i] = a[i] * s
        return out

    @njit(cache=True)
    def cumulative_{k}(a):
        out = np.empty_like(a)
        total = a[0] * 0
        for i in range(a.shape[0]):
            total += a[i]
            out[i] = total
        return out

    @njit(cache=True)
    def histogram_{k}(a, bins):
        counts = np.zeros(bins, dtype=np.int64)
        low, high = a.min(), a.max()
        for x in a:
            k = int((x - low) / (high - low + 1e-12) * bins)
            counts[min(k, bins - 1)] += 1
        return counts

    @njit(cache=True)
    def smooth_{k}(a):
        out = np.empty_like(a)
        for i in range(a.shape[0]):
            out[i] = 0.5 * a[i] + 0.25 * (a[i - 1] + a[(i + 1) % a.shape[0]])
        return out

    KERNELS.append((pairwise_{k}, scale_{k}, cumulative_{k}, histogram_{k}, smooth_{k}))
"""

NUMBA_APP = """
    import json, os, sys
    mode, cache = sys.argv[1], sys.argv[2]
    if mode == "ours":
        import warmenv.caches.numba
        warmenv.caches.numba.use(cache_dir=cache)
    else:
        os.environ["NUMBA_CACHE_DIR"] = cache
    import numpy as np
    import kernels
    for pairwise, scale, cumulative, histogram, smooth in kernels.KERNELS:
        pairwise(np.random.rand(64, 3))
        for dtype in (np.float64, np.float32):
            v = np.arange(100, dtype=dtype)
            scale(v, dtype(2))
            cumulative(v)
            smooth(v)
        histogram(np.random.rand(100), 10)
    ds = [d for copy in kernels.KERNELS for d in copy]
    print(json.dumps({
        "hits": sum(sum(d.stats.cache_hits.values()) for d in ds),
        "misses": sum(sum(d.stats.cache_misses.values()) for d in ds),
    }), flush=True)
"""


@attrs.frozen
class Workload:
    """How much each tool compiles cold: JAX's jits of unrolled steps, Numba's copies of its 5
    functions."""

    jax_steps: int
    jax_jits: int
    numba_copies: int


SIZES: Final = {
    "default": Workload(jax_steps=400, jax_jits=1, numba_copies=1),
    "issue": Workload(jax_steps=600, jax_jits=5, numba_copies=14),
    "one-jit": Workload(jax_steps=800, jax_jits=1, numba_copies=14),
}


def machine(base: Path, name: str, tool: str, workload: Workload) -> Path:
    home = base / name / "srv" / "app" if name == "a" else base / name / "home" / "ci" / "app"
    home.mkdir(parents=True)
    if tool == "jax":
        (home / "app.py").write_text(textwrap.dedent(JAX_APP))
    else:
        copies = [NUMBA_KERNELS.format(k=k) for k in range(workload.numba_copies)]
        (home / "kernels.py").write_text(textwrap.dedent(NUMBA_HEADER + "".join(copies)))
        (home / "app.py").write_text(textwrap.dedent(NUMBA_APP))
    return home


@attrs.frozen
class Phases:
    """Where a JAX process's wall time went, in seconds, by its own clock and JAX's timers.

    `setup`: the cache's configuration (warmenv's: its import and `use()`,
    the restore); `arguments`: the arrays passed (small jits of their own);
    `load` is JAX's `cache_retrieval_time_sec` (reading an entry and loading
    its executable); `compile` the rest of the backend's compile (the cache
    key, and on a miss XLA's compile); `run` the rest of the jitted calls
    (dispatch, the first execution); `exit` what is left of the wall time
    (warmenv's capture at exit, the interpreter's teardown).
    """

    python: float
    import_jax: float
    setup: float
    arguments: float
    trace: float
    lower: float
    load: float
    compile: float
    run: float
    exit: float

    @classmethod
    def of(cls, report: dict[str, Any], launched: float, wall: float) -> Phases:
        times = report["phases"]
        jit = "/jax/core/compile/"
        trace = times.get(jit + "jaxpr_trace_duration", 0.0)
        lower = times.get(jit + "jaxpr_to_mlir_module_duration", 0.0)
        backend = times.get(jit + "backend_compile_duration", 0.0)
        load = times.get("/jax/compilation_cache/cache_retrieval_time_sec", 0.0)
        python = report["started"] - launched
        run = times["calls"] - trace - lower - backend
        inside = python + times["import"] + times["setup"] + times["arguments"] + times["calls"]
        return cls(
            python, times["import"], times["setup"], times["arguments"], trace, lower, load,
            backend - load, run, wall - inside,
        )  # fmt: skip


@attrs.frozen
class Run:
    """One process of the app: its wall time, its CPU time (user + system) and its cache counts;
    for JAX, its phases."""

    wall: float
    cpu: float
    hits: int
    misses: int
    phases: Phases | None = None


def run(home: Path, mode: str, tool: str, workload: Workload) -> Run:
    variables = {
        k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "NUMBA_", "WARMENV_"))
    }
    variables["WARMENV_ROOT"] = str(home / "root")
    argv = [sys.executable, "app.py", mode, str(home / "cache")]
    if tool == "jax":
        argv += [str(workload.jax_steps), str(workload.jax_jits)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()  # the child's clock too: its start-up is `started` - `launched`
    started = time.perf_counter()
    completed = subprocess.run(
        argv, cwd=home, env=variables, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        raise SystemExit(
            f"{tool} {mode} run failed (exit {completed.returncode}):\n{completed.stderr[-3000:]}"
        )
    counts = json.loads(completed.stdout.strip().splitlines()[-1])
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    phases = Phases.of(counts, launched, elapsed) if "phases" in counts else None
    return Run(elapsed, cpu, counts["hits"], counts["misses"], phases)


def warm_runs(ours: Path, own: Path, tool: str, workload: Workload, rounds: int) -> list[Run]:
    """The median warm run of warmenv's and of the tool's own in place, alternated `rounds` times.

    Each of warmenv's starts from an empty cache directory (the restore is
    what a fresh machine pays); the tool's own reads the cache it wrote, in
    the same directory, without warmenv: the difference is warmenv's cost.
    """
    runs: dict[str, list[Run]] = {"ours": [], "plain": []}
    for _ in range(rounds):
        shutil.rmtree(ours / "cache", ignore_errors=True)
        runs["ours"].append(run(ours, "ours", tool, workload))
        runs["plain"].append(run(own, "plain", tool, workload))
    return [median_run(runs["ours"]), median_run(runs["plain"])]


def median_run(runs: list[Run]) -> Run:
    """Medians of wall, CPU and each phase; the counts of the run with the most misses (they
    should agree)."""
    worst = max(runs, key=lambda r: r.misses)
    wall = statistics.median(r.wall for r in runs)
    phases = [r.phases for r in runs if r.phases is not None]
    median_phases = None
    if phases:
        median_phases = Phases(
            *(
                statistics.median(getattr(p, field.name) for p in phases)
                for field in attrs.fields(Phases)
            )
        )
    return attrs.evolve(
        worst, wall=wall, cpu=statistics.median(r.cpu for r in runs), phases=median_phases
    )


FLOOR = {
    "jax": "import jax, jax.numpy, warmenv.caches.jax",
    "numba": "import numpy, numba, warmenv.caches.numba",
}


def floor_seconds(tool: str) -> float:
    """Median wall time of a process that imports the tool and warmenv's module, nothing more."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", FLOOR[tool]], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def ship(first: Path, second: Path, scratch: Path) -> None:
    bundle = scratch / "bundle"

    async def main() -> None:
        async with open_environment("default", root=first / "root") as env:
            await export_bundle([env], bundle, name="bench", version="1")
        async with open_environment("default", root=second / "root") as env:
            await import_bundle(bundle, env)

    anyio.run(main)


def restore_vs_copy(home: Path, tool: str, rounds: int, scratch: Path) -> dict[str, float]:
    """Medians of our restore and of `cp -r` of the same files, wall and CPU, and the
    file count."""
    module = __import__(f"warmenv.caches.{tool}", fromlist=["tree"])
    tree = module.tree()
    timed = RestoreBesideCp()

    async def restore_once(target: Path) -> int:
        async with open_environment("default", root=home / "root") as env:
            with timed.restoring():
                report = await restore(env, tree, target)
            return report.written

    source = scratch / "restored-once"
    files = anyio.run(restore_once, source)
    timed.ours.clear()
    for i in range(rounds):
        target = scratch / f"ours-{i}"
        anyio.run(restore_once, target)
        copy = scratch / f"copy-{i}"
        timed.copy(source, copy)
        shutil.rmtree(target)
        shutil.rmtree(copy)
    return {**timed.medians(), "files": files}


def workload_of(args: argparse.Namespace) -> Workload:
    workload: Workload = SIZES[args.size]
    if args.jax_steps is not None:
        workload = attrs.evolve(workload, jax_steps=args.jax_steps)
    return workload


def bench(tool: str, args: argparse.Namespace) -> dict[str, Any]:
    workload = workload_of(args)
    with tempfile.TemporaryDirectory(prefix=f"bench-caches-{tool}-") as scratch_name:
        scratch = Path(scratch_name)
        first = machine(scratch, "a", tool, workload)
        second = machine(scratch, "b", tool, workload)
        third = machine(scratch, "c", tool, workload)
        print(f"{tool}: cold run ...", file=sys.stderr, flush=True)
        load_before = os.getloadavg()[0]
        cold = run(first, "ours", tool, workload)
        ship(first, second, scratch)
        print(f"{tool}: plain copy ...", file=sys.stderr, flush=True)
        run(third, "plain", tool, workload)  # the copy's source, and the tool's own warm cache
        fourth = machine(scratch, "d", tool, workload)
        shutil.copytree(third / "cache", fourth / "cache")
        plain = run(fourth, "plain", tool, workload)
        print(f"{tool}: warm runs ...", file=sys.stderr, flush=True)
        warm, own = warm_runs(second, third, tool, workload, args.rounds)
        copied = restore_vs_copy(second, tool, args.rounds, scratch)
        startup = floor_seconds(tool)
    return {
        "load": (load_before, os.getloadavg()[0]),
        "startup": startup,
        "tool": tool,
        "cold": cold,
        "plain": plain,
        "warm": warm,
        "own": own,
        **copied,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", action="append", choices=["jax", "numba"])
    parser.add_argument("--size", choices=sorted(SIZES), default="default")
    parser.add_argument("--jax-steps", type=int, help="JAX's unrolled steps (default: the size's)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    compileall.compile_dir(Path(warmenv.__file__).parent, quiet=1)
    rows = [bench(tool, args) for tool in args.tool or ["jax", "numba"]]
    print()
    workload = workload_of(args)
    print(
        f"--size {args.size}: JAX {workload.jax_jits} jit(s) of {workload.jax_steps} unrolled "
        "steps, "
        f"Numba {5 * workload.numba_copies} functions, {8 * workload.numba_copies} versions"
    )
    columns = ["tool", "cold", "plain copy: wall, hits", "warm: wall, hits", "warm vs cold"]
    columns += ["the tool's own warm, in place", "warmenv's cost: wall, CPU"]
    columns += ["start-up floor", "warm above the floor"]
    columns += ["restore", "cp -r", "restore vs cp -r", "CPU: restore, cp -r, ratio"]
    print("| " + " | ".join(columns) + " |")
    print("| " + " | ".join("---" for _ in columns) + " |")
    for r in rows:
        cold, plain, warm, own = r["cold"], r["plain"], r["warm"], r["own"]
        cells = [
            r["tool"],
            f"{cold.wall:.1f} s ({cold.misses} compiled and cached)",
            f"{plain.wall:.1f} s, {plain.hits} hits",
            f"{warm.wall:.2f} s, {warm.hits} hits",
            f"{cold.wall / warm.wall:.1f}x faster",
            f"{own.wall:.2f} s, {own.hits} hits",
            f"{warm.wall - own.wall:+.2f} s, {warm.cpu - own.cpu:+.2f} s",
            f"{r['startup']:.2f} s",
            f"{warm.wall - r['startup']:.2f} s",
            f"{r['restore'] * 1000:.1f} ms ({r['files']} files)",
            f"{r['cp'] * 1000:.1f} ms",
            f"{r['restore'] / r['cp']:.2f}x",
            f"{r['restore_cpu'] * 1000:.1f} ms, {r['cp_cpu'] * 1000:.1f} ms, "
            f"{r['restore_cpu'] / r['cp_cpu']:.2f}x",
        ]
        print("| " + " | ".join(cells) + " |")
    for r in rows:
        if r["cold"].phases is not None:
            print_phases(r)


def print_phases(row: dict[str, Any]) -> None:
    """The JAX processes phase by phase: cold, warmenv's warm and JAX's own warm (medians)."""
    print()
    print(f"JAX, phase by phase (s; load average {row['load'][0]:.1f} to {row['load'][1]:.1f}):")
    names = [field.name for field in attrs.fields(Phases)]
    print("| run | wall | CPU | " + " | ".join(names) + " |")
    print("| --- " * (3 + len(names)) + "|")
    labelled = [
        ("cold", row["cold"]),
        ("warm, warmenv", row["warm"]),
        ("warm, JAX's own", row["own"]),
    ]
    for label, one in labelled:
        assert one.phases is not None
        times = [getattr(one.phases, name) for name in names]
        cells = [label, f"{one.wall:.2f}", f"{one.cpu:.2f}", *(f"{t:.2f}" for t in times)]
        print("| " + " | ".join(cells) + " |")
    cold, own = row["cold"], row["own"]
    print(
        f"cold vs JAX's own warm: {cold.wall / own.wall:.1f}x in wall time, "
        f"{cold.cpu / own.cpu:.1f}x in CPU time"
    )


if __name__ == "__main__":
    main()
