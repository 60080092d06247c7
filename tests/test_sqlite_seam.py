"""The SQLite seam (`warmenv._sqlite`): a worker thread per connection, a database in memory.

A connection runs each function whole on its own worker thread, never on the
event loop's, on asyncio (through public asyncio only: no aiosqlite internals)
as on trio; a database in memory runs on the caller's thread and needs no loop.
A closed connection's worker thread has ended by the time `close()` returns.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio

from warmenv import ClosedError, _sqlite, open_environment
from warmenv._sqlite import _worker
from warmenv.bundle import export_bundle, open_bundle
from warmenv.persistence import Insertion, Stored
from warmenv.persistence.memory import MemoryStorage

pytestmark = pytest.mark.anyio


def _thread_name(conn: sqlite3.Connection) -> str:
    return threading.current_thread().name


async def test_a_connection_runs_functions_on_its_own_worker_thread(tmp_path: Path) -> None:
    connection = await _sqlite.connect(str(tmp_path / "t.db"))
    try:
        assert await connection.run(_thread_name) == "warmenv-sqlite"
    finally:
        await connection.close()
    await connection.close()  # twice is fine


async def test_a_cancelled_caller_leaves_its_function_to_finish_whole(tmp_path: Path) -> None:
    connection = await _sqlite.connect(str(tmp_path / "t.db"))
    started, release = threading.Event(), threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE t (x)")
        started.set()
        release.wait(10)
        conn.execute("INSERT INTO t VALUES (1)")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(connection.run, slow)
            await anyio.to_thread.run_sync(started.wait)
            tg.cancel_scope.cancel()  # the caller leaves at once ...
        release.set()
        # ... and the next call queues behind the function, which ran to its end.
        rows = await connection.run(lambda conn: conn.execute("SELECT x FROM t").fetchall())
        assert rows == [(1,)]
    finally:
        release.set()
        await connection.close()


def test_a_memory_storage_is_made_outside_any_event_loop() -> None:
    storage = MemoryStorage("app/1/k")  # no loop runs here: nothing to bind to

    async def write() -> Insertion:
        return await storage.insert(b"k", b"v")

    async def read() -> bytes | None:
        return await storage.get(b"k")

    assert anyio.run(write) == Stored()
    assert anyio.run(read, backend="trio") == b"v"  # and any loop may use it after


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "warmenv-sqlite" and t.is_alive()}


async def test_no_worker_thread_outlives_a_closed_environment(tmp_path: Path) -> None:
    before = _workers()  # another test's, still ending: not this environment's
    async with open_environment("seam", root=tmp_path) as env:
        await env.storage("app/1/k").insert(b"k", b"v")
        assert _workers() - before, "the environment's worker thread is running"
    assert not _workers() - before


async def test_no_worker_thread_outlives_a_closed_bundle(tmp_path: Path) -> None:
    async with open_environment("seam", root=tmp_path) as env:
        await env.storage("app/1/k").insert(b"k", b"v")
        await export_bundle(env, tmp_path / "b.bundle", name="b", version="1")
    before = _workers()
    async with open_bundle(tmp_path / "b.bundle") as bundle:
        assert await bundle.get("app/1/k", b"k") == b"v"
        assert _workers() - before, "the bundle's worker thread is running"
    assert not _workers() - before


async def test_a_connection_that_fails_to_open_leaves_no_worker_thread(tmp_path: Path) -> None:
    before = _workers()
    with pytest.raises(sqlite3.OperationalError):
        await _sqlite.connect(f"{(tmp_path / 'absent.db').as_uri()}?mode=ro", uri=True)
    assert not _workers() - before


async def test_a_started_function_runs_while_the_caller_awaits_something_else(
    tmp_path: Path,
) -> None:
    """`start` gives the function to the worker at once; its answer is awaited later."""
    connection = await _sqlite.connect(str(tmp_path / "t.db"))
    ran = threading.Event()

    def read(conn: sqlite3.Connection) -> str:
        ran.set()
        return threading.current_thread().name

    try:
        pending = connection.start(read)
        await anyio.to_thread.run_sync(ran.wait)  # ran before anyone awaited its answer
        assert await pending.result() == "warmenv-sqlite"
    finally:
        await connection.close()


@contextmanager
def hops_back() -> Iterator[list[str]]:
    """The worker threads' hops back to the running loop, while the block runs.

    Each backend's one way in from another thread, watched: trio's token's
    `run_sync_soon` and asyncio's (and uvloop's) `call_soon_threadsafe`. Only
    calls made on a connection's worker thread are listed (anyio's threads
    use them too).
    """
    hops: list[str] = []

    def watched(hop: Callable[..., Any]) -> Callable[..., Any]:
        def hop_back(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name == _worker.THREAD_NAME:
                hops.append(threading.current_thread().name)
            return hop(*args, **kwargs)

        return hop_back

    with pytest.MonkeyPatch.context() as patch:
        if sniffio.current_async_library() == "trio":
            import trio

            token = trio.lowlevel.current_trio_token()
            original = type(token).run_sync_soon
            patch.setattr(type(token), "run_sync_soon", watched(original))
        else:
            loop = asyncio.get_running_loop()
            patch.setattr(loop, "call_soon_threadsafe", watched(loop.call_soon_threadsafe))
        yield hops


async def test_an_answer_there_before_it_is_awaited_wakes_no_loop(tmp_path: Path) -> None:
    """A started function that ran while its caller awaited something else (a local
    read beside a Redis round trip) hands its answer over without a hop back to the
    loop; a caller already waiting for its answer is woken by one."""
    connection = await _sqlite.connect(str(tmp_path / "t.db"))
    release = threading.Event()
    try:
        with hops_back() as hops:
            pending = connection.start(lambda conn: 7)
            await connection.run(lambda conn: None)  # after the one started: it has answered
            assert hops == [_worker.THREAD_NAME]  # the `run`'s answer, and only it
            assert await pending.result() == 7
            assert hops == [_worker.THREAD_NAME]

            waiting = connection.start(lambda conn: release.wait(10))
            async with anyio.create_task_group() as tg:
                tg.start_soon(_set_once_all_wait, release)
                assert await waiting.result() is True  # awaited before the function ran
            assert hops == [_worker.THREAD_NAME] * 2
    finally:
        release.set()
        await connection.close()


async def _set_once_all_wait(event: threading.Event) -> None:
    await anyio.wait_all_tasks_blocked()
    event.set()


async def test_a_started_function_s_exception_is_raised_by_its_result(tmp_path: Path) -> None:
    connection = await _sqlite.connect(str(tmp_path / "t.db"))
    try:
        pending = connection.start(lambda conn: conn.execute("SELECT * FROM missing"))
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await pending.result()
    finally:
        await connection.close()


async def test_a_started_function_whose_answer_is_never_awaited_still_runs_whole(
    tmp_path: Path,
) -> None:
    """A caller cancelled before it awaits the answer: dropped, the failure too, and no
    warning (warnings are errors here), while the function still runs to its end."""
    connection = await _sqlite.connect(str(tmp_path / "t.db"))
    try:
        await connection.run(lambda conn: conn.execute("CREATE TABLE t (x)"))
        connection.start(lambda conn: conn.execute("INSERT INTO t VALUES (1)"))
        connection.start(lambda conn: conn.execute("SELECT * FROM missing"))
        with anyio.CancelScope() as scope:
            pending = connection.start(lambda conn: conn.execute("INSERT INTO t VALUES (2)"))
            scope.cancel()
            await pending.result()  # cancelled: the answer is never taken
        rows = await connection.run(lambda conn: conn.execute("SELECT x FROM t").fetchall())
        assert rows == [(1,), (2,)]
    finally:
        await connection.close()


async def test_starting_on_a_closed_connection_raises_at_once(tmp_path: Path) -> None:
    connection = await _sqlite.connect(str(tmp_path / "t.db"))
    await connection.close()
    with pytest.raises(ClosedError):
        connection.start(_thread_name)


async def test_a_database_in_memory_runs_a_started_function_at_once() -> None:
    connection, _ = _sqlite.open_memory(lambda conn: None)
    pending = connection.start(lambda conn: conn.execute("SELECT 7").fetchone()[0])
    failing = connection.start(lambda conn: conn.execute("SELECT * FROM missing"))
    assert await pending.result() == 7
    with pytest.raises(sqlite3.OperationalError):
        await failing.result()
    await connection.close()
    with pytest.raises(ClosedError):
        connection.start(_thread_name)
