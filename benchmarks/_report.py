"""Shared helpers for the benchmark scripts: timing loops, the `cp -r` floor, ratio tables,
and the callgrind runner of the `*_instructions.py` scripts."""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

# Prepended to the source of the child processes that measure memory.
MEMORY_PROBE = """
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024


def peak_mib():
    # VmHWM, not ru_maxrss: ru_maxrss survives exec and so includes the
    # memory of the (large) benchmark process this child was forked from.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
"""


@attrs.frozen
class Row:
    """One measured figure beside its baseline."""

    name: str
    value: float
    unit: str
    baseline_name: str
    baseline: float
    target: str = ""

    @property
    def ratio(self) -> float:
        return self.value / self.baseline if self.baseline else float("nan")


@attrs.frozen
class Timing:
    """One run's wall time and CPU time (user + system), in seconds."""

    wall: float
    cpu: float


def children_cpu() -> float:
    """User + system seconds of the child processes this process has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cp_r(source: Path, target: Path) -> Timing:
    """`cp -r source target`, the floor of every restore row: its wall time with cp's
    spawn, and cp's own CPU (from `getrusage`, so none of this process's threads)."""
    started, cpu = time.perf_counter(), children_cpu()
    subprocess.run(["cp", "-r", str(source), str(target)], check=True)
    return Timing(time.perf_counter() - started, children_cpu() - cpu)


@attrs.define
class RestoreBesideCp:
    """Rounds of a restore, each beside `cp -r` of the same files (its floor), and
    their medians: wall time and CPU time, ours every thread of this process's
    during the restore, cp's its own."""

    ours: list[Timing] = attrs.field(factory=list)
    floor: list[Timing] = attrs.field(factory=list)

    @contextmanager
    def restoring(self) -> Iterator[None]:
        """Times the block, the restore, as one of ours."""
        started, cpu = time.perf_counter(), time.process_time()
        yield
        self.ours.append(Timing(time.perf_counter() - started, time.process_time() - cpu))

    def copy(self, source: Path, target: Path) -> None:
        """One round of the floor: `cp -r source target`, blocking (nothing else runs)."""
        self.floor.append(cp_r(source, target))

    def medians(self) -> dict[str, float]:
        return {
            "restore": statistics.median(t.wall for t in self.ours),
            "cp": statistics.median(t.wall for t in self.floor),
            "restore_cpu": statistics.median(t.cpu for t in self.ours),
            "cp_cpu": statistics.median(t.cpu for t in self.floor),
        }


def machine() -> str:
    return (
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{platform.system()} {platform.machine()}"
    )


async def per_call_us(fn: Callable[[], Awaitable[object]], n: int, repeat: int = 5) -> float:
    """Best-of-`repeat` mean time per call, in microseconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            await fn()
        best = min(best, time.perf_counter() - start)
    return best / n * 1e6


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n### {title}\n")
    print(f"_{machine()}; {' '.join(sys.argv[1:]) or 'default options'}_\n")
    print("| measure | value | baseline | baseline value | ratio | target |")
    print("|---|---:|---|---:|---:|---|")
    for row in rows:
        print(
            f"| {row.name} | {row.value:,.2f} {row.unit} | {row.baseline_name} | "
            f"{row.baseline:,.2f} {row.unit} | {row.ratio:.2f}x | {row.target} |"
        )


CHILD = "--child"
"""The first argument of an `*_instructions.py` script run as callgrind's child."""


@attrs.frozen
class Counted:
    """What callgrind counted in one child run."""

    threads: tuple[int, ...]
    """Machine instructions of each thread, the main thread first."""
    stdout: str
    """What the child printed."""


def callgrind(
    script: str, tree: Path, args: Sequence[str], *, loop: bool = False, hash_seed: str | None = "0"
) -> Counted:
    """Run `python script --child *args` under callgrind over `tree`'s src, each thread
    counted apart (`--separate-threads=yes`).

    A whole run by default: every thread's instructions from start to exit. With
    `loop`, the child marks its timed loop with two calls of `time.thread_time()`,
    before which callgrind dumps its counts (`--dump-before=time_thread_time`), and
    only the main thread's between the two marks is counted (the part a mark dumps
    is that of the thread that reached it). `hash_seed` is PYTHONHASHSEED (None: the
    interpreter's random one), fixed so that dicts and sets are laid out alike on
    every run.
    """
    with tempfile.TemporaryDirectory() as out:
        dump = Path(out) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            *(["--dump-before=time_thread_time"] if loop else []),
            "--separate-threads=yes",
            f"--callgrind-out-file={dump}",
            sys.executable,
            script,
            CHILD,
            *args,
        ]
        environ = {**os.environ, "PYTHONPATH": str(tree / "src")}
        if hash_seed is not None:
            environ["PYTHONHASHSEED"] = hash_seed
        ran = subprocess.run(command, env=environ, check=True, capture_output=True, text=True)
        # Whole runs: callgrind.out-01 the main thread, -02... the others. Loops: parts
        # .1 the set-up (up to the first mark), .2 the loop; -01 the main thread's.
        parts = [Path(f"{dump}.2-01")] if loop else sorted(Path(out).glob("callgrind.out-*"))
        threads = tuple(total for part in parts if (total := _total(part)) is not None)
    if not threads:
        raise RuntimeError(f"callgrind wrote no counts for {tree} ({script} {' '.join(args)})")
    return Counted(threads, ran.stdout)


def _total(part: Path) -> int | None:
    """The instructions a callgrind dump file counts, or None if it has none (or is absent)."""
    if not part.is_file():
        return None
    for line in part.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    return None


def whole_runs(
    doc: str | None,
    script: str,
    child: Callable[[str, Path, int], None],
    make: Callable[[Path, int], Path],
    runs: Sequence[str],
    columns: tuple[str, str],
) -> None:
    """The command line of a script that counts whole runs per entry, thread by thread.

    As callgrind's child (`--child RUN PATH ENTRIES`) it calls `child(run, path,
    entries)`. Otherwise it parses `--tree` (as often as there are trees) and
    `--entries`, makes the input once outside callgrind (`make(directory, entries)`,
    in a temporary directory) and prints a table: per tree, each of `runs` per entry,
    with the main thread of a child that does nothing (`nothing`: the interpreter's
    start and the imports) taken off the run's. The `floor` run (raw sqlite3, no
    warmenv code) is counted over the first tree only.
    """
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        child(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--tree", type=Path, action="append", required=True)
    parser.add_argument("--entries", type=int, default=10_000)
    args = parser.parse_args()
    n = args.entries
    print(f"| tree | {columns[0]} | all threads | busiest thread | {columns[1]} |")
    print("|---|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        made = make(Path(tmp), n)
        for tree in args.tree:
            start = callgrind(script, tree, ["nothing", str(made), str(n)]).threads[0]
            for run in runs:
                if run != "floor" or tree == args.tree[0]:
                    counted = callgrind(script, tree, [run, str(made), str(n)])
                    print(_thread_row(tree, run, counted, start, n), flush=True)


def _thread_row(tree: Path, run: str, counted: Counted, start: int, n: int) -> str:
    """A row of a whole run's instructions per entry: all threads, the busiest, each
    thread's (main first), `start` taken off the main thread."""
    each = [c / n for c in (counted.threads[0] - start, *counted.threads[1:])]
    shown = ", ".join(f"{c:,.0f}" for c in each)
    return f"| {tree} | {run} | {sum(each):,.0f} | {max(each):,.0f} | {shown} |"
