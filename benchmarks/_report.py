"""Shared helpers for the benchmark scripts: timing loops, the `cp -r` floor and ratio tables."""

from __future__ import annotations

import platform
import resource
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
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
