"""`warmenv run`'s hooks in its command: entry points its compilers load by themselves.

No compiler is needed here: the entry points are loaded as JAX and torch
load theirs (`importlib.metadata.entry_points(group=...)`), in a fresh
interpreter whose `PYTHONPATH` is what `warmenv run` gives its command. The
compilers' own tests (tests/compilers/) count real hits through them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import warmenv.caches.jax
import warmenv.caches.torch
from warmenv.caches._children import hook_variables

LOAD = textwrap.dedent(
    """
    import importlib, json, sys
    from importlib.metadata import entry_points
    found = {}
    for group in ("torch.backends", "jax_plugins"):
        for entry in entry_points(group=group):
            if group == "jax_plugins":  # JAX: a module, whose initialize() it calls
                hook = importlib.import_module(entry.value).initialize
            else:  # torch: the object itself
                hook = entry.load()
            hook()
            found[group] = hook.__module__
    print(json.dumps(found))
    """
)


def _load(scratch: Path, *python_options: str) -> dict[str, str]:
    variables: dict[str, str] = {}
    for tool, module in (("torch", warmenv.caches.torch), ("jax", warmenv.caches.jax)):
        variables.update(hook_variables(scratch, tool, module.ENTRY_POINTS, variables))
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    child = subprocess.run(
        [sys.executable, *python_options, "-c", LOAD],
        env={**environ, **variables},
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, str] = json.loads(child.stdout)
    return found


def test_the_command_loads_warmenvs_hooks_through_its_compilers_entry_points(
    tmp_path: Path,
) -> None:
    found = _load(tmp_path)
    assert found == {
        "torch.backends": "warmenv.caches._torch_plugin",
        "jax_plugins": "warmenv.caches._jax_plugin",
    }


def test_a_command_whose_python_has_no_warmenv_loads_hooks_that_do_nothing(
    tmp_path: Path,
) -> None:
    # -S: no site-packages, so no warmenv; torch would fail `import torch` on a hook it
    # cannot load, JAX would log an error: the hooks written for the command are no-ops.
    found = _load(tmp_path, "-S")
    assert found == {
        "torch.backends": "warmenv_run_hooks_torch",
        "jax_plugins": "warmenv_run_hooks_jax",
    }
