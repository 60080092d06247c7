"""Each face of a store takes the compute function it runs, and refuses the other kind.

The async `Store` awaits what `fn(*args)` returns: an `async def`, or any
callable returning an awaitable (a lambda or `partial` around one, an object
whose `__call__` is async). A plain function is refused with a `TypeError`
naming it and saying what to use, where Python said "object dict can't be
used in 'await' expression". `warmenv.blocking` runs plain functions: an
async one is refused before it runs, and a plain one returning a coroutine
is refused with the coroutine closed (never left unawaited). Nothing is
stored either way.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import warmenv.blocking
from warmenv import Environment, Namespace
from warmenv.blocking import BlockingEnvironment

NS = Namespace("app", "tuned", version="1")


def tune_plainly(size: int) -> dict[str, int]:
    return {"block": size // 8}


async def tune(size: int) -> dict[str, int]:
    return {"block": size // 8}


class Tuner:
    async def __call__(self, size: int) -> dict[str, int]:
        return {"block": size // 8}


# --- the async store ---------------------------------------------------------------


@pytest.mark.anyio
async def test_a_plain_function_given_to_get_or_compute_is_refused_naming_it(
    env: Environment,
) -> None:
    store = await env.store(NS)
    plain: Any = tune_plainly
    with pytest.raises(TypeError, match=r"^tune_plainly\(\) returned dict, not an awaitable") as e:
        await store.get_or_compute("k", plain, 1024)
    assert "async def" in str(e.value) and "warmenv.blocking" in str(e.value)
    assert await store.get("k") is None


@pytest.mark.anyio
async def test_a_memoized_plain_function_is_refused_naming_it(env: Environment) -> None:
    store = await env.store(NS)
    plain: Any = tune_plainly
    memoized = store.memoize(plain)
    with pytest.raises(TypeError, match=r"^tune_plainly\(\) returned dict, not an awaitable"):
        await memoized(1024)
    assert await store.get([1024]) is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    "fn",
    [
        tune,
        lambda size: tune(size),
        functools.partial(tune),
        Tuner(),
    ],
    ids=["async-def", "lambda-returning-a-coroutine", "partial", "async-call"],
)
async def test_the_async_store_takes_whatever_returns_an_awaitable(
    env: Environment, fn: Any
) -> None:
    store = await env.store(NS)
    assert await store.get_or_compute("k", fn, 1024) == {"block": 128}
    assert await store.get("k") == {"block": 128}


# --- warmenv.blocking ------------------------------------------------------------------


@pytest.fixture
def blocking_env(root: Path) -> Iterator[BlockingEnvironment]:
    with warmenv.blocking.open_environment("blocking", root=root) as env:
        yield env


@pytest.mark.parametrize(
    "fn",
    [tune, functools.partial(tune), Tuner()],
    ids=["async-def", "partial", "async-call"],
)
def test_an_async_function_given_to_blocking_get_or_compute_is_refused_before_it_runs(
    blocking_env: BlockingEnvironment, fn: Any
) -> None:
    store = blocking_env.store(NS)
    with pytest.raises(TypeError, match=r"is an async function: warmenv.blocking's store"):
        store.get_or_compute("k", fn, 1024)
    assert store.get("k") is None


def test_blocking_memoize_refuses_an_async_function_when_it_decorates(
    blocking_env: BlockingEnvironment,
) -> None:
    store = blocking_env.store(NS)
    fn: Any = tune
    with pytest.raises(TypeError, match=r"^tune\(\) is an async function"):
        store.memoize(fn)


def test_a_plain_function_returning_a_coroutine_is_refused_and_the_coroutine_closed(
    blocking_env: BlockingEnvironment,
) -> None:
    # Warnings are errors here: a coroutine left unawaited would fail the test.
    store = blocking_env.store(NS)
    with pytest.raises(TypeError, match=r"<lambda>\(\) returned coroutine, an awaitable"):
        store.get_or_compute("k", lambda: tune(1024))
    assert store.get("k") is None
    assert store.get_or_compute("k", tune_plainly, 1024) == {"block": 128}
