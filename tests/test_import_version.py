"""`import_bundle(..., version=APP_VERSION)`: a stale bundle is refused before it costs anything.

A bundle none of whose namespaces carries the application's version could
never hit; it is refused with `StaleBundleError` before its body is
downloaded (a flat bundle's header is read by `Range` from a real HTTP server
started here, which counts the bytes it sends) and before anything is
written. A bundle holding both versions imports only what can hit and names
what it left out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from test_download import BundleServer, staging_left
from test_download import server as server  # the fixture
from warmenv import Environment, Namespace, open_environment
from warmenv.blocking import import_bundle as blocking_import
from warmenv.blocking import open_environment as open_blocking
from warmenv.bundle import (
    StaleBundleError,
    WarmUpState,
    export_bundle,
    import_bundle,
    open_bundle,
    warm_up,
)
from warmenv.persistence.statistics import ImportOutcome

OLD = Namespace("app", "kernels", "1.0")
OLD_CONFIGS = Namespace("app", "configs", "1.0")
NEW = Namespace("app", "kernels", "1.1")
OTHER_APP = Namespace("tool", "cache", "1.1")
BIG = 40 << 10  # bytes a value: a bundle of a few MiB, its header in the first range


async def make_bundle(
    out: Path, namespaces: list[Namespace], format: str = "flat", entries: int = 60
) -> Path:
    async with open_environment("src", root=out.parent / f"src-{out.stem}") as env:
        for ns in namespaces:
            await env.storage(ns).insert_many(
                (b"k%03d" % i, bytes([i]) * BIG) for i in range(entries)
            )
        await export_bundle(env, out, name="CI", version="1.0", format=format)
    return out


async def held(env: Environment) -> dict[str, int]:
    return {s.namespace: s.entries for s in await env.namespaces()}


async def refused_as_stale(via: str, url: str, env: Environment) -> None:
    """`url` (of version 1.0) imported for version 1.1 `via` import_bundle or warm_up:
    refused as stale, recorded as a failed import, nothing written."""
    if via == "import_bundle":
        with pytest.raises(StaleBundleError, match=r"version '1\.1'.*holds version '1\.0'"):
            await import_bundle(url, env, version="1.1")
    else:
        handle = warm_up(url, env, version="1.1")
        await handle.wait()
        assert handle.state is WarmUpState.FAILED
        assert isinstance(handle.error, StaleBundleError)
        (record,) = (await env.statistics()).imports
        assert record.outcome is ImportOutcome.FAILED
    assert await held(env) == {}


@pytest.mark.anyio
@pytest.mark.parametrize("via", ["import_bundle", "warm_up"])
async def test_a_stale_flat_bundle_by_url_is_refused_after_its_header_only(
    server: BundleServer, tmp_path: Path, root: Path, via: str
) -> None:
    body = (await make_bundle(tmp_path / "old.bundle", [OLD, OLD_CONFIGS])).read_bytes()
    url = server.put("/old.bundle", body)
    async with open_environment("svc", root=root) as env:
        await refused_as_stale(via, url, env)
    sent = sum(s.sent for s in server.seen)
    assert all(s.range is not None for s in server.seen), server.seen  # never the whole body
    assert 0 < sent <= 64 << 10 < len(body) // 10
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_mixed_bundle_by_url_imports_only_what_can_hit_and_says_what_it_left(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    body = (await make_bundle(tmp_path / "mixed.bundle", [OLD, NEW, OTHER_APP])).read_bytes()
    url = server.put("/mixed.bundle", body)
    async with open_environment("svc", root=root) as env:
        report = await import_bundle(url, env, version="1.1")
        assert await held(env) == {str(NEW): 60, str(OTHER_APP): 60}
    assert report.imported == 120 and report.other_versions == (str(OLD),)
    assert {s.namespace for s in report.namespaces} == {str(NEW), str(OTHER_APP)}


@pytest.mark.anyio
async def test_a_stale_sqlite_bundle_by_url_is_refused_before_anything_is_written(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    # Refused by the manifest in its first pages (tests/test_manifest_namespaces counts
    # the bytes; one without a list is downloaded, then refused, as before).
    body = (await make_bundle(tmp_path / "old.db.bundle", [OLD], format="sqlite")).read_bytes()
    url = server.put("/old.db.bundle", body)
    async with open_environment("svc", root=root) as env:
        with pytest.raises(StaleBundleError, match=r"version '1\.1'"):
            await import_bundle(url, env, version="1.1")
        assert await held(env) == {}
        assert (await env.statistics()).bundles == []
    assert staging_left(root) == []


@pytest.fixture(params=["sqlite", "flat"])
def format(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
async def test_a_stale_bundle_by_path_is_refused_and_nothing_is_written(
    tmp_path: Path, root: Path, format: str
) -> None:
    bundle = await make_bundle(tmp_path / "old.bundle", [OLD], format=format, entries=5)
    async with open_environment("svc", root=root) as env:
        with pytest.raises(StaleBundleError, match=r"holds no entries|holds version '1\.0'"):
            await import_bundle(bundle, env, version="2")
        assert await held(env) == {}
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_mixed_bundle_imports_only_its_version_in_bulk_and_by_scan(
    tmp_path: Path, root: Path, format: str
) -> None:
    bundle = await make_bundle(tmp_path / "mixed.bundle", [OLD, NEW, OTHER_APP], format, 5)
    async with open_environment("svc", root=root) as env:
        for validate in (None, lambda ns, k, v: True):  # a validator forces the scan
            report = await import_bundle(bundle, env, version="1.1", validate=validate)
            assert report.other_versions == (str(OLD),)
        assert await held(env) == {str(NEW): 5, str(OTHER_APP): 5}


@pytest.mark.anyio
async def test_version_and_namespaces_together_select_both(tmp_path: Path, root: Path) -> None:
    bundle = await make_bundle(tmp_path / "mixed.bundle", [OLD, NEW, OTHER_APP], "sqlite", 3)
    async with open_environment("svc", root=root) as env:
        report = await import_bundle(bundle, env, namespaces=["app"], version="1.1")
        assert await held(env) == {str(NEW): 3}
        assert report.other_versions == (str(OLD),)
        with pytest.raises(StaleBundleError):  # of the namespaces asked for, none is 1.1
            await import_bundle(bundle, env, namespaces=["app/1.0"], version="1.1")


@pytest.mark.anyio
async def test_an_open_stale_bundle_is_refused(tmp_path: Path, root: Path) -> None:
    bundle = await make_bundle(tmp_path / "old.bundle", [OLD], entries=2)
    async with open_bundle(bundle) as opened, open_environment("svc", root=root) as env:
        with pytest.raises(StaleBundleError):
            await import_bundle(opened, env, version="1.1")
        assert await held(env) == {}


@pytest.mark.anyio
@pytest.mark.parametrize(("bad", "error"), [("", ValueError), ("1/2", ValueError), (11, TypeError)])
async def test_a_version_that_is_no_segment_is_bad_usage(
    tmp_path: Path, root: Path, bad: object, error: type[Exception]
) -> None:
    # A version of another type is a TypeError, as Namespace raises it (one rule for both).
    bundle = await make_bundle(tmp_path / "b.bundle", [NEW], entries=1)
    async with open_environment("svc", root=root) as env:
        with pytest.raises(error, match="version must"):
            await import_bundle(bundle, env, version=bad)  # type: ignore[arg-type]


def test_the_blocking_import_refuses_a_stale_bundle(tmp_path: Path, root: Path) -> None:
    bundle = anyio.run(make_bundle, tmp_path / "old.bundle", [OLD])
    with open_blocking("svc", root=root) as env:
        with pytest.raises(StaleBundleError):
            blocking_import(bundle, env, version="1.1")
        assert env.namespaces() == []


def warmenv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warmenv", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def mixed_url(server: BundleServer, tmp_path: Path) -> Iterator[tuple[str, int]]:
    body = anyio.run(make_bundle, tmp_path / "mixed.bundle", [OLD, NEW]).read_bytes()
    yield server.put("/mixed.bundle", body), len(body)


def test_the_command_line_refuses_a_stale_url_before_downloading_it(
    server: BundleServer, mixed_url: tuple[str, int], root: Path
) -> None:
    url, length = mixed_url
    done = warmenv("import", url, "--app-version", "2.0", "--env", "svc", "--root", str(root))
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "no namespace is for version '2.0'" in line and "versions '1.0' and '1.1'" in line
    assert sum(s.sent for s in server.seen) < length // 10
    assert not (root / "svc.db").exists()


def test_the_command_line_imports_what_can_hit_and_says_what_it_left_out(
    mixed_url: tuple[str, int], root: Path
) -> None:
    url, _ = mixed_url
    args = ["import", url, "--app-version", "1.1", "--env", "svc", "--root", str(root)]
    done = warmenv(*args)
    assert done.returncode == 0, done.stderr
    assert "left out 1 namespace of another version than '1.1'" in done.stdout
    assert str(OLD) in done.stdout
    scripted = warmenv(*args, "--json")
    assert json.loads(scripted.stdout)["other_versions"] == [str(OLD)]
