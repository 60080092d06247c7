"""A context manager of one kind used with the other statement says which to write.

Python says only that the object "does not support the context manager
protocol"; every public context manager that is only one kind answers with a
`TypeError` that names the form to write (`async with ...`, or `with ...`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import warmenv.blocking
from warmenv import Environment, Namespace, open_environment
from warmenv.bundle import FlatBundle, SqliteBundle, exporting, importing, open_bundle
from warmenv.stream import enter, new
from warmenv.sync import RLock, RWLock

pytestmark = pytest.mark.anyio


def _opened(bundle_path: Path) -> dict[str, Callable[[], Any]]:
    return {
        "open_bundle": lambda: open_bundle(bundle_path),
        "SqliteBundle.open": lambda: SqliteBundle.open(bundle_path),
        "FlatBundle.open": lambda: FlatBundle.open(bundle_path),
    }


def _assert_async_with(raised: pytest.ExceptionInfo[TypeError], form: str) -> None:
    said = str(raised.value)
    assert f"write `async with {form}:`" in said and "not `with`" in said, said
    assert "\n" not in said


@pytest.mark.parametrize("opener", ["open_bundle", "SqliteBundle.open", "FlatBundle.open"])
async def test_a_bundle_opener_used_with_with_says_async_with(
    bundle_path: Path, opener: str
) -> None:
    with pytest.raises(TypeError) as raised:
        with _opened(bundle_path)[opener]():
            pass
    _assert_async_with(raised, "open_bundle(path) as bundle")


async def test_an_open_bundle_used_with_with_says_async_with(bundle_path: Path) -> None:
    async with open_bundle(bundle_path) as bundle:
        with pytest.raises(TypeError) as raised:
            with bundle:  # type: ignore[union-attr]
                pass
    _assert_async_with(raised, "bundle")
    data = bundle_path.read_bytes()
    if data.startswith(b"WARMENV"):
        with pytest.raises(TypeError, match="async with bundle"):
            with FlatBundle.from_bytes(data):  # type: ignore[attr-defined]
                pass


async def test_an_environment_and_a_store_used_with_with_say_async_with(env: Environment) -> None:
    with pytest.raises(TypeError) as raised:
        with env:  # type: ignore[attr-defined]
            pass
    _assert_async_with(raised, "open_environment(...) as env")
    store = await env.store(Namespace("app", "k", version="1"))
    with pytest.raises(TypeError) as raised:
        with store:  # type: ignore[attr-defined]
            pass
    _assert_async_with(raised, "await env.store(namespace) as store")
    with pytest.raises(TypeError, match=re.escape("async with open_environment(")):
        with open_environment("x", root=env.path.parent):  # type: ignore[attr-defined]
            pass


async def test_locks_used_with_with_say_async_with() -> None:
    lock = RWLock()
    for block, form in [
        (RLock(), "lock"),
        (lock.read(), "lock.read()"),
        (lock.write(), "lock.write()"),
    ]:
        with pytest.raises(TypeError) as raised:
            with block:  # type: ignore[attr-defined]
                pass
        _assert_async_with(raised, form)
    async with lock.write():  # nothing was left held
        pass


async def test_importing_and_exporting_used_with_with_say_async_with(
    env: Environment, bundle_path: Path, tmp_path: Path
) -> None:
    with pytest.raises(TypeError) as raised:
        with importing(bundle_path, env):  # type: ignore[attr-defined]
            pass
    _assert_async_with(raised, "importing(source, env) as progress")
    with pytest.raises(TypeError) as raised:
        with exporting(env, tmp_path / "out.bundle", name="n", version="1"):  # type: ignore[attr-defined]
            pass
    _assert_async_with(raised, "exporting(sources, out, name=...) as progress")
    assert not (tmp_path / "out.bundle").exists()


async def test_plain_context_managers_used_with_async_with_say_with(tmp_path: Path) -> None:
    stream = new()
    with pytest.raises(TypeError, match=re.escape("write `with warmenv.stream.enter(stream_id):`")):
        async with enter(stream):  # type: ignore[attr-defined]
            pass
    with enter(stream) as pinned:  # the plain form still works
        assert pinned == stream
    with pytest.raises(TypeError, match=re.escape("write `with warmenv.blocking.open_environment")):
        async with warmenv.blocking.open_environment("x", root=tmp_path):  # type: ignore[attr-defined]
            pass


def _assert_awaited(raised: pytest.ExceptionInfo[TypeError], form: str) -> None:
    said = str(raised.value)
    assert said.endswith(f"not awaitable: write `async with {form}:`"), said
    assert "\n" not in said


@pytest.mark.parametrize("opener", ["open_bundle", "SqliteBundle.open", "FlatBundle.open"])
async def test_a_bundle_opener_awaited_says_async_with(bundle_path: Path, opener: str) -> None:
    with pytest.raises(TypeError) as raised:
        await _opened(bundle_path)[opener]()
    _assert_awaited(raised, "open_bundle(path) as bundle")


async def test_open_environment_awaited_says_async_with(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as raised:
        await open_environment("keys", root=tmp_path)  # type: ignore[misc]
    _assert_awaited(raised, "open_environment(...) as env")
    assert list(tmp_path.iterdir()) == []  # nothing was opened


async def test_importing_and_exporting_awaited_say_async_with(
    env: Environment, bundle_path: Path, tmp_path: Path
) -> None:
    with pytest.raises(TypeError) as raised:
        await importing(bundle_path, env)  # type: ignore[misc]
    _assert_awaited(raised, "importing(source, env) as progress")
    with pytest.raises(TypeError) as raised:
        await exporting(env, tmp_path / "out.bundle", name="n", version="1")  # type: ignore[misc]
    _assert_awaited(raised, "exporting(sources, out, name=...) as progress")
    assert not (tmp_path / "out.bundle").exists()


async def test_locks_awaited_say_async_with() -> None:
    lock = RWLock()
    for block, form in [(lock.read(), "lock.read()"), (lock.write(), "lock.write()")]:
        with pytest.raises(TypeError) as raised:
            await block  # type: ignore[misc]
        _assert_awaited(raised, form)
    async with lock.write():  # nothing was left held
        pass
