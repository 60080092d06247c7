from __future__ import annotations

import json
import re
import sqlite3
import textwrap
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

import warmenv
import warmenv.blocking
from helpers import json_lines, run_python, unprivileged_user
from warmenv import (
    ClosedError,
    Environment,
    Failed,
    MemoryStorage,
    Namespace,
    Purged,
    Stored,
    WarmenvWarning,
    activate,
    active,
    open_environment,
    set_root,
)
from warmenv.environment import Degraded, Fallback
from warmenv.persistence import CacheMode, JsonCodec, Origin, SqliteStorage, Store
from warmenv.persistence.sqlite.opening import APPLICATION_ID

pytestmark = pytest.mark.anyio

NS = Namespace("app", "kernels", version="1")


async def test_an_environment_is_one_database_under_the_root(root: Path) -> None:
    async with open_environment("h100", root=root) as env:
        assert env.name == "h100"
        assert env.path == root / "h100.db"
        assert isinstance(env.storage(NS), SqliteStorage)
    assert (root / "h100.db").is_file()


async def test_the_database_uses_wal_and_records_the_schema_version(root: Path) -> None:
    async with open_environment("e", root=root):
        pass
    with sqlite3.connect(root / "e.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone() == ("2",)


async def test_entries_survive_close_and_reopen(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        await env.storage(NS).insert(b"k", b"v")
    async with open_environment("e", root=root) as env:
        assert await env.storage(NS).get(b"k") == b"v"


async def test_two_environments_under_one_root_never_see_each_other(root: Path) -> None:
    async with open_environment("a", root=root) as a, open_environment("b", root=root) as b:
        await a.storage(NS).insert(b"k", b"from a")
        assert await b.storage(NS).get(b"k") is None
        assert await b.namespaces() == []


async def test_namespaces_lists_each_namespace_with_counts(env: Environment) -> None:
    await env.storage(NS).insert_many([(b"a", b"12"), (b"b", b"3")])
    await env.storage("other/1/x").insert(b"c", b"4")
    summaries = await env.namespaces()
    assert [(s.namespace, s.entries, s.bytes) for s in summaries] == [
        ("app/1/kernels", 2, 5),
        ("other/1/x", 1, 2),
    ]


async def test_a_closed_environment_raises_when_used(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        storage = env.storage(NS)
    with pytest.raises(ClosedError, match="closed"):
        env.storage(NS)
    with pytest.raises(ClosedError, match="closed"):
        await storage.get(b"k")


async def test_an_environment_reprs_as_what_it_describes_and_whether_it_is_closed(
    root: Path,
) -> None:
    async with open_environment("e", root=root) as env:
        assert repr(env) == f"<Environment: environment 'e' at {root / 'e.db'}>"
    assert repr(env) == f"<Environment: environment 'e' at {root / 'e.db'}, closed>"


async def test_an_environment_in_memory_says_so_in_its_repr(root: Path) -> None:
    (root / "e.db").mkdir(parents=True)  # a directory where the file would be: memory
    with pytest.warns(WarmenvWarning):
        async with open_environment("e", root=root) as env:
            assert repr(env) == f"<Environment: environment 'e' at {root / 'e.db'} (in memory)>"


async def test_stores_and_storages_repr_as_their_namespace_in_their_environment(
    root: Path,
) -> None:
    where = f"SQLite {root / 'e.db'} [{NS}]"
    async with open_environment("e", root=root) as env:
        store = await env.store(NS)
        assert repr(store) == f"<Store: {where}>"
        assert repr(env.storage(NS)) == f"<SqliteStorage: {where}>"
    assert repr(store) == f"<Store: {where}, closed>"
    assert repr(MemoryStorage(NS)) == f"<MemoryStorage: memory [{NS}]>"


async def test_what_a_closed_environment_refuses_names_the_environment(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        store = await env.store(NS)
        storage = env.storage(NS)
    said = f"environment 'e' at {root / 'e.db'} is closed; open it again to use it"
    closed = f"^{re.escape(said)}$"
    for use in (
        lambda: store.get("k"),
        lambda: store.insert("k", 1),
        lambda: store.purge_key("k"),
        lambda: storage.get(b"k"),
        lambda: storage.insert(b"k", b"v"),
        lambda: storage.summary(),
    ):
        with pytest.raises(ClosedError, match=closed):
            await use()


async def test_a_store_of_a_closed_environment_raises_on_a_key_it_held(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        store = await env.store(NS)
        await store.insert("m", 1)
        assert await store.get("m") == 1
    with pytest.raises(ClosedError, match="closed"):
        await store.get("m")
    with pytest.raises(ClosedError, match="closed"):
        await store.get_or_compute("m", anyio.sleep, 0)


_WAYS_TO_A_STORE: dict[str, Callable[[Environment], Awaitable[Store[Any, Any]]]] = {
    "env.store": lambda env: env.store(NS),
    "Store.open": lambda env: Store.open(env.storage(NS)),
    "Store.open, lazy": lambda env: Store.open(env.storage(NS), mode=CacheMode.LAZY),
    "Store.open over the database": lambda env: Store.open(env.database.storage(str(NS))),
    "Store()": lambda env: _made(Store(env.storage(NS), JsonCodec(), CacheMode.LAZY)),
}


async def _made(store: Store[Any, Any]) -> Store[Any, Any]:
    return store


@pytest.mark.parametrize("way", _WAYS_TO_A_STORE)
async def test_every_store_of_a_closed_environment_raises_on_a_key_it_held(
    any_env: Environment, way: str
) -> None:
    # Store.open(env.storage(ns)) kept answering from memory after its environment closed.
    store = await _WAYS_TO_A_STORE[way](any_env)
    await store.insert("m", 1)
    assert await store.get("m") == 1
    await any_env.close()
    with pytest.raises(ClosedError, match="closed"):
        await store.get("m")
    with pytest.raises(ClosedError, match="closed"):
        await store.get_or_compute("m", anyio.sleep, 0)


async def test_a_store_made_after_its_environment_closed_holds_nothing(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        storage = env.storage(NS)
        await storage.insert(b'"m"', b"1")
    store = Store(storage, JsonCodec(), CacheMode.LAZY)
    with pytest.raises(ClosedError, match="closed"):
        await store.get("m")


@pytest.mark.parametrize("bad", ["", "a/b", "..", "white space", "ü"])
async def test_invalid_environment_names_raise_value_error(root: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid environment name"):
        async with open_environment(bad, root=root):
            pass


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"name": 123}, "an environment name is a str, got int 123"),
        ({"name": b"e"}, "an environment name is a str, got bytes b'e'"),
        ({"name": "e", "root": 123}, "root must be a str or a path, got int 123"),
        ({"name": "e", "file": 123}, "file must be a str or a path, got int 123"),
    ],
)
async def test_an_argument_of_the_wrong_type_is_a_type_error_naming_it(
    arguments: dict[str, Any], said: str
) -> None:
    with pytest.raises(TypeError, match=f"^{re.escape(said)}$"):
        async with open_environment(**arguments):
            pass
    with pytest.raises(TypeError, match=f"^{re.escape(said)}$"):
        await anyio.to_thread.run_sync(partial(warmenv.blocking.open, **arguments))


async def test_file_opens_an_explicit_database(tmp_path: Path) -> None:
    async with open_environment(file=tmp_path / "explicit.db") as env:
        assert env.name == "explicit"
        await env.storage(NS).insert(b"k", b"v")
    assert (tmp_path / "explicit.db").is_file()


async def test_activate_and_set_root_choose_the_default(tmp_path: Path) -> None:
    set_root(tmp_path / "r")
    activate("chosen")
    assert active() == ("chosen", tmp_path / "r")
    async with open_environment() as env:
        assert env.path == tmp_path / "r" / "chosen.db"
    with pytest.raises(ValueError):
        activate("bad name")


async def test_the_default_comes_from_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMENV_ROOT", str(tmp_path / "cfg"))
    monkeypatch.setenv("WARMENV_ENVIRONMENT", "from-config")
    async with open_environment() as env:
        assert env.path == tmp_path / "cfg" / "from-config.db"


async def test_an_unknown_older_schema_of_our_own_file_is_dropped_and_rebuilt_with_one_warning(
    root: Path,
) -> None:
    # Ours by its mark; a file that is not (no application_id, not our exact
    # meta and schema) is refused and kept: tests/test_ownership.py.
    root.mkdir(parents=True)
    with sqlite3.connect(root / "old.db") as conn:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '0')")
        conn.execute("CREATE TABLE entries (namespace TEXT, key BLOB, value BLOB)")
        conn.execute("INSERT INTO entries VALUES ('app/1/kernels', x'01', x'02')")
    with pytest.warns(
        WarmenvWarning, match="schema version '0' is not one this warmenv reads"
    ) as caught:
        async with open_environment("old", root=root) as env:
            assert await env.namespaces() == []
            assert await env.storage(NS).insert(b"k", b"v") == Stored()
    assert len(caught) == 1
    async with open_environment("old", root=root) as env:  # no second warning
        assert await env.storage(NS).get(b"k") == b"v"


async def test_a_root_that_cannot_be_created_degrades_to_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(WarmenvWarning, match="in memory"):
        async with open_environment("e", root=blocker / "sub") as env:
            assert env.in_memory
            storage = env.storage(NS)
            assert isinstance(storage, MemoryStorage)
            assert await storage.insert(b"k", b"v") == Stored()
            assert await env.storage(NS).get(b"k") == b"v"
            assert [s.namespace for s in await env.namespaces()] == [str(NS)]


async def test_why_an_environment_fell_back_to_memory_is_a_value(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reason is known without the warning
        async with open_environment("e", root=blocker / "sub") as env:
            degraded = env.degraded
    assert degraded is not None and degraded.fallback is Fallback.MEMORY
    assert degraded.reason == f"{blocker} is not a directory"  # what is in the way, on disk


async def test_why_an_environment_opened_read_only_is_a_value(
    warm_env: Environment, tmp_path: Path
) -> None:
    from warmenv.bundle import export_bundle

    bundle_path = tmp_path / "warm.bundle"
    await export_bundle(warm_env, bundle_path, name="H100 Linux", version="1", format="sqlite")
    async with open_environment(file=bundle_path) as env:
        degraded = env.degraded
        assert env.read_only and not env.in_memory
    assert degraded == Degraded(
        Fallback.READ_ONLY,
        f"opening {bundle_path} for writing failed: it is a bundle, not an environment: "
        "import it instead",
    )


async def test_an_environment_opened_as_asked_is_not_degraded(env: Environment) -> None:
    assert env.degraded is None


async def test_an_environment_in_memory_evicts_by_the_rules_of_a_file(tmp_path: Path) -> None:
    # One implementation: the memory fallback runs the file's SQL (keep_versions by
    # newest written, a text namespace ending like a type tag included, then by size).
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with open_environment("e", root=blocker / "sub") as env:
            assert env.in_memory
            await env.storage("app/1/img <BLOB>").insert(b"k", b"v", written_at=1_000.0)
            await env.storage("app/2/img <BLOB>").insert(b"k", b"v", written_at=2_000.0)
            assert await env.gc(keep_versions=1) == Purged(1)
            listed = [(s.namespace, s.text) for s in await env.namespaces()]
            assert await env.vacuum() == (0, 0)
    assert listed == [("app/2/img <BLOB>", True)]


async def test_a_full_disk_is_reported_as_failed_and_reads_keep_working(env: Environment) -> None:
    storage = env.storage(NS)
    await storage.insert(b"kept", b"v")
    db = env.database
    assert db is not None
    pages = await db.run(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
    await db.run(lambda c: c.execute(f"PRAGMA max_page_count = {pages + 2}"))
    result = await storage.insert(b"big", b"x" * 100_000)
    assert isinstance(result, Failed)
    assert "full" in result.reason
    summary = await storage.insert_many((b"k%d" % i, b"y" * 10_000) for i in range(50))
    assert (summary.stored, summary.conflict, summary.failed) == (0, 0, 50)
    assert await storage.get(b"kept") == b"v"
    await db.run(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
    assert await storage.insert(b"big", b"x" * 100_000) == Stored()


async def test_cancelling_insert_many_leaves_all_or_none_of_it(env: Environment) -> None:
    items = [(b"%06d" % i, b"v" * 64) for i in range(20_000)]
    outcomes = set()
    for trial in range(8):
        storage = env.storage(Namespace("cancel", str(trial), version="1"))
        with anyio.move_on_after(trial * 0.004):
            await storage.insert_many(items)
        count = (await storage.summary()).entries
        assert count in (0, len(items))
        outcomes.add(count)
    assert outcomes  # at least one trial ran; each one was whole or empty


async def test_cancelling_insert_many_while_gathering_an_async_source_stores_nothing(
    env: Environment,
) -> None:
    storage = env.storage(NS)
    gathered = anyio.Event()

    async def slow_source() -> AsyncIterator[tuple[bytes, bytes]]:
        yield b"a", b"1"
        gathered.set()
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(storage.insert_many, slow_source())
        await gathered.wait()
        tg.cancel_scope.cancel()
    assert await storage.get(b"a") is None


_READ_ONLY_CHILD = textwrap.dedent(
    """
    import json, sys, warnings, anyio
    from warmenv import open_environment, Namespace, Failed
    warnings.simplefilter("ignore")

    async def main():
        async with open_environment("ro", root=sys.argv[1]) as env:
            storage = env.storage(Namespace("app", "kernels", version="1"))
            result = await storage.insert(b"new", b"x")
            print(json.dumps({
                "read_only": env.read_only,
                "in_memory": env.in_memory,
                "read": (await storage.get(b"k") or b"").decode(),
                "insert_failed": isinstance(result, Failed),
                "reason": getattr(result, "reason", ""),
                "many_failed": (await storage.insert_many([(b"a", b"b")])).failed,
            }))

    anyio.run(main, backend=sys.argv[2])
    """
)


async def test_a_database_in_a_read_only_directory_serves_reads_and_fails_writes(
    shared_tmp: Path, backend_name: str
) -> None:
    root = shared_tmp / "ro-root"
    async with open_environment("ro", root=root) as env:
        await env.storage(NS).insert(b"k", b"v")
    (root / "ro.db").chmod(0o444)
    root.chmod(0o555)
    child = run_python(_READ_ONLY_CHILD, str(root), backend_name, user=unprivileged_user())
    [report] = json_lines(child)
    assert isinstance(report, dict)
    assert report == {
        "read_only": True,
        "in_memory": False,
        "read": "v",
        "insert_failed": True,
        "reason": report["reason"],
        "many_failed": 1,
    }
    assert "readonly" in str(report["reason"]) or "read-only" in str(report["reason"])


async def test_a_read_only_file_in_a_writable_directory_is_read_and_left_alone(
    shared_tmp: Path, backend_name: str
) -> None:
    # SQLite would open it read-only behind a read-write open, and a mode=ro
    # connection makes -wal and -shm files there that it cannot remove.
    root = shared_tmp / "ro-file"
    async with open_environment("ro", root=root) as env:
        await env.storage(NS).insert(b"k", b"v")
    (root / "ro.db").chmod(0o444)
    root.chmod(0o1777)  # sticky: a root others may write without the bit is refused
    child = run_python(_READ_ONLY_CHILD, str(root), backend_name, user=unprivileged_user())
    [report] = json_lines(child)
    assert isinstance(report, dict)
    assert (report["read_only"], report["read"], report["insert_failed"]) == (True, "v", True)
    assert sorted(p.name for p in root.iterdir()) == ["ro.db"]


_LATE_READER_CHILD = textwrap.dedent(
    """
    import sys, warnings, anyio
    from warmenv import open_environment, Namespace
    warnings.simplefilter("ignore")

    async def main():
        async with open_environment("live", root=sys.argv[1]) as env:
            value = await env.storage(Namespace("app", "kernels", version="1")).get(b"late")
            print((value or b"").decode(), env.read_only)

    anyio.run(main, backend=sys.argv[2])
    """
)


async def test_a_reader_that_may_not_write_sees_commits_still_in_a_writers_wal(
    shared_tmp: Path, backend_name: str
) -> None:
    root = shared_tmp / "live"
    root.mkdir(mode=0o1777)
    root.chmod(0o1777)
    async with open_environment("live", root=root) as env:
        (root / "live.db").chmod(0o444)  # the writer (root) still writes; the reader may not
        await env.storage(NS).insert(b"late", b"committed")  # in the -wal, not checkpointed
        beside = sorted(p.name for p in root.iterdir())
        assert beside == ["live.db", "live.db-shm", "live.db-wal"]
        reader = partial(run_python, _LATE_READER_CHILD, str(root), backend_name)
        child = await anyio.to_thread.run_sync(partial(reader, user=unprivileged_user()))
        assert child.returncode == 0, child.stderr
        assert child.stdout.split() == ["committed", "True"]
        assert sorted(p.name for p in root.iterdir()) == beside


_UNWRITABLE_CHILD = textwrap.dedent(
    """
    import json, sys, warnings, anyio
    from warmenv import open_environment, Namespace, Stored

    async def main():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with open_environment("fresh", root=sys.argv[1]) as env:
                storage = env.storage(Namespace("app", "kernels", version="1"))
                stored = await storage.insert(b"k", b"v") == Stored()
                print(json.dumps({
                    "in_memory": env.in_memory,
                    "stored": stored,
                    "read": (await storage.get(b"k")).decode(),
                    "warnings": [str(w.message) for w in caught],
                }))

    anyio.run(main, backend=sys.argv[2])
    """
)


async def test_an_unwritable_root_degrades_to_memory_with_one_warning(
    shared_tmp: Path, backend_name: str
) -> None:
    root = shared_tmp / "locked"
    root.mkdir()
    root.chmod(0o555)
    child = run_python(_UNWRITABLE_CHILD, str(root), backend_name, user=unprivileged_user())
    [report] = json_lines(child)
    assert isinstance(report, dict)
    assert report["in_memory"] is True
    assert report["stored"] is True
    assert report["read"] == "v"
    assert len(report["warnings"]) == 1
    assert "in memory" in report["warnings"][0]
    assert not (root / "fresh.db").exists()


_WRITER_CHILD = textwrap.dedent(
    """
    import json, sys, anyio
    from warmenv import open_environment, Namespace, Stored, Conflict

    async def main():
        me = int(sys.argv[2])
        results = {}
        async with open_environment("shared", root=sys.argv[1]) as env:
            storage = env.storage(Namespace("app", "kernels", version="1"))
            for round in range(int(sys.argv[4])):
                for i in range(10):
                    key = b"shared-%d-%d" % (round, i)
                    r = await storage.insert(key, b"from-%d" % me)
                    results[key.decode()] = (
                        "from-%d" % me if isinstance(r, Stored) else r.existing.decode()
                        if isinstance(r, Conflict) else "FAILED " + r.reason
                    )
                own = [(b"own-%d-%d-%d" % (me, round, i), b"v") for i in range(50)]
                summary = await storage.insert_many(own)
                assert summary.stored == 50, summary
        print(json.dumps(results))

    anyio.run(main, backend=sys.argv[3])
    """
)


async def test_four_processes_writing_at_once_lose_nothing_and_agree_on_winners(
    root: Path, backend_name: str
) -> None:
    rounds = 5
    async with open_environment("shared", root=root):
        pass  # created up front so the children race on writes, not on creation

    async def child(me: int) -> dict[str, str]:
        completed = await anyio.to_thread.run_sync(
            lambda: run_python(_WRITER_CHILD, str(root), str(me), backend_name, str(rounds))
        )
        assert "locked" not in completed.stderr
        [seen] = json_lines(completed)
        assert isinstance(seen, dict)
        return seen

    views: list[dict[str, str]] = [{} for _ in range(4)]

    async def run(me: int) -> None:
        views[me] = await child(me)

    async with anyio.create_task_group() as tg:
        for me in range(4):
            tg.start_soon(run, me)

    async with open_environment("shared", root=root) as env:
        storage = env.storage(NS)
        stored = {k.decode(): v.decode() async for k, v in storage.scan()}
    shared = {k: v for k, v in stored.items() if k.startswith("shared-")}
    own = [k for k in stored if k.startswith("own-")]
    assert len(shared) == rounds * 10
    assert len(own) == 4 * rounds * 50
    for view in views:
        assert view == shared  # every process saw the one value that won
    assert not any(v.startswith("FAILED") for v in shared.values())
    assert json.dumps(shared)  # the winners are plain values, not errors


async def test_the_package_exports_the_persistence_names() -> None:
    for name in ("open_environment", "Environment", "Store", "Namespace", "Origin"):
        assert hasattr(warmenv, name)
    assert int(Origin.LOCAL) == 0
    assert int(Origin.IMPORTED) == 1
