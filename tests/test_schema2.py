"""Schema version 2: a version-1 environment is upgraded in place, whole or not at all."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from warmenv import WarmenvWarning, open_environment
from warmenv.bundle.sqlite.schema import BUNDLE_VERSION, COLUMNS
from warmenv.persistence import Origin, Stored
from warmenv.persistence.sqlite.schema import ENTRY_COLUMNS, ENVIRONMENT_COLUMNS
from warmenv.persistence.sqlite.storage import SqliteStorage
from warmenv.persistence.sqlite.uris import read_only_uris

pytestmark = pytest.mark.anyio

# The 0.1 schema, as `git show 0b00651:src/warmenv/persistence/sqlite.py` wrote it.
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    namespace TEXT NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    origin INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
);
"""

V1_ENTRIES = {
    ("app/1/kernels", b"k1"): (b"local kernel", 0),
    ("app/1/kernels", b"k2"): (b"imported kernel", 1),
    ("app/2/configs", b"c"): (b"local config", 0),
    ("other/1", b"\x00\xff"): (b"\x01" * 5000, 1),
}


def build_v1(path: Path, rows: dict[tuple[str, bytes], tuple[bytes, int]], *, wal: bool) -> None:
    """A version-1 environment written as 0.1 wrote it, without warmenv."""
    conn = sqlite3.connect(path, isolation_level=None)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    for statement in V1_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT INTO meta (k, v) VALUES ('schema_version', '1')")
    conn.executemany(
        "INSERT INTO entries (namespace, key, value, origin) VALUES (?, ?, ?, ?)",
        [(ns, key, value, origin) for (ns, key), (value, origin) in rows.items()],
    )
    conn.close()


def file_state(path: Path) -> tuple[str, list[tuple[str, str]], int]:
    """(schema version, entries columns, entry count) as plain SQLite reads the file."""
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()[0]
        columns = [(r[1], r[2].upper()) for r in conn.execute("PRAGMA table_info(entries)")]
        count = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
    finally:
        conn.close()
    return str(version), columns, int(count)


@pytest.mark.parametrize("wal", [False, True], ids=["rollback-journal", "wal"])
async def test_a_version_1_file_built_by_hand_keeps_every_entry_and_origin(
    tmp_path: Path, wal: bool
) -> None:
    path = tmp_path / "old.db"
    build_v1(path, V1_ENTRIES, wal=wal)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an upgrade drops nothing, so it warns of nothing
        async with open_environment(file=path) as env:
            assert not env.in_memory and not env.read_only
            for (namespace, key), (value, origin) in V1_ENTRIES.items():
                storage = env.storage(namespace)
                assert isinstance(storage, SqliteStorage)
                assert await storage.get(key) == value
                info = await storage.info(key)
                assert info is not None
                assert (info.origin, info.written_at, info.cost, info.bundle) == (
                    Origin(origin),
                    None,
                    None,
                    None,
                )
            assert [(s.namespace, s.entries) for s in await env.namespaces()] == [
                ("app/1/kernels", 2),
                ("app/2/configs", 1),
                ("other/1", 1),
            ]
            new = env.storage("app/1/kernels")
            assert await new.insert(b"fresh", b"v", cost=2.0) == Stored()
            info = await new.info(b"fresh")
            assert info is not None and info.written_at is not None and info.cost == 2.0
    assert file_state(path) == ("2", ENVIRONMENT_COLUMNS, len(V1_ENTRIES) + 1)


async def test_an_upgraded_file_opens_again_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    build_v1(path, V1_ENTRIES, wal=True)
    async with open_environment(file=path):
        pass
    conn = sqlite3.connect(path)
    upgraded_at = conn.execute("SELECT v FROM meta WHERE k = 'upgraded_at'").fetchone()
    conn.close()
    async with open_environment(file=path) as env:
        assert await env.storage("app/1/kernels").get(b"k2") == b"imported kernel"
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT v FROM meta WHERE k = 'upgraded_at'").fetchone() == upgraded_at
    conn.close()


async def test_a_fresh_environment_is_created_at_version_2(tmp_path: Path) -> None:
    async with open_environment(file=tmp_path / "new.db") as env:
        await env.storage("a/1").insert(b"k", b"v")
    assert file_state(tmp_path / "new.db") == ("2", ENVIRONMENT_COLUMNS, 1)


async def test_a_newer_schema_is_left_untouched_and_the_environment_runs_in_memory(
    tmp_path: Path,
) -> None:
    path = tmp_path / "future.db"
    build_v1(path, V1_ENTRIES, wal=False)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET v = '3' WHERE k = 'schema_version'")
    conn.commit()
    conn.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.warns(WarmenvWarning, match="newer warmenv.*upgrade warmenv"):
        async with open_environment(file=path) as env:
            assert env.in_memory
            assert await env.storage("app/1/kernels").get(b"k1") is None
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


async def test_a_bundle_opened_as_an_environment_is_read_and_never_upgraded(
    tmp_path: Path,
) -> None:
    from warmenv.bundle import export_bundle

    async with open_environment(file=tmp_path / "src.db") as source:
        await source.storage("app/1/kernels").insert(b"k", b"v")
        out = tmp_path / "b.bundle"
        await export_bundle(source, out, name="b", version="1", format="sqlite")
    before = hashlib.sha256(out.read_bytes()).hexdigest()
    async with open_environment(file=out) as env:
        assert env.read_only
        assert await env.storage("app/1/kernels").get(b"k") == b"v"
        info = await env.storage("app/1/kernels").info(b"k")
        assert info is not None and info.origin == Origin.IMPORTED and info.written_at is None
    assert hashlib.sha256(out.read_bytes()).hexdigest() == before
    assert file_state(out)[:2] == (BUNDLE_VERSION, COLUMNS[2])


# --- killed half-way ----------------------------------------------------------------

_CHILD = """
import os, signal, sys
import anyio
from warmenv import open_environment
from warmenv.persistence.sqlite import schema

path, kill_after, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kill_after >= 0:  # a SIGKILL after that many statements of the upgrade, inside it
    executed = 0
    real = schema.upgrade_1_to_2

    def upgrade(conn):
        class Killing:
            def execute(self, *args):
                global executed
                if executed == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                executed += 1
                return conn.execute(*args)
        real(Killing())

    schema.upgrade_1_to_2 = upgrade

async def main():
    print("ready", flush=True)
    async with open_environment(file=path):
        pass
    print("done", flush=True)

if backend == "uvloop":
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
else:
    anyio.run(main, backend=backend)
"""

BIG = 200_000


_LOOPS = ["asyncio", *(["uvloop"] if importlib.util.find_spec("uvloop") else []), "trio"]


@pytest.fixture(params=_LOOPS)
def loop_name(request: pytest.FixtureRequest) -> str:
    """The event loop the child process opens the environment on."""
    return str(request.param)


@pytest.fixture(scope="module")
def big_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in V1_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT INTO meta (k, v) VALUES ('schema_version', '1')")
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO entries SELECT 'app/1/ns' || (i % 7), CAST(printf('%08d', i) AS BLOB), "
        "randomblob(64), i % 2 FROM n",
        (BIG - 1,),
    )
    conn.close()
    return path


def check_whole(path: Path) -> str:
    """The file is version 1 or version 2, each complete; which one."""
    version, columns, count = file_state(path)
    assert (version, columns) in (("1", ENTRY_COLUMNS), ("2", ENVIRONMENT_COLUMNS))
    assert count == BIG
    conn = sqlite3.connect(path)
    origins = conn.execute("SELECT origin, count(*) FROM entries GROUP BY origin").fetchall()
    conn.close()
    assert origins == [(0, BIG // 2), (1, BIG // 2)]
    return version


def run_child(path: Path, kill_after: int, backend: str) -> subprocess.Popen[str]:
    """A process opening `path` on the event loop `backend` (asyncio, uvloop, trio)."""
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(kill_after), backend],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("kill_after", range(6))
def test_a_sigkill_inside_the_upgrade_leaves_version_1_whole(
    big_v1: Path, tmp_path: Path, kill_after: int, loop_name: str
) -> None:
    path = tmp_path / "e.db"
    shutil.copyfile(big_v1, path)
    with run_child(path, kill_after, loop_name) as child:
        out, _ = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, out
    assert check_whole(path) == "1"


def test_a_sigkill_at_a_random_moment_of_opening_leaves_version_1_or_2_never_between(
    big_v1: Path, tmp_path: Path, loop_name: str
) -> None:
    # How long opening (and upgrading) takes, so the kills land across it.
    path = tmp_path / "calibrate.db"
    shutil.copyfile(big_v1, path)
    with run_child(path, -1, loop_name) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        started = time.perf_counter()
        assert child.stdout.readline() == "done\n"
        span = time.perf_counter() - started
        child.wait(timeout=60)
    assert check_whole(path) == "2"

    rng = random.Random(11)
    seen = []
    for trial in range(6):
        path = tmp_path / f"trial{trial}.db"
        shutil.copyfile(big_v1, path)
        with run_child(path, -1, loop_name) as child:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
            time.sleep(rng.uniform(0, span * 1.2))  # the kill's moment, not a synchronisation
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
        seen.append(check_whole(path))

    # Whatever state each kill left, warmenv opens it and finds every entry.
    async def reopen() -> int:
        async with open_environment(file=path) as env:
            return sum(s.entries for s in await env.namespaces())

    import anyio

    assert anyio.run(reopen) == BIG


# --- reading a file that is not written: what is beside it decides how -------------


def _wal_file(tmp_path: Path) -> Path:
    path = tmp_path / "e.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    return path


def test_a_wal_file_with_nothing_beside_it_is_read_as_immutable(tmp_path: Path) -> None:
    # SQLite removes a -wal only after checkpointing it: the main file holds every commit.
    path = _wal_file(tmp_path)
    assert read_only_uris(path) == [f"{path.resolve().as_uri()}?immutable=1"]


def test_a_wal_file_with_its_wal_and_shm_is_read_through_them(tmp_path: Path) -> None:
    path = _wal_file(tmp_path)
    (tmp_path / "e.db-wal").write_bytes(b"\0" * 64)
    (tmp_path / "e.db-shm").write_bytes(b"\0" * 64)
    assert read_only_uris(path) == [f"{path.resolve().as_uri()}?mode=ro"]


def test_a_wal_with_commits_and_no_shm_is_refused_rather_than_read_stale(tmp_path: Path) -> None:
    path = _wal_file(tmp_path)
    (tmp_path / "e.db-wal").write_bytes(b"\0" * 64)
    with pytest.raises(sqlite3.OperationalError, match="no -shm file"):
        read_only_uris(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.db", "e.db-wal"]


def test_a_file_with_a_rollback_journal_is_never_read_as_immutable(tmp_path: Path) -> None:
    # immutable=1 ignores a hot journal and would read the half-written main file.
    path = tmp_path / "d.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    (tmp_path / "d.db-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + b"\0" * 504)
    assert read_only_uris(path) == [f"{path.resolve().as_uri()}?mode=ro"]


def test_a_spent_journal_beside_a_wal_file_does_not_make_it_read_through_a_new_shm(
    tmp_path: Path,
) -> None:
    # A journal whose header is zeroed (what PERSIST leaves) is not hot: SQLite rolls
    # nothing back. Read mode=ro, a WAL file in a writable directory would get a -wal
    # and a -shm created beside it by a reader who may not write it.
    path = _wal_file(tmp_path)
    (tmp_path / "e.db-journal").write_bytes(b"\0" * 512)
    assert read_only_uris(path) == [f"{path.resolve().as_uri()}?immutable=1"]


def test_a_spent_journal_beside_a_rollback_file_is_still_read_under_its_locks(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    (tmp_path / "d.db-journal").write_bytes(b"\0" * 512)
    assert read_only_uris(path) == [f"{path.resolve().as_uri()}?mode=ro"]


def test_a_fifo_at_the_journal_path_does_not_block_the_choice(tmp_path: Path) -> None:
    path = _wal_file(tmp_path)
    os.mkfifo(tmp_path / "e.db-journal")
    assert read_only_uris(path) == [f"{path.resolve().as_uri()}?immutable=1"]
