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

import sys
import tempfile
from pathlib import Path

from _report import whole_runs

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
            # What `nothing` runs, taken off every run's main thread: the floor's too.
            anyio.run(anyio.sleep, 0)
        else:
            anyio.run(export)


def make_source(root: Path, entries: int) -> Path:
    """The environment every child exports: `entries` 1 KiB values, as bench_bundle.py
    makes it."""
    import anyio

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_bundle

    return anyio.run(bench_bundle.make_source, root, entries, 1024)


def main() -> None:
    whole_runs(__doc__, __file__, child, make_source, WHAT, ("export", "main, worker, digest"))


if __name__ == "__main__":
    main()
