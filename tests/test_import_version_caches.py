"""`--app-version` and compiler caches: the app version judges the application's namespaces only.

A captured compiler cache (`caches.jax/jax=...,cpu=.../files`) carries its
facts as its version segment; no application version decides whether it can
hit (preflight judges its facts against the machine). So a bundle of a JAX
cache exported with `--app-version 1.0` is imported, checked, warmed up and
exported for 1.0 without a word about versions, by file and by URL (a real
HTTP server started here), and a bundle holding the application's namespaces
of another version beside it leaves only those out. The caches are the
namespaces `warmenv.caches.jax` really writes, captured from a directory of
files as JAX lays them out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from test_download import BundleServer
from test_download import server as server  # the fixture
from test_import_version import format as format  # the fixture: each bundle format
from warmenv import Environment, Namespace, open_environment
from warmenv.bundle import WarmUpState, export_bundle, import_bundle, preflight, warm_up
from warmenv.caches import jax as jax_cache

APP = Namespace("myapp", "kernels", "1.0")
OLD_APP = Namespace("myapp", "kernels", "0.9")
FILES = {"jit_f-0123abcd-cache": b"x" * 500, "jit_g-4567ef01-cache": b"y" * 700}


async def make_bundle(out: Path, apps: list[Namespace], format: str = "flat") -> Path:
    """A bundle of a captured JAX cache (two files) beside `apps`, exported for 1.0."""
    made = out.parent / f"jax-{out.stem}"
    made.mkdir()
    for name, data in FILES.items():
        (made / name).write_bytes(data)
    async with open_environment("ci", root=out.parent / f"ci-{out.stem}") as env:
        await jax_cache.capture(env, made)
        for ns in apps:
            await env.storage(ns).insert_many([(b"k1", b"v1"), (b"k2", b"v2")])
        await export_bundle(env, out, name="CPU pods", version="1.0", format=format)
    return out


def jax_namespace() -> str:
    return str(jax_cache.tree().namespace)


async def held(env: Environment) -> dict[str, int]:
    return {s.namespace: s.entries for s in await env.namespaces()}


async def restores_the_cache(env: Environment, target: Path) -> None:
    """The cache imported restores into a JAX cache directory, every file."""
    await jax_cache.restore(env, target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == FILES


@pytest.mark.anyio
async def test_a_compiler_cache_bundle_is_imported_for_an_app_version_by_file(
    tmp_path: Path, root: Path, format: str
) -> None:
    bundle = await make_bundle(tmp_path / "jax.bundle", [], format)
    async with open_environment("pod", root=root) as env:
        report = await import_bundle(bundle, env, version="1.0")
        assert await held(env) == {jax_namespace(): 2}
        await restores_the_cache(env, tmp_path / "restored")
    assert report.imported == 2 and report.other_versions == ()


@pytest.mark.anyio
async def test_a_compiler_cache_is_kept_beside_the_apps_namespaces_in_bulk_and_by_scan(
    tmp_path: Path, root: Path, format: str
) -> None:
    bundle = await make_bundle(tmp_path / "both.bundle", [APP, OLD_APP], format)
    async with open_environment("pod", root=root) as env:
        for validate in (None, lambda ns, k, v: True):  # a validator forces the scan
            report = await import_bundle(bundle, env, version="1.0", validate=validate)
            assert report.other_versions == (str(OLD_APP),)
        assert await held(env) == {jax_namespace(): 2, str(APP): 2}


@pytest.mark.anyio
async def test_a_compiler_cache_selected_by_name_is_kept_for_an_app_version(
    tmp_path: Path, root: Path
) -> None:
    bundle = await make_bundle(tmp_path / "both.bundle", [APP, OLD_APP], "sqlite")
    async with open_environment("pod", root=root) as env:
        await import_bundle(bundle, env, namespaces=["caches.jax", "myapp"], version="1.0")
        assert await held(env) == {jax_namespace(): 2, str(APP): 2}


@pytest.mark.anyio
async def test_a_compiler_cache_bundle_by_url_is_imported_for_an_app_version(
    server: BundleServer, tmp_path: Path, root: Path, format: str
) -> None:
    body = (await make_bundle(tmp_path / "jax.bundle", [OLD_APP], format)).read_bytes()
    url = server.put("/jax.bundle", body)
    async with open_environment("pod", root=root) as env:
        report = await import_bundle(url, env, version="1.0")
        assert await held(env) == {jax_namespace(): 2}
        await restores_the_cache(env, tmp_path / "restored")
    assert report.other_versions == (str(OLD_APP),)


@pytest.mark.anyio
async def test_warm_up_of_a_compiler_cache_bundle_by_url_for_an_app_version_finishes(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    url = server.put("/jax.bundle", (await make_bundle(tmp_path / "jax.bundle", [])).read_bytes())
    async with open_environment("pod", root=root) as env:
        handle = warm_up(url, env, version="1.0")
        await handle.wait()
        assert handle.state is WarmUpState.FINISHED, handle.error
        assert await held(env) == {jax_namespace(): 2}


@pytest.mark.anyio
@pytest.mark.parametrize("by", ["file", "url"])
async def test_preflight_judges_a_compiler_cache_by_its_facts_not_the_app_version(
    server: BundleServer, tmp_path: Path, by: str
) -> None:
    bundle = await make_bundle(tmp_path / "jax.bundle", [])
    source = str(bundle) if by == "file" else server.put("/jax.bundle", bundle.read_bytes())
    report = await preflight(source, version="1.0")
    assert report.ok, str(report)
    text = str(report)
    assert "compiler cache jax: " in text and "can hit here" in text
    assert "no namespace is for version" not in text
    assert "judged by their facts" in text


def warmenv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warmenv", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def served(server: BundleServer, tmp_path: Path) -> Iterator[str]:
    bundle = anyio.run(make_bundle, tmp_path / "jax.bundle", [])
    yield server.put("/jax.bundle", bundle.read_bytes())


def test_the_command_line_exports_a_compiler_cache_for_an_app_version_without_a_warning(
    tmp_path: Path, root: Path
) -> None:
    cache = tmp_path / "jax"
    cache.mkdir()
    for name, data in FILES.items():
        (cache / name).write_bytes(data)

    async def capture() -> None:
        async with open_environment("ci", root=root) as env:
            await jax_cache.capture(env, cache)

    anyio.run(capture)
    out = tmp_path / "jax.bundle"
    args = ["export", str(out), "--name", "CPU pods", "--app-version", "1.0"]
    done = warmenv(*args, "--env", "ci", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert "version" not in done.stderr, done.stderr
    checked = warmenv("check", str(out), "--app-version", "1.0")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "can hit on this machine" in checked.stdout


def test_the_command_line_checks_and_imports_a_compiler_cache_url_for_an_app_version(
    served: str, root: Path
) -> None:
    checked = warmenv("check", served, "--app-version", "1.0")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no namespace is for version" not in checked.stdout
    args = ["import", served, "--app-version", "1.0", "--env", "pod", "--root", str(root)]
    done = warmenv(*args, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["imported"] == 2 and report["other_versions"] == []


def test_the_command_line_leaves_out_only_the_apps_old_namespaces(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    bundle = anyio.run(make_bundle, tmp_path / "old.bundle", [OLD_APP])
    url = server.put("/old.bundle", bundle.read_bytes())
    done = warmenv("import", url, "--app-version", "1.0", "--env", "pod", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert "left out 1 namespace of another version than '1.0'" in done.stdout
    assert "caches.jax" not in done.stdout.split("left out", 1)[1]
