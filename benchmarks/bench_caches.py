"""Compiler caches: each tool's cold start beside its warm one, and our restore beside `cp -r`.

Run: python benchmarks/bench_caches.py [--tool triton] [--tool torch]

Per tool, two "machines" (directories at different absolute paths, each
with its own warmenv root and compiler cache) and fresh processes only:
machine A compiles cold into an empty cache and its environment captures
it; a bundle is exported and imported into B's fresh root; B restores and
runs the same workload warm. The figure is the workload's own time in the
process (compile and first call: the interpreter's start-up and the
compiler's import are the same cold or warm, and are left out, as is
Triton's own key, a hash of its 500 MB library computed once per process
cold or warm, shown in a row of its own); the ratio is warm over cold.
Beside each restore, the floor: `cp -r` of the very files it wrote, in
the same run, alternated with it; each restore is the first of a fresh
process (as `warmenv run` and `use()` pay it), medians of 5, in wall time and
in CPU time (`--scratch /dev/shm` writes them to memory: the file system's
own cost of a new file, the same for both, then does not drown the rest).
The trap rows show what users do today (a plain copy; torch's Mega-Cache
bytes alone) in the same run.

Targets (issue 20): Triton warm >= 20x faster than cold, torch.compile on
CPU >= 3.5x; restore <= 1.5x of `cp -r`.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).parent))
import warmenv
from _report import Row, cp_r, print_table
from warmenv import open_environment
from warmenv.bundle import export_bundle, import_bundle

TRITON = """
    import json, sys, time
    mode = sys.argv[1]
    import triton
    import triton.language as tl
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    reported = []
    knobs.compilation.listener = lambda **report: reported.append(report["cache_hit"])
    if mode == "live":
        import warmenv.caches.triton
        warmenv.caches.triton.use()

    @triton.jit
    def matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * sam + (k + rk)[None, :] * sak)
            y = tl.load(b + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))

    signature = {"a": "*fp16", "b": "*fp16", "c": "*fp16", "M": "i32", "N": "i32", "K": "i32",
                 "sam": "i32", "sak": "i32", "sbk": "i32", "sbn": "i32", "scm": "i32", "scn": "i32"}
    configs = [(bm, bn, bk, warps) for bm in (32, 64, 128) for bn in (32, 64)
               for bk in (32, 64) for warps in (4, 8)]
    from triton.runtime.cache import triton_key

    started = time.perf_counter()
    triton_key()  # once per process, cold or warm: a hash of Triton's 500 MB library
    keyed = time.perf_counter()
    for bm, bn, bk, warps in configs:
        source = ASTSource(matmul, signature, constexprs={"BM": bm, "BN": bn, "BK": bk})
        triton.compile(source, target=GPUTarget("cuda", 80, 32), options={"num_warps": warps})
    print(json.dumps({"seconds": time.perf_counter() - keyed, "key": keyed - started,
                      "kernels": len(configs),
                      "hits": reported.count(True), "misses": reported.count(False)}))
"""

TORCH = """
    import json, sys, time
    mode = sys.argv[1]
    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import cpp_builder

    built = []
    _build = cpp_builder.CppBuilder.build

    def build(self):
        if self.get_target_file_path().endswith(".so"):
            built.append(1)
        return _build(self)

    cpp_builder.CppBuilder.build = build
    if mode == "ours":
        import warmenv.caches.torch
        warmenv.caches.torch.use()  # captured at exit
    elif mode == "bytes-alone":
        torch.compiler.load_cache_artifacts(open(sys.argv[2], "rb").read())

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(),
                torch.nn.Conv2d(16, 16, 3), torch.nn.ReLU(),
            )
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 10)
            )

        def forward(self, x):
            return torch.softmax(self.mlp(self.convs(x).mean((2, 3))), -1)

    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.no_grad():
        torch.compile(Net())(torch.randn(4, 3, 32, 32))
    seconds = time.perf_counter() - started
    if mode == "save-bytes":
        open(sys.argv[2], "wb").write(torch.compiler.save_cache_artifacts()[0])
    print(json.dumps({"seconds": seconds, "built": len(built),
                      "hits": counters["inductor"]["fxgraph_cache_hit"],
                      "misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


class Machine:
    def __init__(self, home: Path, cache_variable: str) -> None:
        self.home = home
        self.root = home / "warmenv-root"
        self.cache = home / "cache"
        self.cache_variable = cache_variable
        home.mkdir(parents=True)

    def run(self, code: str, *args: str) -> dict[str, Any]:
        script = self.home / "app.py"
        script.write_text(textwrap.dedent(code))
        variables = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TRITON_", "TORCHINDUCTOR_", "WARMENV_"))
        }
        variables.update(
            {
                "WARMENV_ROOT": str(self.root),
                self.cache_variable: str(self.cache),
                "TORCHINDUCTOR_COMPILE_THREADS": "1",
            }
        )
        done = subprocess.run(
            [sys.executable, str(script), *args],
            cwd=self.home,
            env=variables,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"the workload failed:\n{done.stderr[-4000:]}")
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return found


async def _ship(source: Machine, target: Machine, bundle: Path) -> None:
    async with open_environment("default", root=source.root) as env:
        await export_bundle([env], bundle, name="bench", version="1")
    async with open_environment("default", root=target.root) as env:
        await import_bundle(bundle, env)


RESTORE = """
import importlib, json, sys, time
from pathlib import Path
import anyio
from warmenv import open_environment
tool = importlib.import_module("warmenv.caches." + sys.argv[1])

async def main():
    async with open_environment("default", root=Path(sys.argv[2])) as env:
        started, cpu = time.perf_counter(), time.process_time()  # every thread's CPU
        await tool.restore(env, Path(sys.argv[3]))
        print(json.dumps({"seconds": time.perf_counter() - started,
                          "cpu": time.process_time() - cpu}))

anyio.run(main)
"""


def _restore_beside_cp(tool: str, root: Path, base: Path, rounds: int = 5) -> list[Row]:
    """Our restore, the first of a fresh process (as `warmenv run` and `use()` pay it:
    its facts read, its threads started), alternated with `cp -r` of what it wrote;
    medians of `rounds` each, into a fresh directory each time (under `--scratch`).
    Two rows: wall time, and CPU time (user + system: every thread of the restoring
    process during the restore; cp's whole process), which a loaded machine moves less."""
    scratch = SCRATCH[0] or base
    restores, copies = [], []
    for i in range(rounds):
        target = scratch / f"{tool}-restored-{i}"
        done = subprocess.run(
            [sys.executable, "-c", RESTORE, tool, str(root), str(target)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        restores.append(json.loads(done.stdout.strip().splitlines()[-1]))
        copies.append(cp_r(target, scratch / f"{tool}-cp-{i}"))
    files = [p for p in (scratch / f"{tool}-restored-0").rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    for i in range(rounds):
        shutil.rmtree(scratch / f"{tool}-restored-{i}")
        shutil.rmtree(scratch / f"{tool}-cp-{i}")
    what = f"restore ({len(files)} files, {size:,} bytes; median of {rounds}, fresh processes)"
    return [
        Row(what, statistics.median(r["seconds"] for r in restores) * 1e3, "ms",
            "cp -r of the same files", statistics.median(c.wall for c in copies) * 1e3,
            "<= 1.5x"),
        Row(f"{what}: CPU", statistics.median(r["cpu"] for r in restores) * 1e3, "ms",
            "cp -r's CPU", statistics.median(c.cpu for c in copies) * 1e3, "<= 1.5x"),
    ]  # fmt: skip


SCRATCH: list[Path | None] = [None]
"""`--scratch`: where the restores and their copies are written (default: the run's
temporary directory). A file system's own cost of making a file (ext4 here: up to 0.8 ms
of CPU per file or directory under other helpers' load) is paid by both sides alike."""


async def bench_triton(base: Path) -> list[Row]:
    import warmenv.caches.triton as ours

    first = Machine(base / "triton-a" / "srv", "TRITON_CACHE_DIR")
    second = Machine(base / "triton-b" / "home" / "ci" / "app", "TRITON_CACHE_DIR")
    cold = first.run(TRITON, "plain")
    async with open_environment("default", root=first.root) as env:
        await ours.capture(env, first.cache)
    await _ship(first, second, base / "triton.bundle")
    copied = Machine(base / "triton-c" / "elsewhere", "TRITON_CACHE_DIR")
    shutil.copytree(first.cache, copied.cache)
    first.cache.rename(first.home / "gone")  # the first machine's disk is not the others'
    restore_rows = _restore_beside_cp("triton", second.root, base)
    async with open_environment("default", root=second.root) as env:
        await ours.restore(env, second.cache)
    warm = second.run(TRITON, "plain")
    plain_copy = copied.run(TRITON, "plain")
    live_home = Machine(base / "triton-d" / "live", "TRITON_CACHE_DIR")
    shutil.copytree(second.root, live_home.root)
    live = live_home.run(TRITON, "live")
    assert warm["hits"] == cold["kernels"] and live["hits"] == cold["kernels"], (warm, live)
    n = cold["kernels"]
    return [
        Row(f"warm, restored ({n} kernels, {warm['hits']} hits)", warm["seconds"], "s",
            "cold", cold["seconds"], ">= 20x faster"),
        Row(f"warm, live from the environment ({live['hits']} hits)", live["seconds"], "s",
            "cold", cold["seconds"], ">= 20x faster"),
        Row("Triton's own key, once per process (warm run; in neither row above)", warm["key"],
            "s", "cold run's", cold["key"], ""),
        Row(f"after a plain copy, original gone ({plain_copy['hits']} hits)",
            plain_copy["seconds"], "s", "cold", cold["seconds"], "(the trap)"),
        *restore_rows,
    ]  # fmt: skip


async def bench_torch(base: Path) -> list[Row]:
    first = Machine(base / "torch-a" / "srv", "TORCHINDUCTOR_CACHE_DIR")
    second = Machine(base / "torch-b" / "home" / "ci" / "app", "TORCHINDUCTOR_CACHE_DIR")
    alone = Machine(base / "torch-c" / "elsewhere", "TORCHINDUCTOR_CACHE_DIR")
    bytes_file = base / "torch-artifacts.bin"
    cold = first.run(TORCH, "ours")  # captured at exit into A's environment
    first.run(TORCH, "save-bytes", str(bytes_file))  # the same graph, its Mega-Cache bytes
    await _ship(first, second, base / "torch.bundle")
    warm = second.run(TORCH, "ours")
    bytes_alone = alone.run(TORCH, "bytes-alone", str(bytes_file))
    restore_rows = _restore_beside_cp("torch", second.root, base)
    return [
        Row(f"warm, ours ({warm['hits']} graph hits, {warm['built']} g++ builds)",
            warm["seconds"], "s", f"cold ({cold['built']} g++ builds)", cold["seconds"],
            ">= 3.5x faster"),
        Row(f"Mega-Cache bytes alone ({bytes_alone['hits']} graph hits, "
            f"{bytes_alone['built']} g++ builds)", bytes_alone["seconds"], "s", "cold",
            cold["seconds"], "(the trap)"),
        *restore_rows,
    ]  # fmt: skip


TOOLS = {"triton": bench_triton, "torch": bench_torch}


async def main(tools: list[str]) -> None:
    for name in tools:
        with tempfile.TemporaryDirectory() as directory:
            rows = await TOOLS[name](Path(directory))
        print_table(f"{name}: warm beside cold, restore beside cp -r", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", action="append", choices=sorted(TOOLS))
    parser.add_argument("--scratch", type=Path, help="where restores and copies are written")
    # As pip byte-compiles a wheel: an editable install under PYTHONDONTWRITEBYTECODE=1
    # compiles warmenv from source in every child process (bench_caches_cpu.py).
    compileall.compile_dir(Path(warmenv.__file__).parent, quiet=1)
    arguments = parser.parse_args()
    SCRATCH[0] = arguments.scratch
    anyio.run(main, arguments.tool or sorted(TOOLS))
