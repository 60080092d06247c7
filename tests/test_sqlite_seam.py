"""The SQLite seam (`warmenv._sqlite`): a worker thread per connection, a database in memory.

A connection runs each function whole on its own worker thread, never on the
event loop's, on asyncio (through public asyncio only: no aiosqlite internals)
as on trio; a database in memory runs on the caller's thread and needs no loop.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

from warmenv import _sqlite
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
