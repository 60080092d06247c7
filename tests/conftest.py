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


# --- environments and storages -------------------------------------------------

from collections.abc import AsyncIterator, Iterator  # noqa: E402
from contextlib import AsyncExitStack  # noqa: E402
from pathlib import Path  # noqa: E402

import warmenv.environment  # noqa: E402
from warmenv import Environment, MemoryStorage, Namespace, open_environment  # noqa: E402
from warmenv.persistence import Storage  # noqa: E402

NS = Namespace("app", "kernels", version="1")


@pytest.fixture(autouse=True)
def _isolated_defaults(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """No test reads the user's config or writes to the user's cache."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("WARMENV_ROOT", str(home / "root"))
    monkeypatch.delenv("WARMENV_ENVIRONMENT", raising=False)
    monkeypatch.setattr(warmenv.environment, "_active_name", None)
    monkeypatch.setattr(warmenv.environment, "_active_root", None)
    yield


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
async def env(root: Path) -> AsyncIterator[Environment]:
    async with open_environment("test", root=root) as environment:
        yield environment


@pytest.fixture(params=["sqlite", "memory"])
async def storage(request: pytest.FixtureRequest, root: Path) -> AsyncIterator[Storage]:
    """The same contract suite runs over every storage backend."""
    if request.param == "memory":
        yield MemoryStorage(NS)
        return
    async with AsyncExitStack() as stack:
        environment = await stack.enter_async_context(open_environment("contract", root=root))
        yield environment.storage(NS)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory other users can reach (pytest's own tmp_path is private to root)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="warmenv-shared-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for sub in [path, *path.rglob("*")]:
            if sub.is_dir():
                sub.chmod(0o755)
        shutil.rmtree(path, ignore_errors=True)
