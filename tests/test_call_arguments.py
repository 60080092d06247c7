"""A mistake in a call is raised at the call, in one line: never later, never elsewhere.

`warm_up(version=1.0)` used to return a handle and fail in the background
(logged, the warm-up FAILED); `import_bundle(namespaces="app")` imported
nothing without a word, and `export --app-version 1/2` wrote a bundle whose
version no namespace can carry. Every public entry point that takes an
application's version or an import's options is checked here, the async and
blocking faces and the command line alike, against values of the wrong type
and values a namespace's version segment cannot hold.
"""

from __future__ import annotations

import math
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import warmenv.blocking
from test_cli import warmenv as cli
from test_cli_errors import assert_one_error_line
from warmenv import Environment, Namespace, open_environment
from warmenv.bundle import (
    export_bundle,
    exporting,
    import_bundle,
    importing,
    preflight,
    warm_up,
)

APP = Namespace("app", "kernels", version="1")

# Versions no namespace can carry: of another type (TypeError) or not one segment.
NOT_TEXT: list[object] = [1.0, 1, 1.10, b"1", ("1",)]
NOT_A_SEGMENT = ["", "1/2", "/1", "1/", "1\udcff"]


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    async def make() -> Path:
        async with open_environment("src", root=tmp_path / "src") as env:
            await env.storage(APP).insert_many([(b"k%d" % i, b"v") for i in range(5)])
            out = tmp_path / "b.bundle"
            await export_bundle(env, out, name="CI", version="1")
        return out

    return anyio.run(make)


def expected(version: object) -> type[Exception]:
    return TypeError if not isinstance(version, str) else ValueError


# --- the async face ---------------------------------------------------------------


async def _import(bundle: Path, env: Environment, **options: Any) -> None:
    await import_bundle(bundle, env, **options)


async def _warm_up(bundle: Path, env: Environment, **options: Any) -> None:
    warm_up(bundle, env, **options)  # raises here, or the handle is a failure of the test


async def _preflight(bundle: Path, env: Environment, **options: Any) -> None:
    await preflight(bundle, **options)


async def _export(bundle: Path, env: Environment, **options: Any) -> None:
    await export_bundle(env, bundle.parent / "out.bundle", name="n", **options)


TAKE_A_VERSION = [_import, _warm_up, _preflight, _export]


@pytest.mark.anyio
@pytest.mark.parametrize("version", NOT_TEXT + NOT_A_SEGMENT, ids=repr)
@pytest.mark.parametrize("call", TAKE_A_VERSION, ids=lambda f: f.__name__.strip("_"))
async def test_a_version_no_namespace_can_carry_is_refused_at_the_call(
    call: Callable[..., Any], version: object, bundle: Path, root: Path
) -> None:
    async with open_environment("svc", root=root) as env:
        with pytest.raises(expected(version), match="version") as raised:
            await call(bundle, env, version=version)
        assert "\n" not in str(raised.value)
        assert await env.namespaces() == []  # nothing imported
        assert (await env.statistics()).imports == []  # no warm-up was started
    assert not (bundle.parent / "out.bundle").exists()


def test_a_namespace_refuses_the_same_versions() -> None:
    for version in NOT_TEXT + NOT_A_SEGMENT:
        with pytest.raises(expected(version), match="version"):
            Namespace("app", "kernels", version=version)  # type: ignore[arg-type]


BAD_IMPORT_OPTIONS: list[tuple[str, object, type[Exception], str]] = [
    ("namespaces", "app", TypeError, r"pass \['app'\]"),
    ("namespaces", [1], TypeError, "str prefixes"),
    ("batch_size", True, TypeError, "batch_size"),  # a wrong type: TypeError, as version=
    ("batch_size", "8", TypeError, "batch_size"),
    ("batch_size", 8.0, TypeError, "batch_size"),
    ("batch_size", 0, ValueError, "batch_size"),
    ("share", 0, ValueError, "share"),
    ("share", math.nan, ValueError, "share"),
    ("share", "0.5", TypeError, "share"),
    ("share", True, TypeError, "share"),
    ("verify", None, TypeError, "verify"),
    ("verify", "no", TypeError, "verify"),
    ("validate", "x", TypeError, "validate"),
    ("download", {"max_bytes": 1}, TypeError, "DownloadOptions"),
    ("trust", 1.5, TypeError, "trust"),
    ("trust", [b"ed25519:x"], TypeError, "trust"),
    ("trust", ["ed25519:not-a-key"], ValueError, "not a warmenv public key"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("option", "value", "error", "says"), BAD_IMPORT_OPTIONS)
@pytest.mark.parametrize("call", [_import, _warm_up], ids=lambda f: f.__name__.strip("_"))
async def test_a_bad_import_option_is_refused_at_the_call(
    call: Callable[..., Any],
    option: str,
    value: object,
    error: type[Exception],
    says: str,
    bundle: Path,
    root: Path,
) -> None:
    async with open_environment("svc", root=root) as env:
        with pytest.raises(error, match=says):
            await call(bundle, env, **{option: value})
        assert await env.namespaces() == []
        assert (await env.statistics()).imports == []


# Each with what the refusal says: an unknown keyword, then a value of the wrong type.
BAD_IMPORTING_CALLS: list[tuple[dict[str, object], type[Exception], str]] = [
    (
        {"batchsize": 8},
        TypeError,
        r"^importing\(\) got an unexpected keyword argument 'batchsize'$",
    ),
    ({"version": 1.0}, TypeError, "version"),
    ({"namespaces": "app"}, TypeError, r"pass \['app'\]"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("options", "error", "says"), BAD_IMPORTING_CALLS, ids=repr)
async def test_importing_refuses_a_bad_keyword_at_the_call_as_exporting_does(
    options: dict[str, Any], error: type[Exception], says: str, bundle: Path, root: Path
) -> None:
    # Called, not entered: the context manager is never made (it refused on entry before).
    async with open_environment("svc", root=root) as env:
        with pytest.raises(error, match=says):
            importing(bundle, env, **options)
        assert await env.namespaces() == []


@pytest.mark.anyio
@pytest.mark.parametrize("call", [_import, _warm_up], ids=lambda f: f.__name__.strip("_"))
async def test_a_source_or_environment_of_another_type_is_refused_at_the_call(
    call: Callable[..., Any], bundle: Path, root: Path
) -> None:
    async with open_environment("svc", root=root) as env:
        with pytest.raises(TypeError, match="source must be"):
            await call(3, env)
        blocking_env = await anyio.to_thread.run_sync(
            lambda: warmenv.blocking.open("other", root=root)
        )
        try:
            with pytest.raises(TypeError, match=r"warmenv\.blocking's form"):
                await call(bundle, blocking_env)
        finally:
            await anyio.to_thread.run_sync(blocking_env.close)
        assert await env.namespaces() == []


@pytest.mark.anyio
async def test_a_warm_up_on_event_that_is_no_function_is_refused_at_the_call(
    bundle: Path, root: Path
) -> None:
    async with open_environment("svc", root=root) as env:
        with pytest.raises(TypeError, match="on_event"):
            warm_up(bundle, env, on_event="print")  # type: ignore[arg-type]
        assert (await env.statistics()).imports == []


# --- the blocking face ------------------------------------------------------------


def _blocking_import(bundle: Path, env: Any, **options: Any) -> None:
    warmenv.blocking.import_bundle(bundle, env, **options)


def _blocking_warm_up(bundle: Path, env: Any, **options: Any) -> None:
    warmenv.blocking.warm_up(bundle, env, **options)


def _blocking_export(bundle: Path, env: Any, **options: Any) -> None:
    warmenv.blocking.export_bundle(env, bundle.parent / "out.bundle", name="n", **options)


@pytest.mark.parametrize("version", NOT_TEXT + NOT_A_SEGMENT, ids=repr)
@pytest.mark.parametrize(
    "call",
    [_blocking_import, _blocking_warm_up, _blocking_export],
    ids=lambda f: f.__name__.strip("_"),
)
def test_the_blocking_forms_refuse_a_bad_version_at_the_call(
    call: Callable[..., Any], version: object, bundle: Path, root: Path
) -> None:
    with warmenv.blocking.open_environment("svc", root=root) as env:
        with pytest.raises(expected(version), match="version"):
            call(bundle, env, version=version)
        assert env.namespaces() == []
        assert env.statistics().imports == []
    assert not (bundle.parent / "out.bundle").exists()


@pytest.mark.parametrize(("option", "value", "error", "says"), BAD_IMPORT_OPTIONS)
@pytest.mark.parametrize(
    "call", [_blocking_import, _blocking_warm_up], ids=lambda f: f.__name__.strip("_")
)
def test_the_blocking_forms_refuse_a_bad_import_option_at_the_call(
    call: Callable[..., Any],
    option: str,
    value: object,
    error: type[Exception],
    says: str,
    bundle: Path,
    root: Path,
) -> None:
    with warmenv.blocking.open_environment("svc", root=root) as env:
        with pytest.raises(error, match=says):
            call(bundle, env, **{option: value})
        assert env.namespaces() == []


def test_the_blocking_forms_refuse_an_async_environment(bundle: Path, root: Path) -> None:
    async def check() -> None:
        async with open_environment("svc", root=root) as env:
            for call in (_blocking_import, _blocking_warm_up):
                with pytest.raises(TypeError, match=r"warmenv\.bundle's form"):
                    await anyio.to_thread.run_sync(call, bundle, env)

    anyio.run(check)


# --- the command line -------------------------------------------------------------


@pytest.mark.parametrize("version", [*NOT_A_SEGMENT[:4], "1/2/3", "app/1"])
@pytest.mark.parametrize("command", ["export", "import", "check"])
def test_an_app_version_that_is_no_namespace_segment_is_bad_usage(
    command: str, version: str, bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "cli-root"
    out = tmp_path / "cli.bundle"
    args = {
        "export": ["export", str(out), "--name", "n", str(tmp_path / "src" / "src.db")],
        "import": ["import", str(bundle), "--env", "svc"],
        "check": ["check", str(bundle)],
    }[command]
    completed: subprocess.CompletedProcess[str] = cli(*args, "--app-version", version, root=root)
    line = assert_one_error_line(completed, 2)
    assert "--app-version" in line
    assert not root.exists() and not out.exists()


# --- a warm-up's wait, on both faces ----------------------------------------------


@pytest.mark.anyio
async def test_a_warm_up_wait_with_a_timeout_says_whether_it_ended(
    bundle: Path, root: Path
) -> None:
    release = anyio.Event()

    async def held_back(event: object) -> None:
        await release.wait()

    async with open_environment("svc", root=root) as env:
        handle = warm_up(bundle, env, on_event=held_back)
        assert await handle.wait(0) is False
        assert await handle.wait(0.01) is False
        for bad, error in [(-1, ValueError), (math.nan, ValueError), ("1", TypeError)]:
            with pytest.raises(error, match="timeout"):
                await handle.wait(bad)  # type: ignore[arg-type]
        release.set()
        assert await handle.wait() is True
        assert await handle.wait(0) is True


def test_a_blocking_warm_up_wait_with_a_timeout_says_whether_it_ended(
    bundle: Path, root: Path
) -> None:
    release = threading.Event()
    with warmenv.blocking.open_environment("svc", root=root) as env:
        handle = warmenv.blocking.warm_up(bundle, env, on_event=lambda e: release.wait())
        assert handle.wait(0) is False
        assert handle.wait(0.01) is False
        for bad, error in [(-1, ValueError), (math.nan, ValueError), ("1", TypeError)]:
            with pytest.raises(error, match="timeout"):
                handle.wait(bad)  # type: ignore[arg-type]
        release.set()
        assert handle.wait() is True
        assert handle.wait(0) is True


# --- the export options (ExportOptions, issue 19) ----------------------------------

# Each with what the refusal names: an unknown keyword, then each required one missing.
BAD_EXPORT_KEYWORDS: list[tuple[dict[str, object], str]] = [
    (
        {"name": "n", "version": "1", "formatversion": 1},
        "got an unexpected keyword argument 'formatversion'",
    ),
    ({"version": "1"}, "missing required keyword argument 'name'"),
    ({"name": "n"}, "missing required keyword argument 'version'"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("options", "says"), BAD_EXPORT_KEYWORDS, ids=repr)
async def test_an_export_keyword_no_export_takes_is_refused_at_the_call(
    options: dict[str, Any], says: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.bundle"
    async with open_environment("src", root=tmp_path) as env:
        with pytest.raises(TypeError, match=rf"^export_bundle\(\) {says}$"):
            await export_bundle(env, out, **options)
        # exporting refuses it when called, before its block is entered.
        with pytest.raises(TypeError, match=rf"^exporting\(\) {says}$"):
            exporting(env, out, **options)
    assert not out.exists()


@pytest.mark.parametrize(("options", "says"), BAD_EXPORT_KEYWORDS, ids=repr)
def test_a_blocking_export_keyword_no_export_takes_is_refused_at_the_call(
    options: dict[str, Any], says: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.bundle"
    with warmenv.blocking.open_environment("src", root=tmp_path) as env:
        with pytest.raises(TypeError, match=rf"^export_bundle\(\) {says}$"):
            warmenv.blocking.export_bundle(env, out, **options)
    assert not out.exists()
