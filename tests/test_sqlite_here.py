"""Reads on the calling thread (`_sqlite._here.Readers`): pooled, read-only, per process."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import anyio.to_thread
import pytest

from helpers import run_python
from warmenv import ClosedError, _sqlite
from warmenv._sqlite._here import IDLE_KEPT, Readers


def _database(tmp_path: Path) -> Path:
    path = tmp_path / "here.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
    return path


def _count(conn: sqlite3.Connection) -> int:
    count: int = conn.execute("SELECT count(*) FROM t").fetchone()[0]
    return count


class Opened:
    """A connector that remembers every connection it opened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections: list[sqlite3.Connection] = []

    def __call__(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.connections.append(conn)
        return conn

    def still_open(self) -> int:
        alive = 0
        for conn in self.connections:
            try:
                conn.total_changes  # noqa: B018 (raises once closed)
            except sqlite3.ProgrammingError:
                continue
            alive += 1
        return alive


@pytest.mark.anyio
async def test_a_read_here_sees_what_the_worker_committed(tmp_path: Path) -> None:
    path = _database(tmp_path)
    connection = await _sqlite.connect(str(path))
    try:
        await connection.run(lambda conn: conn.execute("INSERT INTO t VALUES (2)"))
        assert await anyio.to_thread.run_sync(connection.run_here, _count) == 2
    finally:
        await connection.close()
    with pytest.raises(ClosedError):
        connection.run_here(_count)


def test_a_read_here_cannot_write(tmp_path: Path) -> None:
    readers = Readers(Opened(_database(tmp_path)), "here.db")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        readers.run(lambda conn: conn.execute("INSERT INTO t VALUES (3)"))
    assert readers.run(_count) == 1
    readers.close()


def test_threads_one_after_another_share_one_connection(tmp_path: Path) -> None:
    opened = Opened(_database(tmp_path))
    readers = Readers(opened, "here.db")
    for _ in range(20):
        thread = threading.Thread(target=readers.run, args=(_count,))
        thread.start()
        thread.join(timeout=30)
    assert len(opened.connections) == 1
    readers.close()
    assert opened.still_open() == 0


def test_concurrent_readers_each_get_a_connection_and_only_a_few_stay_open(
    tmp_path: Path,
) -> None:
    opened = Opened(_database(tmp_path))
    readers = Readers(opened, "here.db")
    together = threading.Barrier(IDLE_KEPT + 4, timeout=30)

    def read(conn: sqlite3.Connection) -> int:
        together.wait()  # every thread holds its connection at once
        return _count(conn)

    threads = [threading.Thread(target=readers.run, args=(read,)) for _ in range(IDLE_KEPT + 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(opened.connections) == IDLE_KEPT + 4
    assert opened.still_open() == IDLE_KEPT
    readers.close()
    assert opened.still_open() == 0


def test_a_read_in_use_when_the_pool_closes_closes_its_connection_after(
    tmp_path: Path,
) -> None:
    opened = Opened(_database(tmp_path))
    readers = Readers(opened, "here.db")
    inside, closed = threading.Event(), threading.Event()

    def read(conn: sqlite3.Connection) -> int:
        inside.set()
        assert closed.wait(timeout=30)
        return _count(conn)

    results: list[int] = []
    thread = threading.Thread(target=lambda: results.append(readers.run(read)))
    thread.start()
    assert inside.wait(timeout=30)
    readers.close()
    closed.set()
    thread.join(timeout=30)
    assert results == [1]
    assert opened.still_open() == 0
    with pytest.raises(ClosedError):
        readers.run(_count)


_FORK = """
import os, sqlite3, sys
from warmenv import ClosedError
from warmenv._sqlite._here import Readers

readers = Readers(lambda: sqlite3.connect(sys.argv[1], check_same_thread=False), "here.db")
count = lambda conn: conn.execute("SELECT count(*) FROM t").fetchone()[0]
assert readers.run(count) == 1  # the parent holds an idle connection now
pid = os.fork()
if pid == 0:  # the child: exit 0 only if the read is refused
    try:
        readers.run(count)
    except ClosedError:
        os._exit(0)
    except BaseException:
        os._exit(2)
    os._exit(1)
_, status = os.waitpid(pid, 0)
assert readers.run(count) == 1  # the parent's pool is untouched
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_may_not_use_the_parents_connections(tmp_path: Path) -> None:
    # In a process of its own: forking this one, which runs threads, could deadlock.
    done = run_python(_FORK, str(_database(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
