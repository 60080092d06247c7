"""The hits of `warmenv run`'s command: counted inside it, by hooks its compilers load.

`warmenv run --cache TOOL -- COMMAND` restores before COMMAND and captures
after, but the hits happen inside COMMAND, which has no warmenv in it. So
warmenv gives each compiler in COMMAND a hook that the compiler loads
itself, through its own plug-in mechanism, with no `sitecustomize` and no
`.pth` file:

- Numba: its cache locator (`NUMBA_CACHE_LOCATOR_CLASSES`, which `warmenv
  run` sets anyway to fix Numba's trap).
- Triton: its cache manager (`TRITON_CACHE_MANAGER`), a `FileCacheManager`
  that notes each kernel it finds.
- JAX and torch: entry points (`jax_plugins`, which JAX loads when it
  starts its backends; `torch.backends`, which `import torch` loads). They
  are declared by a distribution written for COMMAND (`warmenv_run_hooks_<tool>`:
  a `.dist-info` directory and a module that imports the hook from
  warmenv, or is a no-op where COMMAND's Python has none) in a directory
  of its own that `warmenv run` puts first on COMMAND's `PYTHONPATH`, so
  only the processes `warmenv run` starts see it; an installed warmenv
  declares none.

Every hook does nothing unless `COUNTS_VARIABLE` names a file; at exit it
appends the tool's own counts to it (one JSON line per process: hits,
misses, and the hits per captured entry, by tree part), and `warmenv run`
adds them up after COMMAND ends (`read_counts`) and counts the hits of
each entry in the environment's statistics, as `use()` does in-process.
The hooks are warmenv's modules: a COMMAND whose Python has no warmenv is
not counted (Numba's locator, which fixes its trap, needs it anyway).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import attrs

__all__ = [
    "COUNTS_VARIABLE",
    "Counts",
    "EntryPoint",
    "hook_variables",
    "read_counts",
    "write_counts",
]

log = logging.getLogger("warmenv.caches")

COUNTS_VARIABLE: Final = "WARMENV_CACHE_COUNTS"
"""Names the file where a tool's hook in a child process appends its hit counts at exit."""
_HOOKS: Final = "warmenv_run_hooks"


def write_counts(
    tool: str, hits: int, misses: int, served: Mapping[str, Mapping[str, int]] | None = None
) -> None:
    """Append this process's counts for `tool` to the file `COUNTS_VARIABLE` names, if any.

    `served`: hits per entry (relative path) per tree part (`files`, ...),
    where the tool says which entries it served.
    """
    path = os.environ.get(COUNTS_VARIABLE)
    if not path:
        return
    by_part = {part: dict(hits) for part, hits in (served or {}).items()}
    record = {"tool": tool, "hits": hits, "misses": misses, "served": by_part}
    try:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
    except OSError:
        log.warning("could not write %s's cache counts to %s", tool, path)


@attrs.define
class Counts:
    """One tool's counts from the processes `warmenv run` ran."""

    hits: int = 0
    misses: int = 0
    served: dict[str, dict[str, int]] = attrs.Factory(dict)
    """Hits per entry (relative path), per tree part."""


def read_counts(path: Path) -> dict[str, Counts]:
    """Each tool's hits, misses and hits per entry, summed over the processes that wrote `path`."""
    found: dict[str, Counts] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return found
    for line in text.splitlines():
        try:
            record = json.loads(line)
            tool, hits, misses = str(record["tool"]), int(record["hits"]), int(record["misses"])
            served = {
                str(part): {str(k): int(n) for k, n in dict(entries).items()}
                for part, entries in dict(record.get("served", {})).items()
            }
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        counts = found.setdefault(tool, Counts())
        counts.hits += hits
        counts.misses += misses
        for part, entries in served.items():
            mine = counts.served.setdefault(part, {})
            for key, n in entries.items():
                mine[key] = mine.get(key, 0) + n
    return found


@attrs.frozen
class EntryPoint:
    """An entry point a tool loads by itself, naming one of warmenv's hooks for it."""

    group: str
    """The tool's entry-point group (`torch.backends`)."""
    hook: str
    """The hook, `module:function` (`warmenv.caches._torch_plugin:autoload`)."""
    names_a_module: bool = False
    """The tool takes a module and calls `function` in it (JAX's `jax_plugins`)."""


def hook_variables(
    scratch: Path, tool: str, entry_points: Iterable[EntryPoint], environ: Mapping[str, str]
) -> dict[str, str]:
    """The variables that let a child's `tool` load the hooks `entry_points` name.

    They are declared by a distribution (`warmenv_run_hooks_<tool>`:
    importlib.metadata keeps one distribution of a name) written in a
    directory of `scratch`, which goes first on `PYTHONPATH`, before what
    `environ` has there. Each entry point names a function of a module
    written beside it that imports the hook from warmenv, or does nothing
    where the command's Python has no warmenv: the tool then loads a no-op
    (torch would fail `import torch` on a hook it cannot load). No entry
    points: no variables.
    """
    chosen = list(entry_points)
    if not chosen:
        return {}
    name = f"{_HOOKS}_{tool.replace('-', '_')}"
    directory = scratch / name
    info = directory / f"{name}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n", encoding="utf-8"
    )
    declared, shim = [], [f'"""`warmenv run`\'s hooks for {tool} (warmenv.caches._children)."""\n']
    for entry in chosen:
        module, _, function = entry.hook.partition(":")
        value = name if entry.names_a_module else f"{name}:{function}"
        declared.append(f"[{entry.group}]\nwarmenv = {value}\n")
        shim.append(
            f"try:\n    from {module} import {function}\n"
            "except ImportError:  # this Python has no warmenv: nothing is counted\n\n"
            f"    def {function}() -> None:\n        pass\n"
        )
    (info / "entry_points.txt").write_text("\n".join(declared), encoding="utf-8")
    (directory / f"{name}.py").write_text("\n".join(shim), encoding="utf-8")
    path = [str(directory), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(path)}
