"""Two environments of one root, real Numba: each captures only what its own runs compiled.

The new-user review's finding, as it was found: with one root,
`warmenv run --cache numba --env a -- python nb.py`, then
`warmenv run --cache numba --env b -- python -c 'print("no numba here")'`:
the second run said "captured 2 files (10,749 bytes) ... 2 new" and `ls b`
listed `caches.numba`, because every environment of a root cached in
`<root>/caches/numba`. Each environment now has its own default directory
(`<root>/<environment>.caches/<tool>`, tests/test_cache_homes.py), under
`warmenv run` and `use()` alike.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from compilers.machines import Machine, require
from compilers.test_compiler_numba import KERNELS
from warmenv import open_environment

NB = """
    import json
    import numpy as np
    import kernels

    a = np.arange(10.0)
    kernels.dot(a, a), kernels.smooth(a), kernels.count_above(a, 3.0)
    hits = sum(
        sum(d.stats.cache_hits.values()) for d in (kernels.dot, kernels.smooth, kernels.count_above)
    )
    print(json.dumps({"numba_hits": hits}), flush=True)
"""

NO_NUMBA = """
    import json
    print(json.dumps({"numba": "no numba here"}), flush=True)
"""

USE = """
    import json, sys
    import warmenv.caches.numba

    warmed = warmenv.caches.numba.use(sys.argv[1], capture_at_exit=False)
    if sys.argv[2] == "compile":
        import numpy as np
        import kernels
        kernels.dot(np.arange(10.0), np.arange(10.0))
    captured = warmed.capture()
    print(json.dumps({
        "cache_dir": str(warmed.cache_dir),
        "restored": warmed.restored.written,
        "hits": warmed.hits,
        "files": captured.files,
    }), flush=True)
"""


def _numba_namespaces(root: Path, name: str) -> list[str]:
    async def listed() -> list[str]:
        async with open_environment(name, root=root) as env:
            return [s.namespace for s in await env.namespaces()]

    return [n for n in anyio.run(listed) if n.startswith("caches.numba/")]


def test_a_run_in_another_environment_captures_nothing_of_the_first_s(
    machines: tuple[Machine, Machine],
) -> None:
    require("numba")
    machine, _ = machines
    machine.write("kernels.py", KERNELS)
    machine.write("nb.py", NB)
    machine.write("no_numba.py", NO_NUMBA)
    _, in_a = machine.warmenv_run(("numba",), "nb.py", env={"WARMENV_ENVIRONMENT": "a"})
    assert in_a["tools"]["numba"]["captured"]["stored"] == 3 + 3  # a's files are there to take

    _, in_b = machine.warmenv_run(("numba",), "no_numba.py", env={"WARMENV_ENVIRONMENT": "b"})

    numba_in_b = in_b["tools"]["numba"]
    assert (numba_in_b["captured"]["files"], numba_in_b["captured"]["stored"]) == (0, 0)
    assert _numba_namespaces(machine.root, "b") == []
    assert len(_numba_namespaces(machine.root, "a")) == 1
    assert numba_in_b["cache_dir"] == str(machine.root / "b.caches" / "numba")
    assert in_a["tools"]["numba"]["cache_dir"] == str(machine.root / "a.caches" / "numba")


def test_a_numba_program_in_another_environment_hits_nothing_the_first_compiled(
    machines: tuple[Machine, Machine],
) -> None:
    """The finding's other face: b's run reported a's leftover files as its cache hits."""
    require("numba")
    machine, _ = machines
    machine.write("kernels.py", KERNELS)
    machine.write("nb.py", NB)
    machine.warmenv_run(("numba",), "nb.py", env={"WARMENV_ENVIRONMENT": "a"})

    in_b, report = machine.warmenv_run(("numba",), "nb.py", env={"WARMENV_ENVIRONMENT": "b"})
    again_in_a, _ = machine.warmenv_run(("numba",), "nb.py", env={"WARMENV_ENVIRONMENT": "a"})

    assert in_b == {"numba_hits": 0}
    assert report["tools"]["numba"]["restored"]["written"] == 0
    assert again_in_a == {"numba_hits": 3}  # a's own directory still serves a


def test_use_in_another_environment_captures_nothing_of_the_first_s(
    machines: tuple[Machine, Machine],
) -> None:
    require("numba")
    machine, _ = machines
    machine.write("kernels.py", KERNELS)
    use = str(machine.write("use.py", USE))
    in_a = machine.run("python", use, "a", "compile")
    assert in_a["files"] == 1 + 1  # dot's index and its one signature's data

    in_b = machine.run("python", use, "b", "nothing")

    assert (in_b["restored"], in_b["files"]) == (0, 0)
    assert _numba_namespaces(machine.root, "b") == []
    assert in_a["cache_dir"] == str(machine.root / "a.caches" / "numba")
    assert in_b["cache_dir"] == str(machine.root / "b.caches" / "numba")
