from __future__ import annotations

import gc
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

import warmenv.config  # noqa: E402
from warmenv import Environment, MemoryStorage, Namespace, WarmenvWarning, open_environment  # noqa: E402
from warmenv.persistence import Storage  # noqa: E402

NS = Namespace("app", "kernels", version="1")


@pytest.fixture(autouse=True)
def _isolated_defaults(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:
    """No test reads the user's config or writes to the user's cache."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("WARMENV_ROOT", str(home / "root"))
    monkeypatch.delenv("WARMENV_ENVIRONMENT", raising=False)
    monkeypatch.delenv("WARMENV_REMOTE", raising=False)
    monkeypatch.delenv("WARMENV_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("WARMENV_REQUIRE_SIGNATURE", raising=False)
    monkeypatch.setattr(warmenv.config, "_active_name", None)
    monkeypatch.setattr(warmenv.config, "_active_root", None)
    yield
    if request.node.get_closest_marker("coredis_streams") is not None:
        gc.collect()  # see redis_server.tolerating_coredis_streams


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


# --- bundles -----------------------------------------------------------------------

KERNELS = Namespace("app", "kernels", version="1")
CONFIGS = Namespace("app", "configs", version="1")
OTHER_APP = Namespace("app2", "kernels", version="1")


def sample_entries() -> dict[str, dict[bytes, bytes]]:
    return {
        str(KERNELS): {b"k%03d" % i: b"kernel-%d" % i for i in range(120)},
        str(CONFIGS): {b"c%02d" % i: b"config-%d" % i for i in range(30)},
        str(OTHER_APP): {b"x": b"other"},
    }


@pytest.fixture
async def warm_env(root: Path) -> AsyncIterator[Environment]:
    """An environment holding `sample_entries()`."""
    async with open_environment("warm", root=root) as environment:
        for namespace, items in sample_entries().items():
            await environment.storage(namespace).insert_many(items.items())
        yield environment


@pytest.fixture
async def cold_env(root: Path) -> AsyncIterator[Environment]:
    async with open_environment("cold", root=root) as environment:
        yield environment


@pytest.fixture(params=["sqlite", "flat"])
def bundle_format(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def bundle_path(warm_env: Environment, tmp_path: Path, bundle_format: str) -> Path:
    """A bundle of `warm_env` in each format."""
    from warmenv.bundle import export_bundle

    out = tmp_path / f"warm.{bundle_format}.bundle"
    await export_bundle(warm_env, out, name="H100 Linux", version="1", format=bundle_format)
    return out


async def env_contents(environment: Environment) -> dict[str, dict[bytes, bytes]]:
    """Everything an environment holds, namespace by namespace."""
    contents: dict[str, dict[bytes, bytes]] = {}
    for summary in await environment.namespaces():
        storage = environment.storage(summary.namespace)
        contents[summary.namespace] = {k: v async for k, v in storage.scan()}
    return contents


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """An empty directory for bundles, apart from the environments' root."""
    path = tmp_path / "out"
    path.mkdir()
    return path


# --- the shared tier: a redis-server of the test's own ------------------------------

from typing import TYPE_CHECKING  # noqa: E402

from redis_server import RedisServer, redis_server  # noqa: E402

if TYPE_CHECKING:
    import coredis


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server on a free port, started for this test (never the machine's own)."""
    with redis_server() as running:
        yield running


@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[coredis.Redis[bytes]]:
    """A plain client, to see and plant what is in Redis behind warmenv's back."""
    import coredis

    async with coredis.Redis.from_url(server.url, decode_responses=False) as client:
        yield client


@pytest.fixture(params=["sqlite", "memory"])
async def any_env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Environment]:
    """An environment on SQLite, and one degraded to memory: the same contract on both."""
    if request.param == "sqlite":
        async with open_environment("any", root=tmp_path / "any-env") as env:
            yield env
        return
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(WarmenvWarning, match="in memory"):
        async with open_environment("any", root=blocker / "sub") as env:
            assert env.in_memory
            yield env


import logging  # noqa: E402


@pytest.fixture
def records() -> Iterator[list[str]]:
    """Every record logged anywhere at DEBUG, as a handler formats it."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
