"""A compiler-cache restore beside `cp -r` of the same files, without a compiler.

Run: python benchmarks/bench_restore.py [--files 182] [--size 4096] [--directories 14]
[--rounds 30] [--json]

A tree of `--files` files of `--size` bytes spread over `--directories`
directories (Numba's issue-size cache: 182 files in 14 directories) is
captured through the directory form (`warmenv.caches.directory`) into a
fresh environment; then, in one process with the environment open,
`await restore(env, tree, target)` into an empty directory is alternated
with `subprocess.run(["cp", "-r", source, copy])` of the same files (so
the floor includes cp's spawn, as bench_caches*.py's rows do), and the
medians of `--rounds` each are printed, with their ratio (issue 20's
target: <= 1.5x), wall time and CPU time (user + system: ours the process's
during the restore, every thread's; cp's the child's, from `getrusage`).
CPU time moves less with the machine's load than wall time does; neither
side's includes the other's waiting for the disk.

To compare two versions of warmenv side by side, run this script
alternately under each (`PYTHONPATH=<other checkout>/src`): the ratios are
what to compare, as the machine's load moves both rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import anyio

import warmenv
from _report import RestoreBesideCp
from warmenv import open_environment
from warmenv.caches import directory
from warmenv.caches._restore import restore


def build(source: Path, files: int, size: int, directories: int) -> None:
    for i in range(files):
        folder = source / f"d{i % directories:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:05d}.bin").write_bytes(i.to_bytes(4, "big") * (size // 4))


async def bench(args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    source = scratch / "source"
    build(source, args.files, args.size, args.directories)
    tree = directory.tree("bench", ("python",))
    rounds = RestoreBesideCp()
    async with open_environment("default", root=scratch / "root") as env:
        await directory.capture(env, source, tool="bench", facts=("python",))
        await restore(env, tree, scratch / "warm-up")
        for i in range(args.rounds):
            target = scratch / f"ours-{i}"
            with rounds.restoring():
                report = await restore(env, tree, target)
            assert report.written == args.files, report
            copy = scratch / f"copy-{i}"
            # Blocking on purpose: nothing else runs, and the copy is timed alone.
            rounds.copy(source, copy)
            shutil.rmtree(target)
            shutil.rmtree(copy)
    return rounds.medians()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=182)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--directories", type=int, default=14)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--backend", default="asyncio")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--scratch", help="the directory to work in (default: the system's temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-restore-", dir=args.scratch) as scratch:
        result = anyio.run(bench, args, Path(scratch), backend=args.backend)
    result["ratio"] = result["restore"] / result["cp"]
    result["cpu_ratio"] = result["restore_cpu"] / result["cp_cpu"]
    if args.json:
        print(json.dumps({"warmenv": str(Path(warmenv.__file__).parent), **result}))
        return
    print(
        f"{args.files} files of {args.size:,} bytes in {args.directories} directories: "
        f"restore {result['restore'] * 1e3:.2f} ms, cp -r {result['cp'] * 1e3:.2f} ms, "
        f"{result['ratio']:.2f}x; CPU (user + system) {result['restore_cpu'] * 1e3:.2f} ms vs "
        f"{result['cp_cpu'] * 1e3:.2f} ms, {result['cpu_ratio']:.2f}x"
    )


if __name__ == "__main__":
    main()
