"""A key being computed while an import lands it: the askers take the imported value.

A service computes the keys its import has not reached yet; when the import
commits a batch holding a key whose computation is still running, that
computation is cancelled (its value would only replace the imported one)
and every asker of the run gets the imported value. The import is driven
step by step through `importing()`, so the order "compute started, then key
landed" is made, not waited for; real bundle files in both formats, bulk
and scanned imports, every backend.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from test_download import BundleServer
from warmenv import Namespace, open_environment
from warmenv.blocking import export_bundle as export_blocking
from warmenv.blocking import import_bundle as import_blocking
from warmenv.blocking import open_environment as open_blocking
from warmenv.bundle import BundleStarted, Downloading, Verifying, import_bundle, importing
from warmenv.bundle.events import BundleProgress, Progress
from warmenv.persistence import Origin

pytestmark = pytest.mark.anyio

NS = Namespace("svc", "answers", version="1")
KEYS = 64
LAST = f"k{KEYS - 1:03d}"  # sorted last: the import reaches it in its last batch


@pytest.fixture(params=["sqlite", "flat"])
def bundle(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    with open_blocking(file=tmp_path / "ci.db") as ci:
        store = ci.store(NS)
        for i in range(KEYS):
            store.insert(f"k{i:03d}", f"imported {i}")
    out = tmp_path / f"svc.{request.param}.bundle"
    export_blocking(tmp_path / "ci.db", out, name="svc", version="1", format=request.param)
    return out


class SlowCompute:
    """A computation that runs until it is cancelled or released."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.cancelled = False
        self.ended = anyio.Event()
        self.calls = 0

    async def __call__(self, key: str) -> str:
        self.calls += 1
        self.started.set()
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        finally:
            self.ended.set()
        return f"computed {key}"


@pytest.mark.parametrize("validate", [None, lambda ns, k, v: True], ids=["bulk", "scan"])
async def test_a_waiting_get_or_compute_takes_the_value_an_import_lands_first(
    bundle: Path, tmp_path: Path, validate: object
) -> None:
    async with open_environment(file=tmp_path / "svc.db") as env:
        store = await env.store(NS)
        compute = SlowCompute()
        answers: list[str] = []

        async def ask() -> None:
            answers.append(await store.get_or_compute(LAST, compute, LAST))

        async with importing(bundle, env, batch_size=8, validate=validate) as progress:  # type: ignore[arg-type]
            events = aiter(progress)
            while not isinstance(await anext(events), Progress):
                pass  # up to the first batch: the import is running, LAST not landed
            async with anyio.create_task_group() as tasks:
                for _ in range(3):  # one run, three askers
                    tasks.start_soon(ask)
                await compute.started.wait()
                async for _ in events:
                    pass  # the rest of the import, LAST in its last batch
        assert answers == [f"imported {KEYS - 1}"] * 3
        assert compute.calls == 1 and compute.cancelled
        info = await env.storage(NS).info(b'"%s"' % LAST.encode())
        assert info is not None and info.origin is Origin.IMPORTED
        counts = (await env.statistics()).namespaces[0]
        assert counts.computes == 0


@pytest.fixture
def http() -> Iterator[BundleServer]:
    httpd = BundleServer()
    thread = threading.Thread(target=httpd.serve_forever, name="bundle-server", daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


PHASES = {"before": None, "started": BundleStarted, "verifying": Verifying}


@pytest.mark.parametrize("phase", [*PHASES, "downloading"])
async def test_a_computation_started_before_the_first_batch_takes_the_imported_value(
    bundle: Path, tmp_path: Path, phase: str, http: BundleServer
) -> None:
    """Before the import began, as it opened the bundle, while it checked the digest or
    downloaded it: the import is in progress, so the run is watched all the same."""
    source: str | Path = bundle
    after: type | None = PHASES.get(phase)
    if phase == "downloading":
        source, after = http.put("/svc.bundle", bundle.read_bytes()), Downloading
    async with open_environment(file=tmp_path / "svc.db") as env:
        store = await env.store(NS)
        compute = SlowCompute()
        answers: list[str] = []

        async def ask() -> None:
            answers.append(await store.get_or_compute(LAST, compute, LAST))

        async with anyio.create_task_group() as tasks:
            if after is None:
                tasks.start_soon(ask)
                await compute.started.wait()
            async with importing(source, env, batch_size=8) as progress:
                events = aiter(progress)
                if after is not None:
                    while not isinstance(await anext(events), after):
                        pass  # no batch has landed yet
                    tasks.start_soon(ask)
                    await compute.started.wait()
                async for _ in events:
                    pass
                with anyio.fail_after(30):  # a bound, not a wait: it was cancelled, or never is
                    await compute.ended.wait()  # the watcher's read after the last batch
            compute.release.set()
        assert answers == [f"imported {KEYS - 1}"]
        assert compute.calls == 1 and compute.cancelled
        info = await env.storage(NS).info(b'"%s"' % LAST.encode())
        assert info is not None and info.origin is Origin.IMPORTED
        assert progress.report.imported == KEYS


async def test_a_computation_ending_as_the_batch_of_its_key_lands_takes_the_imported_value(
    bundle: Path, tmp_path: Path
) -> None:
    """The batch holding the key has committed and the computation ends before the
    read that would have found it: the imported value is still the one kept."""
    async with open_environment(file=tmp_path / "svc.db") as env:
        store = await env.store(NS)
        compute = SlowCompute()
        answers: list[str] = []

        async def ask() -> None:
            answers.append(await store.get_or_compute(LAST, compute, LAST))

        async with importing(bundle, env, batch_size=8) as progress:
            events = aiter(progress)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(ask)
                await compute.started.wait()
                while True:
                    event = await anext(events)
                    if isinstance(event, BundleProgress) and event.entries_done == KEYS:
                        break  # LAST has committed; the watcher has not read it yet
                compute.release.set()
            async for _ in events:
                pass
        assert answers == [f"imported {KEYS - 1}"]
        info = await env.storage(NS).info(b'"%s"' % LAST.encode())
        assert info is not None and info.origin is Origin.IMPORTED


async def test_a_computation_that_ends_before_the_import_lands_its_key_wins(
    bundle: Path, tmp_path: Path
) -> None:
    async with open_environment(file=tmp_path / "svc.db") as env:
        store = await env.store(NS)
        compute = SlowCompute()
        compute.release.set()
        async with importing(bundle, env, batch_size=8) as progress:
            events = aiter(progress)
            while not isinstance(await anext(events), Progress):
                pass
            assert await store.get_or_compute(LAST, compute, LAST) == f"computed {LAST}"
            async for _ in events:
                pass
        assert progress.report.skipped == 1  # the local value stays
        assert await (await env.store(NS)).get(LAST) == f"computed {LAST}"


async def test_an_exception_of_the_computation_is_raised_as_it_is_during_an_import(
    bundle: Path, tmp_path: Path
) -> None:
    async def fails() -> str:
        raise KeyError("no such answer")

    async with open_environment(file=tmp_path / "svc.db") as env:
        store = await env.store(NS)
        async with importing(bundle, env, batch_size=8) as progress:
            events = aiter(progress)
            while not isinstance(await anext(events), Progress):
                pass
            with pytest.raises(KeyError, match="no such answer"):
                await store.get_or_compute(LAST, fails)
            async for _ in events:
                pass


def test_a_blocking_computation_finishes_and_its_caller_takes_the_imported_value(
    bundle: Path, tmp_path: Path
) -> None:
    started, release = threading.Event(), threading.Event()
    answers: list[str] = []

    def compute(key: str) -> str:
        started.set()
        release.wait(30)
        return f"computed {key}"

    with open_blocking(file=tmp_path / "svc.db") as env:
        store = env.store(NS)
        # A first batch lands, so an import is running when the computation starts.
        gate = threading.Event()

        def progress(event: object) -> None:
            if isinstance(event, Progress) and not gate.is_set():
                gate.set()
                started.wait(30)

        def ask() -> None:
            gate.wait(30)
            answers.append(store.get_or_compute(LAST, compute, LAST))

        asker = threading.Thread(target=ask)
        asker.start()
        report = import_blocking(bundle, env, batch_size=8, progress=progress)
        assert report.imported == KEYS
        release.set()  # a plain function cannot be cancelled: it ends, its value unused
        asker.join(30)
        assert answers == [f"imported {KEYS - 1}"]
        assert env.store(NS).get(LAST) == f"imported {KEYS - 1}"


async def test_once_an_import_has_ended_its_watchers_read_once_more(
    bundle: Path, tmp_path: Path
) -> None:
    # An import's end is announced like a batch, however it ended (here: it landed
    # nothing), so a run that is still computing reads its key a last time.
    async with open_environment(file=tmp_path / "svc.db") as env:
        arrivals = env.storage(NS).arrivals()
        assert arrivals is not None
        seen = arrivals.batches
        woke: list[int] = []

        async def watch() -> None:
            woke.append(await arrivals.after(seen))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch)
            report = await import_bundle(bundle, env, namespaces=["other/"])
        assert report.imported == 0
        assert woke == [seen + 1]


EARLY, SERVED = Namespace("aaa", "early", version="1"), Namespace("zzz", "served", version="1")


@pytest.fixture
def two_namespaces(tmp_path: Path) -> Path:
    """A flat bundle of two namespaces; the one sorted last is the one the service asks for."""
    with open_blocking(file=tmp_path / "two-ci.db") as ci:
        for namespace in (EARLY, SERVED):
            store = ci.store(namespace)
            for i in range(20):
                store.insert(f"k{i:02d}", i)
    flat = tmp_path / "two.bundle"
    export_blocking(tmp_path / "two-ci.db", flat, name="two", version="1", format="flat")
    return flat


@pytest.mark.parametrize("validate", [None, lambda ns, k, v: True], ids=["flat", "validated"])
async def test_an_import_copies_the_namespaces_of_open_stores_first(
    two_namespaces: Path, tmp_path: Path, validate: object
) -> None:
    async def order(env_file: Path, opened: list[Namespace]) -> list[str]:
        async with open_environment(file=env_file) as env:
            for namespace in opened:
                await env.store(namespace)
            async with importing(two_namespaces, env, batch_size=5, validate=validate) as progress:  # type: ignore[arg-type]
                seen = [e.namespace async for e in progress if isinstance(e, Progress)]
            return list(dict.fromkeys(seen))

    assert await order(tmp_path / "cold.db", []) == [str(EARLY), str(SERVED)]
    assert await order(tmp_path / "serving.db", [SERVED]) == [str(SERVED), str(EARLY)]
