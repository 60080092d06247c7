"""Triton's and torch's fresh-process restores beside `cp -r`, two versions side by side.

Run (the compilers' venv: triton 3.8.0, torch 2.13.0):

    python benchmarks/bench_restore_fresh.py --fixtures /tmp/fx --tree <old> --tree <new> \\
        [--tool triton --tool torch] [--rounds 15] [--scratch /dev/shm] [--callgrind]

`--fixtures DIR` holds each tool's environment after `bench_caches.py`'s
workload compiled cold, was captured and shipped through a bundle; it is made
once (about a minute: the compilers run) and reused while it exists, so the
versions compared restore the very same rows. Each round runs, per tree (the
order rotated each round), one restore as the first of a fresh process
(`PYTHONPATH=<tree>/src`, as bench_caches.py's rows: timed from after the
environment's open to the restore's end, every thread's CPU), then `cp -r` of
what the first tree wrote (the floor, cp's own process: its start included);
medians of `--rounds`. The ratio is each tree's CPU (user + system) over
cp's, and its wall time over cp's, both in the same run.

`--callgrind` counts instead, per tree, the instructions (every thread) of a
fresh process that opens the environment and restores, less one that opens it
and does nothing: a figure load cannot move, but user space only (the kernel's
work on the files, the larger part, is not in it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _report import CHILD, callgrind, cp_r

CHILD_CODE = """
import importlib, json, sys, time
from pathlib import Path
import anyio
from warmenv import open_environment
tool = importlib.import_module("warmenv.caches." + sys.argv[1])

async def main():
    async with open_environment("default", root=Path(sys.argv[2])) as env:
        started, cpu = time.perf_counter(), time.process_time()  # every thread's CPU
        report = await tool.restore(env, Path(sys.argv[3]))
        print(json.dumps({"seconds": time.perf_counter() - started,
                          "cpu": time.process_time() - cpu, "report": repr(report)[:200]}))

anyio.run(main)
"""

TOOLS = ("triton", "torch")


def make_fixtures(fixtures: Path, tools: list[str]) -> None:
    """Each tool's environment after a cold compile, captured and shipped (once)."""
    import bench_caches
    from warmenv import open_environment

    async def make(tool: str, base: Path) -> None:
        variable = "TRITON_CACHE_DIR" if tool == "triton" else "TORCHINDUCTOR_CACHE_DIR"
        first = bench_caches.Machine(base / "a", variable)
        second = bench_caches.Machine(base / "b", variable)
        if tool == "triton":
            import warmenv.caches.triton

            first.run(bench_caches.TRITON, "plain")
            async with open_environment("default", root=first.root) as env:
                await warmenv.caches.triton.capture(env, first.cache)
        else:
            first.run(bench_caches.TORCH, "ours")  # captured at exit
        await bench_caches._ship(first, second, base / "bundle")

    for tool in tools:
        root = fixtures / tool / "b" / "warmenv-root"
        if not root.is_dir():
            shutil.rmtree(fixtures / tool, ignore_errors=True)
            anyio.run(make, tool, fixtures / tool)


def root_of(fixtures: Path, tool: str) -> Path:
    return fixtures / tool / "b" / "warmenv-root"


def restore_once(tree: Path, tool: str, root: Path, target: Path) -> dict[str, float]:
    environ = {**os.environ, "PYTHONPATH": str(tree / "src")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD_CODE, tool, str(root), str(target)],
        env=environ, capture_output=True, text=True, check=True,
    )  # fmt: skip
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def side_by_side(args: argparse.Namespace, tool: str, scratch: Path) -> None:
    trees: list[Path] = args.tree
    ours: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    walls: list[float] = []
    cpus: list[float] = []
    for i in range(args.rounds):
        order = trees[i % len(trees) :] + trees[: i % len(trees)]
        targets = []
        for n, tree in enumerate(order):
            target = scratch / f"{tool}-{i}-{n}"
            ours[tree].append(restore_once(tree, tool, root_of(args.fixtures, tool), target))
            targets.append(target)
        copied = cp_r(scratch / f"{tool}-{i}-0", scratch / f"{tool}-{i}-cp")
        walls.append(copied.wall)
        cpus.append(copied.cpu)
        for target in [*targets, scratch / f"{tool}-{i}-cp"]:
            shutil.rmtree(target)
    cp_wall, cp_cpu = statistics.median(walls), statistics.median(cpus)
    print(f"\n{tool}: {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print("| tree | CPU | ratio to cp -r's CPU | wall | ratio to cp -r's wall |")
    print("|---|---:|---:|---:|---:|")
    print(f"| cp -r | {cp_cpu * 1e3:.2f} ms | 1.00x | {cp_wall * 1e3:.2f} ms | 1.00x |")
    for tree in trees:
        cpu = statistics.median(r["cpu"] for r in ours[tree])
        wall = statistics.median(r["seconds"] for r in ours[tree])
        print(
            f"| {tree} | {cpu * 1e3:.2f} ms | {cpu / cp_cpu:.2f}x | {wall * 1e3:.2f} ms "
            f"| {wall / cp_wall:.2f}x |"
        )


def child(run: str, tool: str, root: Path, target: Path) -> None:
    """callgrind's child: open the environment, then restore (or not)."""
    import importlib

    from warmenv import open_environment

    module = importlib.import_module("warmenv.caches." + tool)

    async def main() -> None:
        async with open_environment("default", root=root) as env:
            if run == "restore":
                await module.restore(env, target)

    anyio.run(main)


def counted(args: argparse.Namespace, tool: str, scratch: Path) -> None:
    print(f"\n{tool}: instructions of a fresh process's restore, every thread (callgrind)")
    print("| tree | restore less nothing | threads |")
    print("|---|---:|---|")
    root = str(root_of(args.fixtures, tool))
    for tree in args.tree:
        target = scratch / f"{tool}-counted"
        nothing = callgrind(__file__, tree, ["nothing", tool, root, str(target)])
        restored = callgrind(__file__, tree, ["restore", tool, root, str(target)])
        shutil.rmtree(target)
        extra = sum(restored.threads) - sum(nothing.threads)
        shown = ", ".join(f"{t:,}" for t in restored.threads)
        print(f"| {tree} | {extra:,} | {shown} |", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        child(sys.argv[2], sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--fixtures", type=Path, required=True)
    parser.add_argument("--tree", type=Path, action="append")
    parser.add_argument("--tool", action="append", choices=TOOLS)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--scratch", type=Path, help="where restores and copies are written")
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args()
    args.tree = [t.resolve() for t in args.tree or [Path(__file__).parent.parent]]
    tools = args.tool or list(TOOLS)
    make_fixtures(args.fixtures, tools)
    started = time.strftime("%H:%M UTC", time.gmtime())
    print(f"started {started}, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="restore-fresh-", dir=args.scratch) as scratch:
        for tool in tools:
            (counted if args.callgrind else side_by_side)(args, tool, Path(scratch))


if __name__ == "__main__":
    main()
