from __future__ import annotations

import importlib.util
from typing import Any

import pytest

_BACKENDS: list[Any] = [pytest.param("asyncio", id="asyncio")]
if importlib.util.find_spec("uvloop") is not None:
    _BACKENDS.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))
_BACKENDS.append(pytest.param("trio", id="trio"))


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Every async test runs on asyncio, asyncio with uvloop, and trio."""
    return request.param


@pytest.fixture
def backend_name(anyio_backend: Any) -> str:
    """The anyio backend name of the running test, for `anyio.run` in threads."""
    return anyio_backend if isinstance(anyio_backend, str) else str(anyio_backend[0])
