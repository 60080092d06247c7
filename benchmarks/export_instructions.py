"""Machine instructions per entry of an export, thread by thread, counted by callgrind.

`bench_bundle.py --export-only` times the exports beside their floor (the
same copy in raw sqlite3) in wall-clock time, which a loaded machine moves by
2x between runs. Callgrind counts the instructions instead, the same on
every run, and per thread (`--separate-threads=yes`): an export runs on a
worker thread while its digest's thread frames and hashes, so the wall time
it can reach on two idle cores is set by the busier of the two, and its CPU
by their sum. The source (`--entries` entries of 1 KiB, as `bench_bundle.py`
makes it) is made once, outside callgrind; each child then runs one export,
or the floor, or nothing (the imports and an empty `anyio.run`, whose main
thread is taken off the others' as the cost of starting). What callgrind
cannot count: the kernel's work (reading and writing the files' pages, the
fsync) and waiting, which both sides have.

Run (valgrind on PATH; `--tree` as often as there are trees to compare):

    python benchmarks/export_instructions.py --tree <a tree> --tree <another> [--entries 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _report import CHILD, Counted, callgrind, thread_row

WHAT = ("sqlite", "flat", "floor")


def child(what: str, source: Path, entries: int) -> None:
    """The process callgrind runs: one export of `source`, its floor, or nothing."""
    import anyio

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_bundle
    from warmenv.bundle import export_bundle

    async def export() -> None:
        if what in ("sqlite", "flat"):
            out = source.parent / f"out.{what}"
            await export_bundle(source, out, name="b", version="1", format=what)

    with tempfile.TemporaryDirectory() as tmp:
        if what == "floor":
            bench_bundle.raw_export_per_s(source, Path(tmp), entries)
        else:
            anyio.run(export)


def count(tree: Path, what: str, source: Path, entries: int) -> Counted:
    """Instructions of each thread of a child over `tree`'s src, the main thread first."""
    return callgrind(__file__, tree, [what, str(source), str(entries)])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        child(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, action="append", required=True)
    parser.add_argument("--entries", type=int, default=10_000)
    args = parser.parse_args()
    import anyio

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_bundle

    n = args.entries
    print("| tree | export | all threads | busiest thread | main, worker, digest |")
    print("|---|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        source = anyio.run(bench_bundle.make_source, Path(tmp), n, 1024)
        for tree in args.tree:
            start = count(tree, "nothing", source, n).threads[0]
            for what in WHAT if tree == args.tree[0] else WHAT[:2]:
                print(thread_row(tree, what, count(tree, what, source, n), start, n), flush=True)


if __name__ == "__main__":
    main()
