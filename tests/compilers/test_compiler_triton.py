"""Triton: kernels compiled on one machine hit on another, live or restored; a plain copy misses.

Triton compiles to cubin here without a GPU (`triton.compile(...,
target=GPUTarget("cuda", 80, 32))` with its bundled ptxas). The kernel's
code is written afresh at each machine's absolute path, and hits and misses
are Triton's own: its compilation listener's `cache_hit`, never files
existing.

The trap: Triton's default cache writes each kernel's index
(`__grp__<kernel>.json`) with the absolute paths of the kernel's files, so
a copied cache directory misses every kernel once the original path is
gone. Ours stores the index path-independent and rewrites it on restore.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

import warmenv.caches.triton
from compilers.machines import Machine, copy_tree, count_hops, require, ship
from warmenv import Origin, open_environment
from warmenv._facts import _metadata_directory
from warmenv.caches import Facts
from warmenv.caches._children import hook_variables
from warmenv.caches._hookdir import HookHome

KERNELS = 3

# Three configurations of one kernel: each is a kernel of its own in Triton's cache.
WORKLOAD = """
    import json, sys, time
    mode = sys.argv[1]
    import triton
    import triton.language as tl
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    reported = []
    knobs.compilation.listener = lambda **report: reported.append(report["cache_hit"])
    if mode == "live":
        import warmenv.caches.triton

        served = warmenv.caches.triton.use()

    @triton.jit
    def scaled_add(x, y, out, n, BLOCK: tl.constexpr, SCALE: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        a = tl.load(x + offsets, mask=mask)
        b = tl.load(y + offsets, mask=mask)
        tl.store(out + offsets, a * SCALE + b, mask=mask)

    signature = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}
    started = time.perf_counter()
    for block in (64, 128, 256):
        source = ASTSource(scaled_add, signature, constexprs={"BLOCK": block, "SCALE": 2})
        kernel = triton.compile(source, target=GPUTarget("cuda", 80, 32))
        assert kernel.asm["cubin"], "no cubin"
    print(json.dumps({
        "hits": reported.count(True),
        "misses": reported.count(False),
        "seconds": time.perf_counter() - started,
        "ours": list(warmenv.caches.triton.hits()) if mode == "live" else None,
    }))
"""

STEP = """
    import json, sys
    import anyio
    import warmenv
    import warmenv.caches.triton as triton_cache

    async def main(step, directory):
        async with warmenv.open_environment() as env:
            if step == "capture":
                report = await triton_cache.capture(env, directory)
                print(json.dumps({"files": report.files.files, "groups": report.groups}))
            else:
                report = await triton_cache.restore(env, directory)
                print(json.dumps({
                    "files": report.files.written,
                    "groups": report.groups,
                    "refused": [[r.path, r.reason] for r in report.refused],
                    "skipped": [[s.namespace, list(s.reasons)] for s in report.files.skipped],
                }))

    anyio.run(main, sys.argv[1], sys.argv[2])
"""


def _compile(machine: Machine, mode: str) -> dict[str, Any]:
    script = machine.write("kernels.py", WORKLOAD)
    return machine.run("python", str(script), mode, env={"TRITON_CACHE_DIR": str(machine.cache)})


def _step(machine: Machine, step: str) -> dict[str, Any]:
    return machine.run("python", str(machine.write("step.py", STEP)), step, str(machine.cache))


def _insert(machine: Machine, part: str, segment: str, items: dict[bytes, bytes]) -> None:
    code = f"""
        import anyio, json, warmenv
        from warmenv import Namespace

        async def main():
            async with warmenv.open_environment() as env:
                storage = env.storage(Namespace("caches.triton", {part!r}, {segment!r}))
                await storage.insert_many({sorted(items.items())!r})
            print(json.dumps({{}}))

        anyio.run(main)
    """
    machine.run("python", str(machine.write("insert.py", code)))


def test_triton_is_installed() -> None:
    require("triton")


def test_tritons_version_is_importlib_metadatas_found_without_its_scan() -> None:
    require("triton")
    # The walk found its metadata directory (no fallback), and read what importlib reads.
    assert _metadata_directory("triton") is not None
    assert Facts.here("triton").pairs == (("triton", importlib.metadata.version("triton")),)


def test_kernels_compiled_live_on_one_machine_hit_live_on_another(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("triton")
    first, second = machines
    cold = _compile(first, "live")
    assert (cold["hits"], cold["misses"]) == (0, KERNELS), cold
    assert cold["ours"][:2] == [0, KERNELS]

    ship(first, second, tmp_path)
    warm = _compile(second, "live")

    assert (warm["hits"], warm["misses"]) == (KERNELS, 0), warm
    assert warm["ours"][:2] == [KERNELS, 0]  # what hits() reports is Triton's own count


def test_a_kernel_compiled_live_is_served_to_an_empty_cache_directory(
    machines: tuple[Machine, Machine],
) -> None:
    require("triton")
    first, _ = machines
    _compile(first, "live")
    shutil.rmtree(first.root / "default.caches" / "triton-live")  # where the live form's files land

    again = _compile(first, "live")

    assert (again["hits"], again["misses"]) == (KERNELS, 0), again


def test_the_live_form_leaves_the_cache_directory_of_a_plain_triton_alone(
    machines: tuple[Machine, Machine],
) -> None:
    """Triton's remote manager writes indexes its own file cache cannot read; not there."""
    require("triton")
    first, _ = machines
    _compile(first, "live")

    plain = _compile(first, "plain")  # TRITON_CACHE_DIR: would fail on a list-form index

    assert (plain["hits"], plain["misses"]) == (0, KERNELS), plain
    assert list((first.root / "default.caches" / "triton-live").glob("*/__grp__*.json"))


def test_a_plain_copy_of_a_triton_cache_misses_once_its_original_path_is_gone(
    machines: tuple[Machine, Machine],
) -> None:
    require("triton")
    first, second = machines
    _compile(first, "plain")
    copy_tree(first.cache, second.cache)
    shutil.rmtree(first.cache)  # the first machine's disk is not the second's

    copied = _compile(second, "plain")

    # Each __grp__ index names its files at the first machine's absolute path.
    assert (copied["hits"], copied["misses"]) == (0, KERNELS), copied


def test_a_captured_triton_cache_restored_at_another_path_hits(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("triton")
    first, second = machines
    _compile(first, "plain")
    assert _step(first, "capture")["groups"] == KERNELS
    ship(first, second, tmp_path)
    shutil.rmtree(first.cache)

    restored = _step(second, "restore")
    warm = _compile(second, "plain")

    assert (restored["groups"], restored["refused"]) == (KERNELS, [])
    assert (warm["hits"], warm["misses"]) == (KERNELS, 0), warm
    indexes = list(second.cache.glob("*/__grp__*.json"))
    assert len(indexes) == KERNELS
    for index in indexes:
        for path in json.loads(index.read_text())["child_paths"].values():
            assert Path(path).parent == index.parent


def test_kernels_compiled_live_restore_into_a_directory_for_a_plain_triton(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("triton")
    first, second = machines
    _compile(first, "live")  # the live form's entries, nothing captured from a directory
    ship(first, second, tmp_path)

    restored = _step(second, "restore")
    warm = _compile(second, "plain")

    assert restored["groups"] == KERNELS
    assert (warm["hits"], warm["misses"]) == (KERNELS, 0), warm


def test_kernels_captured_for_another_triton_are_skipped_with_the_reason(
    machines: tuple[Machine, Machine],
) -> None:
    require("triton")
    first, _ = machines
    here = Facts.here("triton", "python")
    other = Facts.of([("triton", "0.0.1"), ("python", here.pairs[1][1])])
    _insert(first, "files", other.segment, {b"KEY/k.cubin": b"cubin"})

    restored = _step(first, "restore")

    assert restored["files"] == 0
    [[namespace, reasons]] = restored["skipped"]
    assert "triton=0.0.1" in namespace
    assert reasons == [f"triton 0.0.1 was captured; this machine has {here.pairs[0][1]}"]


def test_a_hostile_kernel_index_is_refused_and_never_written(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("triton")
    first, _ = machines
    hostile = {
        b"K1/__grp__escape.json": b'{"child_paths": ["../../outside"]}',
        b"K2/__grp__missing.json": b'{"child_paths": ["k.cubin"]}',
        b"K3/nested/__grp__deep.json": b'{"child_paths": ["k.cubin"]}',
        b"K4/__grp__garbage.json": b"\x00not json",
        b"../__grp__up.json": b'{"child_paths": ["k.cubin"]}',
    }
    _insert(first, "groups", Facts.here("triton", "python").segment, hostile)

    restored = _step(first, "restore")

    assert restored["groups"] == 0
    assert dict(restored["refused"]) == {
        "K1/__grp__escape.json": "it names '../../outside', which is not a plain file name",
        "K2/__grp__missing.json": "its file 'k.cubin' is not in the cache",
        "K3/nested/__grp__deep.json": "it is not a kernel's index (<key>/__grp__<name>)",
        "K4/__grp__garbage.json": "it is not JSON",
        "../__grp__up.json": "its path holds '..' component",
    }
    assert not list(first.cache.rglob("__grp__*"))
    assert not list(first.home.parent.rglob("__grp__up.json"))


def _warmenv_run(machine: Machine) -> tuple[dict[str, Any], dict[str, Any]]:
    """`warmenv run --cache triton -- python kernels.py plain`: the app's line, run's report."""
    machine.write("kernels.py", WORKLOAD)
    return machine.warmenv_run(("triton",), "kernels.py", "plain")


def test_warmenv_run_warms_a_plain_triton_process_on_another_machine(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("triton")
    first, second = machines

    cold, cold_report = _warmenv_run(first)
    ship(first, second, tmp_path)
    shutil.rmtree(first.home)  # nothing of the first machine is left to find
    warm, warm_report = _warmenv_run(second)

    assert (cold["hits"], cold["misses"]) == (0, KERNELS)
    assert cold_report["tools"]["triton"]["captured"]["groups"] == KERNELS
    assert warm_report["tools"]["triton"]["restored"]["groups"] == KERNELS
    assert (warm["hits"], warm["misses"]) == (KERNELS, 0), warm


def _statistics(machine: Machine) -> tuple[dict[str, int], int]:
    """Hits per Triton namespace part (`files`, `groups`) and the bundle's, as `warmenv stats`."""

    async def main() -> tuple[dict[str, int], int]:
        async with open_environment("default", root=machine.root) as env:
            found = await env.statistics()
        parts = {
            n.namespace.rsplit("/", 1)[-1]: n.hits_by_origin.get(Origin.IMPORTED, 0)
            for n in found.namespaces
            if n.namespace.startswith("caches.triton/")
        }
        return parts, sum(b.hits for b in found.bundles)

    return anyio.run(main)


def test_kernels_served_live_from_a_bundle_are_its_hits_in_warmenv_stats(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("triton")
    first, second = machines
    _compile(first, "live")
    ship(first, second, tmp_path)
    live = first.root / "default.caches" / "triton-live"
    files = sum(1 for path in live.rglob("*") if path.is_file())
    files -= KERNELS  # the indexes, in `groups`

    warm = _compile(second, "live")

    assert (warm["hits"], warm["misses"]) == (KERNELS, 0), warm
    parts, bundle = _statistics(second)
    # Each kernel: its index looked up once, then every file it names.
    assert parts == {"files": files, "groups": KERNELS}, parts
    assert bundle == files + KERNELS


def test_warmenv_run_counts_its_commands_triton_hits_in_warmenv_stats(
    machines: tuple[Machine, Machine], tmp_path: Path
) -> None:
    require("triton")
    first, second = machines
    _warmenv_run(first)
    ship(first, second, tmp_path)

    warm, report = _warmenv_run(second)

    assert (warm["hits"], warm["misses"]) == (KERNELS, 0), warm
    assert report["tools"]["triton"]["hits"] == warm["hits"]  # Triton's listener, in the command
    files = report["tools"]["triton"]["restored"]["files"]["written"]
    parts, bundle = _statistics(second)
    # Each kernel found: its index, then every file it names, as the live form counts them.
    assert parts == {"files": files, "groups": warm["hits"]}, parts
    assert bundle == files + warm["hits"]


_TRITON_CHILD = textwrap.dedent(
    """
    import importlib, json, os, sys
    module, _, name = os.environ["TRITON_CACHE_MANAGER"].partition(":")
    manager = getattr(importlib.import_module(module), name)
    cache = manager("k" * 32)
    cache.put(b"kernel", "kernel.bin", binary=True)
    print(json.dumps({
        "class": manager.__module__ + "." + manager.__qualname__,
        "found": cache.get_file("kernel.bin") is not None,
        "warmenv": any(m == "warmenv" or m.startswith("warmenv.") for m in sys.modules),
    }))
    """
)


def test_tritons_manager_is_tritons_own_in_a_python_without_warmenv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Triton itself is loaded in the child: this test lives with the compilers' tests.
    require("triton")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))  # the hooks' directory
    with HookHome() as home:
        variables = hook_variables("triton", (), warmenv.caches.triton.COUNTING, {}, home)
    # -I: no PYTHONPATH, no user site; the path holds the hooks and the site-packages with
    # Triton, whose editable warmenv (a .pth file) is not read: this Python has no warmenv.
    site = sysconfig.get_paths()["purelib"]
    path = [variables["PYTHONPATH"], site]
    code = f"import sys; sys.path[:0] = {path!r}\n{_TRITON_CHILD}"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    child = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        env={**environ, **variables, "TRITON_CACHE_DIR": str(tmp_path / "triton")},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == {
        "class": "triton.runtime.cache.FileCacheManager",
        "found": True,
        "warmenv": False,
    }


def test_a_triton_restore_is_one_sqlite_hop_and_asks_nothing_of_the_files_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("triton")
    facts = Facts.here("triton", "python").segment
    files = {b"K1/k.cubin": b"cubin", b"K1/k.json": b"{}", b"K2/k.cubin": b"two"}
    groups = {
        b"K1/__grp__k.json": b'{"child_paths": ["k.cubin", "k.json"]}',
        b"K2/__grp__k.json": b'{"child_paths": ["k.cubin", "k.ptx"]}',  # k.ptx: there already
    }
    target = tmp_path / "cache"
    (target / "K2").mkdir(parents=True)
    (target / "K2" / "k.ptx").write_bytes(b"ptx")
    hops: dict[str, int] = {}
    asked: list[str] = []
    stat = os.stat

    def asking(path: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dir_fd") is not None:  # a name under the target (`Writer.mode_at`)
            asked.append(str(path))
        return stat(path, *args, **kwargs)

    async def main() -> Any:
        async with open_environment("default", root=tmp_path / "root") as env:
            for part, items in (("files", files), ("groups", groups)):
                storage = env.storage(warmenv.Namespace("caches.triton", part, facts))
                await storage.insert_many(items.items())
            count_hops(monkeypatch, hops)
            monkeypatch.setattr(os, "stat", asking)
            try:
                return await warmenv.caches.triton.restore(env, target)
            finally:
                monkeypatch.undo()

    restored = anyio.run(main)

    assert (restored.files.written, restored.groups, restored.refused) == (3, 2, ())
    # The facts and the target's checks on a worker thread (files, which may hang), the
    # rows and the files in one pass on SQLite's thread.
    assert hops == {"thread": 1, "sqlite": 1}
    # An index's files this restore wrote are known to be there; the one it found is asked.
    assert asked == ["k.ptx"]
    for key in groups:
        index = json.loads((target / key.decode()).read_text())["child_paths"]
        assert index == {name: str(target / key.decode().split("/")[0] / name) for name in index}


def test_a_restored_index_is_byte_for_byte_what_json_dumps_writes(tmp_path: Path) -> None:
    require("triton")
    facts = Facts.here("triton", "python").segment
    files = {b"K1/k.cubin": b"1", b"K1/k+1.json": b"2", b"K2/k \xc3\xbc.bin": b"3"}
    groups = {
        # Names as they are, one listed twice (written once, as json.dumps of a dict would).
        b"K1/__grp__k.json": b'{"child_paths": ["k.cubin", "k+1.json", "k.cubin"]}',
        b"K2/__grp__k.json": '{"child_paths": ["k \u00fc.bin"]}'.encode(),  # a name escaped
    }
    target = tmp_path / 'a "cach\u00e9" \U0001f600'  # escaped in every path

    async def main() -> Any:
        async with open_environment("default", root=tmp_path / "root") as env:
            for part, items in (("files", files), ("groups", groups)):
                storage = env.storage(warmenv.Namespace("caches.triton", part, facts))
                await storage.insert_many(items.items())
            return await warmenv.caches.triton.restore(env, target)

    restored = anyio.run(main)

    assert (restored.files.written, restored.groups, restored.refused) == (3, 2, ())
    for key, names in (("K1", ["k+1.json", "k.cubin"]), ("K2", ["k \u00fc.bin"])):
        paths = {name: f"{target}/{key}/{name}" for name in names}
        assert (target / key / "__grp__k.json").read_bytes() == json.dumps(
            {"child_paths": paths}
        ).encode()
