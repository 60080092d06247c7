"""Machine instructions per entry of a SQLite bundle's import, thread by thread (callgrind).

`bench_bundle.py` times the imports beside their floor (the raw sqlite3 ATTACH
and INSERT OR IGNORE ... SELECT) in wall-clock time, which a loaded machine
moves by 2x between runs. Callgrind counts the instructions of each thread
instead (`--separate-threads=yes`): the main thread (the event loop), the
bundle's connection (the open's checks, the digest pass), the environment's
(the bulk copy) and the digest's own. What it cannot count is the kernel's
work: the private copy (`copy_file_range`) and its removal, reading and
writing pages, the fsyncs; compare those in wall-clock time.

The bundle (`--entries` entries of 1 KiB, as `bench_bundle.py` makes it) is
made once, outside callgrind; each child then runs one import (verify=False or
digest-checked) or the raw copy, or nothing (whose main thread, the cost of
starting, is taken off the others').

Run (valgrind on PATH; `--tree` as often as there are trees to compare):

    python benchmarks/import_instructions.py --tree <a tree> --tree <another> [--entries 10000]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _report import whole_runs

WHAT = ("floor", "verify=False", "digest checked")


def child(what: str, bundle: Path, entries: int) -> None:
    """The process callgrind runs: one import of `bundle`, the raw copy, or nothing."""
    import anyio

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_bundle

    with tempfile.TemporaryDirectory(dir=bundle.parent) as tmp:
        if what == "floor":
            bench_bundle.raw_copy_per_s(bundle, Path(tmp), entries)
            # What `nothing` runs, taken off every run's main thread: the floor's too.
            anyio.run(anyio.sleep, 0)
        elif what in WHAT:
            verify = what == "digest checked"
            anyio.run(bench_bundle.import_per_s, bundle, Path(tmp), "i", entries, verify)
        else:
            anyio.run(anyio.sleep, 0)


def make_bundle(root: Path, entries: int) -> Path:
    """The bundle every child imports: `entries` 1 KiB values, as bench_bundle.py makes it."""
    import anyio

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_bundle

    source = anyio.run(bench_bundle.make_source, root, entries, 1024)
    bundle = root / "b.sqlite"
    anyio.run(bench_bundle.export_per_s, source, bundle, "sqlite", entries)
    return bundle


def main() -> None:
    whole_runs(__doc__, __file__, child, make_bundle, WHAT, ("run", "each thread, main first"))


if __name__ == "__main__":
    main()
