"""The generic form: any tool that caches in a directory (CuPy, vLLM's torch_compile_cache, ...).

A directory tree is captured file by file into `caches.<tool>/<facts>/files`
and restored atomically file by file (each file appears whole under its
name or not at all, index files last), on the shared core
(`warmenv.caches._tree`, whose docstring states the rules). What decides a
hit is the caller's to say, since warmenv knows nothing of the tool: name
the facts (`facts=("cupy", "cpu")`: CuPy's version and this CPU; see
`Facts`), and entries captured under other facts are never restored here.

    async with warmenv.open_environment() as env:
        await directory.restore(env, "~/.cupy/kernel_cache", tool="cupy", facts=("cupy", "cpu"))
        ...  # run the workload
        await directory.capture(env, "~/.cupy/kernel_cache", tool="cupy", facts=("cupy", "cpu"))
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import anyio.to_thread

from warmenv._facts import Facts
from warmenv.caches._restore import restore_made
from warmenv.caches._tree import CacheTree, CaptureReport, RestoreReport
from warmenv.caches._tree import capture as _capture
from warmenv.environment import Environment

__all__ = ["capture", "restore", "tree"]


def tree(
    tool: str,
    facts: Facts | Sequence[str],
    *,
    part: str = "files",
    index: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> CacheTree:
    """The `CacheTree` of a directory cache: `facts` given, or named and taken here."""
    if isinstance(facts, str):
        raise TypeError(f"facts must be a sequence of names, e.g. ({facts!r},), not a str")
    chosen = facts if isinstance(facts, Facts) else Facts.here(*facts)
    return CacheTree(tool, chosen, part=part, index=tuple(index), exclude=tuple(exclude))


async def capture(
    env: Environment,
    source: str | Path,
    *,
    tool: str,
    facts: Facts | Sequence[str],
    part: str = "files",
    exclude: Sequence[str] = (),
) -> CaptureReport:
    """Store every regular file under `source` into `env` (see the module's docstring)."""
    make = functools.partial(tree, tool, facts, part=part, exclude=exclude)
    return await _capture(env, await anyio.to_thread.run_sync(make), source)  # facts: files


async def restore(
    env: Environment,
    target: str | Path,
    *,
    tool: str,
    facts: Facts | Sequence[str],
    part: str = "files",
    index: Sequence[str] = (),
) -> RestoreReport:
    """Write the files captured under this machine's facts into `target`."""
    make = functools.partial(tree, tool, facts, part=part, index=index)
    return await restore_made(env, make, target)  # the facts read on a worker thread
