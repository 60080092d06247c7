"""torch.compile (Inductor, CPU): caches captured on one machine build nothing on another.

The application is written afresh at each machine's absolute path; hits
and misses are Inductor's own counters (`fxgraph_cache_hit`/`_miss`), and
the g++ builds are counted where Inductor starts them
(`torch._inductor.cpp_builder.CppBuilder.build`, each `.so` it builds).

The trap: the Mega-Cache bytes alone (`save_cache_artifacts()` /
`load_cache_artifacts()`) hit the graph cache, yet every kernel is built
again: the `.so` files are not in them. Ours carries them beside the bytes.

One cold compile (the slow part, tens of seconds here) serves every test in
this module; each warm run is a fresh process on a fresh machine.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from compilers.machines import Machine, count_hops, require, ship
from warmenv import Namespace, Origin, open_environment
from warmenv._facts import _metadata_directory
from warmenv.caches import Facts

APP = """
    import json, sys, time
    mode = sys.argv[1]
    started = time.perf_counter()
    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import cpp_builder

    built = []
    _build = cpp_builder.CppBuilder.build

    def build(self):
        if self.get_target_file_path().endswith(".so"):
            built.append(self.get_target_file_path())
        return _build(self)

    cpp_builder.CppBuilder.build = build
    if mode == "ours":
        import warmenv.caches.torch

        warmed = warmenv.caches.torch.use(capture_at_exit=False)
    elif mode == "bytes-alone":
        torch.compiler.load_cache_artifacts(open(sys.argv[2], "rb").read())

    def f(x):
        return (torch.tanh(x) * 2 + 1).sum(1) + torch.relu(x).amax(1)

    with torch.no_grad():
        out = torch.compile(f)(torch.arange(256, dtype=torch.float32).reshape(8, 32) / 100)
    result = {
        "hits": counters["inductor"]["fxgraph_cache_hit"],
        "misses": counters["inductor"]["fxgraph_cache_miss"],
        "built": len(built),
        "value": round(float(out.sum()), 4),
        "seconds": time.perf_counter() - started,
    }
    if mode == "ours":
        if len(sys.argv) > 2:  # the bytes torch gives, for the trap's test
            open(sys.argv[2], "wb").write(torch.compiler.save_cache_artifacts()[0])
        captured = warmed.capture()
        result.update(
            restored=warmed.restored.kernels.written,
            loaded=warmed.loaded,
            ours=[warmed.hits, warmed.misses],
            captured_kernels=captured.kernels.stored,
            captured_artifacts=captured.artifacts,
        )
    print(json.dumps(result))
"""

VARIABLES = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}  # g++ in this process, where it is counted


def _run(machine: Machine, *args: str) -> dict[str, Any]:
    script = machine.write("app.py", APP)
    variables = {**VARIABLES, "TORCHINDUCTOR_CACHE_DIR": str(machine.cache)}
    return machine.run("python", str(script), *args, env=variables, timeout=600)


@attrs.frozen
class Cold:
    machine: Machine
    result: dict[str, Any]
    bytes_alone: Path


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> Cold:
    require("torch")
    home = tmp_path_factory.mktemp("machine-a") / "srv" / "app"
    home.mkdir(parents=True)
    machine = Machine(home)
    bytes_alone = tmp_path_factory.mktemp("mega") / "torch-artifacts.bin"
    return Cold(machine, _run(machine, "ours", str(bytes_alone)), bytes_alone)


def _fresh(tmp_path: Path, name: str) -> Machine:
    home = tmp_path / name / "home" / "ci" / "work" / "app"
    home.mkdir(parents=True)
    return Machine(home)


def test_torch_is_installed() -> None:
    require("torch")


def test_torchs_version_is_importlib_metadatas_found_without_its_scan() -> None:
    require("torch")
    # The walk found its metadata directory (no fallback), and read what importlib reads.
    assert _metadata_directory("torch") is not None
    assert Facts.here("torch").pairs == (("torch", importlib.metadata.version("torch")),)


def test_a_cold_torch_compile_builds_its_kernels_and_captures_them(cold: Cold) -> None:
    result = cold.result
    assert (result["hits"], result["misses"]) == (0, 1), result
    assert result["built"] > 0
    assert result["ours"] == [0, 1]  # what use() reports is Inductor's own count
    assert result["captured_kernels"] == result["built"]
    assert result["captured_artifacts"] == 1
    # What it built and loaded itself is no hit.
    graphs, kernels, _ = anyio.run(_torch_hits, cold.machine.root)
    assert (graphs[0], kernels[0]) == (0, 0)


def test_torch_compile_captured_on_one_machine_builds_nothing_on_another(
    cold: Cold, tmp_path: Path
) -> None:
    second = _fresh(tmp_path, "b")
    ship(cold.machine, second, tmp_path)

    warm = _run(second, "ours")

    assert (warm["hits"], warm["misses"]) == (1, 0), warm
    assert warm["built"] == 0, warm  # no g++ at all
    assert (warm["restored"], warm["loaded"]) == (cold.result["captured_kernels"], 1)
    assert warm["value"] == cold.result["value"]
    assert warm["captured_artifacts"] == 0  # a warm run adds nothing to the environment
    # Inductor's graph hit (named by its own log line) and each kernel it loaded (mapped
    # into the process) are hits of the bundle's entries in `warmenv stats`.
    graphs, kernels, bundle = anyio.run(_torch_hits, second.root)
    assert graphs == (1, 1), graphs
    assert kernels[0] >= 1 and kernels[0] == kernels[1], kernels
    assert kernels[0] <= cold.result["captured_kernels"]
    assert bundle == graphs[0] + kernels[0]


async def _torch_hits(root: Path) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(hits, imported hits) of the fxgraph and the kernels namespaces, and the bundle's hits."""
    async with open_environment("default", root=root) as env:
        found = await env.statistics()
    by_part = {n.namespace.rsplit("/", 1)[1]: n for n in found.namespaces}
    graphs, kernels = by_part["fxgraph"], by_part["kernels"]
    bundles = sum(b.hits for b in found.bundles)
    return (
        (graphs.hits, graphs.hits_by_origin.get(Origin.IMPORTED, 0)),
        (kernels.hits, kernels.hits_by_origin.get(Origin.IMPORTED, 0)),
        bundles,
    )


def test_the_mega_cache_bytes_alone_hit_the_graph_but_build_every_kernel_again(
    cold: Cold, tmp_path: Path
) -> None:
    """The trap: what torch's documentation ships is not enough."""
    second = _fresh(tmp_path, "c")

    alone = _run(second, "bytes-alone", str(cold.bytes_alone))

    assert (alone["hits"], alone["misses"]) == (1, 0), alone
    assert alone["built"] == cold.result["built"], alone


def test_kernels_captured_where_torch_lives_elsewhere_are_skipped_with_the_reason(
    tmp_path: Path,
) -> None:
    require("torch")
    import warmenv.caches.torch as torch_cache

    here = Facts.here(*torch_cache.FACTS)
    elsewhere = Facts.of(
        [(name, "0123456789ab" if name == "torch.path" else value) for name, value in here.pairs]
    )

    async def main() -> Any:
        async with open_environment("default", root=tmp_path / "root") as env:
            kernels = env.storage(Namespace("caches.torch", "kernels", version=elsewhere.segment))
            await kernels.insert(b"ab/cabc.so", b"\x7fELF")
            return await torch_cache.restore(env, tmp_path / "cache")

    restored = anyio.run(main)

    assert restored.kernels.written == 0 and restored.artifacts == 0
    [skipped] = restored.kernels.skipped
    assert skipped.reasons == (
        f"torch's install path 0123456789ab was captured; this machine has "
        f"{here.value('torch.path')}",
    )
    assert not (tmp_path / "cache" / "ab").exists()


def _under_warmenv_run(cold: Cold, tmp_path: Path) -> tuple[Machine, Any, Any]:
    """A fresh machine given the cold one's bundle, the app run plain under `warmenv run`."""
    second = _fresh(tmp_path, "d")
    ship(cold.machine, second, tmp_path)
    second.write("app.py", APP)
    warm, report = second.warmenv_run(("torch",), "app.py", "plain", env=VARIABLES, timeout=600)
    return second, warm, report


def test_warmenv_run_restores_kernels_and_graphs_so_a_plain_process_builds_nothing(
    cold: Cold, tmp_path: Path
) -> None:
    _, warm, report = _under_warmenv_run(cold, tmp_path)

    assert (warm["hits"], warm["misses"], warm["built"]) == (1, 0, 0), warm
    restored = report["tools"]["torch"]["restored"]
    assert restored["kernels"]["written"] == cold.result["captured_kernels"]
    assert sum(graph["written"] for graph in restored["graphs"]) >= 1


def test_warmenv_run_counts_its_commands_torch_hits_in_warmenv_stats(
    cold: Cold, tmp_path: Path
) -> None:
    second, warm, report = _under_warmenv_run(cold, tmp_path)

    assert (warm["hits"], warm["misses"], warm["built"]) == (1, 0, 0), warm
    assert report["tools"]["torch"]["hits"] == warm["hits"]  # Inductor's counter, in the command
    # As `use()` counts them: the graph hit by its key, each restored kernel it loaded.
    graphs, kernels, bundle = anyio.run(_torch_hits, second.root)
    assert graphs == (warm["hits"],) * 2, graphs
    assert kernels[0] >= 1 and kernels[0] == kernels[1], kernels
    assert kernels[0] <= cold.result["captured_kernels"]
    assert bundle == graphs[0] + kernels[0]


# --- the restore: one pass over the three trees ------------------------------------


def _inductor_dir(where: Path) -> Path:
    """A small Inductor cache directory: a kernel, an FX graph entry, an AOT autograd entry."""
    for relative in ("ab/cabkernel.so", "fxgraph/xy/fxykey/entry", "aotautograd/zw/azwkey/entry"):
        path = where / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(relative.encode() * 100)
    return where


def test_a_torch_restore_pays_its_fixed_costs_once_not_per_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("torch")
    import warmenv.caches.torch as torch_cache

    hops: dict[str, int] = {}

    async def main() -> Any:
        async with open_environment("default", root=tmp_path / "root") as env:
            await torch_cache.capture(env, _inductor_dir(tmp_path / "source"))
            count_hops(monkeypatch, hops)
            try:
                return await torch_cache.restore(env, tmp_path / "cache")
            finally:
                monkeypatch.undo()

    restored = anyio.run(main)

    assert [restored.kernels.written, *(graph.written for graph in restored.graphs)] == [1, 1, 1]
    # Each hop wakes a thread (a wake-up under load costs more than writing a small file):
    # the facts, the trust and the target's checks on a worker thread (files: one that
    # hangs stops this restore, never the environment's SQLite thread), then one pass on
    # SQLite's thread (the namespaces and the Mega-Cache's count, every tree's rows and
    # files). Restored one tree after the other it was 10 and 7; one pass with a hop per
    # step, 3 and 5; with the Mega-Cache's count on a hop of its own, 1 and 2.
    assert hops == {"thread": 1, "sqlite": 1}


def _restored_over_a_symlinked_fxgraph(tmp_path: Path) -> tuple[Any, Path]:
    """A torch restore into a cache directory whose `fxgraph` is a symlink, and where it leads."""
    require("torch")
    import warmenv.caches.torch as torch_cache

    target, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    target.mkdir()
    (target / "fxgraph").symlink_to(outside)

    async def main() -> Any:
        async with open_environment("default", root=tmp_path / "root") as env:
            await torch_cache.capture(env, _inductor_dir(tmp_path / "source"))
            return await torch_cache.restore(env, target)

    return anyio.run(main), outside


def test_a_torch_restore_never_follows_a_symlink_where_a_graph_directory_belongs(
    tmp_path: Path,
) -> None:
    restored, outside = _restored_over_a_symlinked_fxgraph(tmp_path)

    fxgraph, aotautograd = restored.graphs
    assert (restored.kernels.written, fxgraph.written, aotautograd.written) == (1, 0, 1)
    assert [("symlink" in r.reason) for r in fxgraph.refused] == [True]
    assert list(outside.iterdir()) == []


def test_a_torch_restores_text_says_which_graph_entries_it_refused(tmp_path: Path) -> None:
    restored, _ = _restored_over_a_symlinked_fxgraph(tmp_path)

    text = str(restored)

    assert "1 graph entries (1 refused)" in text
    assert "- refused 'fxgraph/xy/fxykey/entry': a symlink is at 'fxgraph'" in text
