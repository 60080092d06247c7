"""A background warm-up (`warm_up`) never takes the service down, and closes with it.

The guide's own service (docs/warm-up-while-serving.md, its Starlette block)
is run here over real ASGI requests against a corrupt, a truncated and a
missing bundle: every request is answered 200, the failure is on the handle
and in the environment's statistics, and the environment is still open.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import subprocess
import sys
import threading
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from conftest import KERNELS, sample_entries
from warmenv import Environment, JsonCodec, Namespace, WarmenvError, open_environment
from warmenv.blocking import open_environment as open_blocking
from warmenv.blocking import warm_up as blocking_warm_up
from warmenv.bundle import (
    BundleError,
    BundleFinished,
    BundleNotFoundError,
    BundleProgress,
    CorruptBundleError,
    ImportEvent,
    WarmUpState,
    export_bundle,
    import_bundle,
    warm_up,
)
from warmenv.persistence.statistics import ImportOutcome

pytestmark = pytest.mark.anyio

GUIDE = Path(__file__).parent.parent / "docs" / "warm-up-while-serving.md"
TOTAL = sum(len(items) for items in sample_entries().values())


def the_guides_service() -> types.ModuleType:
    """The guide's Starlette block, as a module (its demo under `__main__` does not run)."""
    block = re.search(r"^```python\n(.*?)^```", GUIDE.read_text(), re.S | re.M)
    assert block is not None and "Starlette" in block.group(1)
    module = types.ModuleType("warm_up_guide")
    exec(compile(block.group(1), str(GUIDE), "exec"), module.__dict__)
    return module


def corrupt(path: Path) -> None:
    """One value's byte flipped, the structure intact: the digest no longer matches."""
    data = bytearray(path.read_bytes())
    at = data.rindex(b'"block"')
    data[at + 1] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def remove(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize("damage", [corrupt, truncate, remove], ids=lambda f: f.__name__)
async def test_the_guides_service_serves_every_request_whatever_its_bundle(
    damage: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    guide = the_guides_service()
    bundle = await guide.build_bundle(tmp_path)
    damage(bundle)
    app = guide.make_app(tmp_path / "root", bundle)
    sizes = list(range(0, 512, 8))
    with caplog.at_level(logging.ERROR, logger="warmenv.bundle"):
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
                await app.state.warm_up.wait()
                answers = [await client.get(f"/kernel/{size}") for size in sizes]
                ready = (await client.get("/ready")).json()
    assert [a.status_code for a in answers] == [200] * len(sizes)
    assert [a.json() for a in answers] == [{"size": s, "block": max(1, s // 4)} for s in sizes]
    assert ready["warm_up"] == "failed" and ready["error"]
    assert app.state.warm_up.state is WarmUpState.FAILED
    assert "warm-up of" in caplog.text and "failed" in caplog.text
    async with open_environment("svc", root=tmp_path / "root") as env:
        (record, *_) = (await env.statistics()).imports
    assert record.outcome is ImportOutcome.FAILED and record.source == str(bundle)
    assert record.error is not None and record.imported == 0


async def test_a_warm_up_of_a_missing_bundle_fails_with_a_bundle_error_naming_the_file(
    bundle_path: Path, root: Path
) -> None:
    bundle_path.unlink()
    async with open_environment("svc", root=root) as env:
        handle = warm_up(bundle_path, env)
        await handle.wait()
    assert isinstance(handle.error, BundleNotFoundError)
    assert isinstance(handle.error, BundleError) and isinstance(handle.error, FileNotFoundError)
    assert str(bundle_path) in str(handle.error)


@pytest.mark.parametrize(
    ("damage", "opened"),
    [(corrupt, True), (truncate, False), (remove, False)],
    ids=["corrupt", "truncate", "remove"],
)
async def test_a_failed_warm_up_reports_what_it_committed_once_its_bundle_opened(
    damage: Any, opened: bool, tmp_path: Path
) -> None:
    guide = the_guides_service()
    bundle = await guide.build_bundle(tmp_path)
    damage(bundle)
    async with open_environment("svc", root=tmp_path / "root") as env:
        handle = warm_up(bundle, env)
        await handle.wait()
    assert handle.state is WarmUpState.FAILED
    if opened:  # opened, then refused by its digest before any batch
        assert handle.report is not None and handle.report.imported == 0
        assert not handle.report.complete
    else:  # it never opened: nothing to report
        assert handle.report is None


async def test_the_guides_service_imports_a_good_bundle(tmp_path: Path) -> None:
    guide = the_guides_service()
    bundle = await guide.build_bundle(tmp_path)
    app = guide.make_app(tmp_path / "root", bundle)
    async with app.router.lifespan_context(app):
        await app.state.warm_up.wait()
        guide.computed.clear()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
            answer = await client.get("/kernel/64")
            ready = (await client.get("/ready")).json()
    assert answer.json() == {"size": 64, "block": 16} and guide.computed == []
    assert ready == {"warm_up": "finished", "error": None}


async def test_a_failed_warm_up_leaves_the_environment_open_and_says_why(
    bundle_path: Path, root: Path
) -> None:
    corrupt_bundle(bundle_path)
    async with open_environment("svc", root=root) as env:
        handle = warm_up(bundle_path, env)
        await handle.wait()
        assert handle.done and handle.state is WarmUpState.FAILED
        assert isinstance(handle.error, CorruptBundleError)
        assert await env.namespaces() == []  # nothing unverified was imported
        store = await env.store(KERNELS, JsonCodec())
        assert await store.get_or_compute("k", _value) == 1  # still serving
        (record,) = (await env.statistics()).imports
    assert record.outcome is ImportOutcome.FAILED
    assert record.error is not None and "CorruptBundleError" in record.error


def corrupt_bundle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.rindex(b"kernel-7")
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


async def _value() -> int:
    return 1


async def test_a_finished_warm_up_has_its_report_and_is_recorded(
    bundle_path: Path, root: Path
) -> None:
    events: list[ImportEvent] = []
    async with open_environment("svc", root=root) as env:
        handle = warm_up(bundle_path, env, on_event=events.append)
        await handle.wait()
        assert handle.state is WarmUpState.FINISHED and handle.error is None
        assert handle.report is not None and handle.report.imported == TOTAL
        assert isinstance(handle.latest, BundleFinished) and events[-1] is handle.latest
        (record,) = (await env.statistics()).imports
    assert (record.outcome, record.imported, record.bundle) == (
        ImportOutcome.IMPORTED,
        TOTAL,
        "H100 Linux",
    )


async def test_leaving_the_block_cancels_a_running_warm_up_after_whole_batches(
    bundle_path: Path, root: Path
) -> None:
    reached = anyio.Event()

    async def stall(event: ImportEvent) -> None:
        if isinstance(event, BundleProgress):
            reached.set()
            await anyio.sleep_forever()  # until the environment closes

    async with open_environment("svc", root=root) as env:
        handle = warm_up(bundle_path, env, on_event=stall, batch_size=16)
        await reached.wait()
    assert handle.done and handle.state is WarmUpState.CANCELLED and handle.error is None
    assert handle.report is not None and not handle.report.complete
    async with open_environment("svc", root=root) as env:
        held = sum(s.entries for s in await env.namespaces())
        (record,) = (await env.statistics()).imports
    assert held == handle.report.imported > 0
    assert record.outcome is ImportOutcome.CANCELLED


async def test_closing_the_environment_inside_its_block_cancels_the_warm_up_first(
    bundle_path: Path, root: Path
) -> None:
    reached = anyio.Event()

    async def stall(event: ImportEvent) -> None:
        reached.set()
        await anyio.sleep_forever()

    async with open_environment("svc", root=root) as env:
        handle = warm_up(bundle_path, env, on_event=stall)
        await reached.wait()
        await env.close()
        assert handle.done and handle.state is WarmUpState.CANCELLED


async def test_cancel_stops_it_and_the_environment_serves_on(bundle_path: Path, root: Path) -> None:
    reached = anyio.Event()

    async def stall(event: ImportEvent) -> None:
        reached.set()
        await anyio.sleep_forever()

    async with open_environment("svc", root=root) as env:
        handle = warm_up(bundle_path, env, on_event=stall)
        await reached.wait()
        handle.cancel()
        await handle.wait()
        assert handle.state is WarmUpState.CANCELLED
        assert await (await env.store(KERNELS)).get_or_compute("k", _value) == 1


async def test_a_warm_up_in_the_callers_task_group_fails_without_failing_it(
    bundle_path: Path, root: Path
) -> None:
    bundle_path.unlink()
    async with open_environment("svc", root=root) as env:
        async with anyio.create_task_group() as tasks:
            handle = warm_up(bundle_path, env, task_group=tasks)
        assert handle.state is WarmUpState.FAILED
        assert isinstance(handle.error, FileNotFoundError)


async def test_an_event_callback_that_raises_fails_the_warm_up_only(
    bundle_path: Path, root: Path
) -> None:
    def refuse(event: ImportEvent) -> None:
        raise ValueError("the dashboard is down")

    async with open_environment("svc", root=root) as env:
        handle = warm_up(bundle_path, env, on_event=refuse)
        await handle.wait()
        assert handle.state is WarmUpState.FAILED and isinstance(handle.error, ValueError)
        assert await env.namespaces() == []


async def test_an_environment_without_a_task_group_asks_for_one(
    bundle_path: Path, tmp_path: Path
) -> None:
    from warmenv.persistence.sqlite.database import open_database

    db = await open_database(tmp_path / "hand.db")
    async with Environment("hand", tmp_path / "hand.db", db) as env:
        with pytest.raises(WarmenvError, match="task_group="):
            warm_up(bundle_path, env)
        async with anyio.create_task_group() as tasks:
            handle = warm_up(bundle_path, env, task_group=tasks)
        assert handle.state is WarmUpState.FINISHED


def test_the_blocking_warm_up_fails_without_closing_the_environment(
    tmp_path: Path, root: Path
) -> None:
    missing = tmp_path / "gone.bundle"
    with open_blocking("svc", root=root) as env:
        handle = blocking_warm_up(missing, env)
        assert handle.wait(timeout=30)
        assert handle.state is WarmUpState.FAILED and isinstance(handle.error, OSError)
        store = env.store(KERNELS)
        assert store.get_or_compute("k", lambda: 2) == 2
        assert env.statistics().imports[0].outcome is ImportOutcome.FAILED


def test_the_blocking_warm_up_calls_on_event_off_the_loop_and_closes_with_the_block(
    tmp_path: Path, root: Path
) -> None:
    bundle = anyio.run(_export_sample, tmp_path)
    threads: set[str] = set()
    reached, release = threading.Event(), threading.Event()

    def watch(event: ImportEvent) -> None:
        threads.add(threading.current_thread().name)
        if isinstance(event, BundleProgress):
            reached.set()
            release.wait(timeout=60)  # still blocked when the block ends: not waited for

    try:
        with open_blocking("svc", root=root) as env:
            handle = blocking_warm_up(bundle, env, on_event=watch, batch_size=16)
            assert reached.wait(timeout=60)
            assert not handle.done
    finally:
        release.set()
    assert handle.done and handle.state is WarmUpState.CANCELLED
    assert "warmenv-blocking-loop" not in threads and threading.main_thread().name not in threads


def test_the_blocking_warm_up_imports_a_good_bundle(tmp_path: Path, root: Path) -> None:
    bundle = anyio.run(_export_sample, tmp_path)
    with open_blocking("svc", root=root) as env:
        handle = blocking_warm_up(bundle, env)
        assert handle.wait()
        assert handle.state is WarmUpState.FINISHED
        assert handle.report is not None and handle.report.imported == TOTAL


async def _export_sample(tmp_path: Path) -> Path:
    out = tmp_path / "sample.bundle"
    async with open_environment("warm", root=tmp_path / "warm-root") as env:
        for namespace, items in sample_entries().items():
            await env.storage(namespace).insert_many(items.items())
        await export_bundle(env, out, name="H100 Linux", version="1")
    return out


def test_warmenv_stats_shows_how_the_last_warm_up_ended(tmp_path: Path, root: Path) -> None:
    bundle_path = anyio.run(_export_sample, tmp_path)
    corrupt_bundle(bundle_path)
    with open_blocking("svc", root=root) as env:
        assert blocking_warm_up(bundle_path, env).wait()
    command = [sys.executable, "-m", "warmenv", "stats", "--env", "svc", "--root", str(root)]
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "failed" in shown.stdout and "CorruptBundleError" in shown.stdout
    scripted = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60)
    (last, *_) = json.loads(scripted.stdout)["imports"]
    assert last["outcome"] == "failed" and last["source"] == str(bundle_path)


async def test_an_old_file_gains_the_imports_table_on_a_writable_open(root: Path) -> None:
    async with open_environment("old", root=root):
        pass
    with sqlite3.connect(root / "old.db") as conn:
        conn.execute("DROP TABLE imports")
    conn.close()
    async with open_environment("old", root=root) as env:
        assert (await env.statistics()).imports == []
    with sqlite3.connect(root / "old.db") as conn:
        assert conn.execute("SELECT count(*) FROM imports").fetchone() == (0,)
    conn.close()


@pytest.fixture
async def namespace_env(root: Path) -> AsyncIterator[Environment]:
    async with open_environment("ns", root=root) as env:
        yield env


async def test_a_warm_up_is_recorded_at_most_fifty_times(
    bundle_path: Path, namespace_env: Environment
) -> None:
    for _ in range(52):
        await warm_up(bundle_path, namespace_env, namespaces=[str(Namespace.raw("none"))]).wait()
    assert len((await namespace_env.statistics()).imports) == 50


async def test_a_keyword_no_import_takes_is_refused_at_the_call(tmp_path: Path) -> None:
    # The options are **ImportOptions: the refusal a written-out signature gave is kept,
    # at the call (a background warm-up's would otherwise only reach its log).
    async with open_environment("e", root=tmp_path) as env:
        with pytest.raises(TypeError, match=r"^warm_up\(\) got an unexpected keyword argument "):
            warm_up(tmp_path / "none.bundle", env, batchsize=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"^import_bundle\(\) got an unexpected keyword "):
            await import_bundle(tmp_path / "none.bundle", env, batchsize=1)  # type: ignore[call-arg]
        assert await env.namespaces() == []


def test_a_keyword_no_blocking_import_takes_is_refused_at_the_call(tmp_path: Path) -> None:
    from warmenv.blocking import import_bundle as blocking_import

    with open_blocking("e", root=tmp_path) as env:
        with pytest.raises(TypeError, match=r"^warm_up\(\) got an unexpected keyword argument "):
            blocking_warm_up(tmp_path / "none.bundle", env, batchsize=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"^import_bundle\(\) got an unexpected keyword "):
            blocking_import(tmp_path / "none.bundle", env, batchsize=1)  # type: ignore[call-arg]
