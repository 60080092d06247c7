"""An environment belongs to the event loop that opened it.

Each environment here is opened on an event loop running in a thread of its
own (an anyio blocking portal), on asyncio, uvloop or trio, and then used
from the test's event loop, on each of the three, so every order of backends
and the same backend on two loops are covered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from warmenv import Environment, Namespace, WarmenvError, open_environment

NS = Namespace("app", "kernels", version="1")
pytestmark = pytest.mark.anyio

# How the error names each kind of loop.
_LABELS = {"asyncio": "asyncio event loop", "uvloop": "uvloop event loop", "trio": "trio run"}
_RUNS = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}


@attrs.frozen
class Elsewhere:
    """An environment opened on another thread's event loop, and that loop's portal."""

    env: Environment
    portal: BlockingPortal
    label: str


@pytest.fixture(params=list(_RUNS))
def elsewhere(request: pytest.FixtureRequest, root: Path) -> Iterator[Elsewhere]:
    backend, options = _RUNS[request.param]
    with start_blocking_portal(backend, options) as portal:
        opened = portal.wrap_async_context_manager(open_environment("elsewhere", root=root))
        with opened as env:
            portal.call(env.storage(NS).insert, b"k", b"v")
            yield Elsewhere(env, portal, _LABELS[request.param])


def _label(anyio_backend: Any) -> str:
    if anyio_backend == "trio":
        return _LABELS["trio"]
    return _LABELS["uvloop" if isinstance(anyio_backend, tuple) else "asyncio"]


async def test_an_environment_used_from_another_event_loop_raises_naming_both(
    elsewhere: Elsewhere, anyio_backend: Any
) -> None:
    with pytest.raises(WarmenvError) as caught:
        await elsewhere.env.storage(NS).get(b"k")
    message = str(caught.value)
    assert f"was opened on the {elsewhere.label}" in message
    assert f"is used from the {_label(anyio_backend)}" in message
    assert "open one per event loop" in message
    assert str(elsewhere.env.path) in message


async def test_a_store_opened_from_another_event_loop_raises_naming_both(
    elsewhere: Elsewhere, anyio_backend: Any
) -> None:
    with pytest.raises(WarmenvError, match=f"used from the {_label(anyio_backend)}"):
        await elsewhere.env.store(NS)


async def test_listing_namespaces_from_another_event_loop_raises_naming_both(
    elsewhere: Elsewhere,
) -> None:
    with pytest.raises(WarmenvError, match=f"opened on the {elsewhere.label}"):
        await elsewhere.env.namespaces()


async def test_the_environment_keeps_working_on_its_own_loop_after_a_foreign_use(
    elsewhere: Elsewhere,
) -> None:
    with pytest.raises(WarmenvError):
        await elsewhere.env.storage(NS).get(b"k")
    value = await anyio.to_thread.run_sync(
        elsewhere.portal.call, elsewhere.env.storage(NS).get, b"k"
    )
    assert value == b"v"


async def test_an_environment_on_its_own_loop_does_not_raise(root: Path) -> None:
    async with open_environment("here", root=root) as env:
        await env.storage(NS).insert(b"k", b"v")
        assert await env.storage(NS).get(b"k") == b"v"


async def test_closing_from_another_event_loop_raises_and_leaves_it_to_its_own_loop(
    elsewhere: Elsewhere,
) -> None:
    database = elsewhere.env.database
    assert database is not None
    with pytest.raises(WarmenvError, match=f"opened on the {elsewhere.label}"):
        await database.close()
    value = await anyio.to_thread.run_sync(
        elsewhere.portal.call, elsewhere.env.storage(NS).get, b"k"
    )
    assert value == b"v"
