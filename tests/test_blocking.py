"""warmenv.blocking: real threads, real files, one shared event-loop thread."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from helpers import run_python
from redis_server import RedisServer, tolerating_coredis_streams
from warmenv import (
    BytesCodec,
    CacheMode,
    ClosedError,
    Failed,
    Namespace,
    Origin,
    Purged,
    Stored,
    WarmenvError,
    open_environment,
)
from warmenv.blocking import (
    BlockingEnvironment,
    BlockingStore,
    EventLoopThreadError,
    export_bundle,
    import_bundle,
)
from warmenv.blocking import open_environment as open_blocking
from warmenv.bundle import (
    BundleFormat,
    Event,
    ExportReport,
    Finished,
    FlatBundle,
    ImportReport,
    Progress,
    Started,
)
from warmenv.persistence.explain import Explanation
from warmenv.persistence.sqlite.storage import SqliteStorage
from warmenv.persistence.statistics import EnvironmentStatistics

NS = Namespace("app", "blocking", version="1")


class TracingCodec:
    """JSON values, recording which thread decodes and how often each thread encodes a key."""

    def __init__(self) -> None:
        self.decoded_on: list[int] = []
        self.key_encodings: Counter[int] = Counter()
        self.changed = threading.Condition()

    def encode_key(self, key: str) -> bytes:
        with self.changed:
            self.key_encodings[threading.get_ident()] += 1
            self.changed.notify_all()
        return json.dumps(key).encode()

    def encode_value(self, value: dict[str, Any]) -> bytes:
        return json.dumps(value, sort_keys=True).encode()

    def decode_value(self, data: bytes) -> dict[str, Any]:
        self.decoded_on.append(threading.get_ident())
        decoded: dict[str, Any] = json.loads(data)
        return decoded

    def wait_for(self, threads: list[threading.Thread], encodings: int) -> None:
        """Until each thread in `threads` has encoded a key `encodings` times."""
        with self.changed:
            assert self.changed.wait_for(
                lambda: all(self.key_encodings[t.ident or 0] >= encodings for t in threads),
                timeout=30,
            )


@pytest.fixture
def env(root: Path) -> Iterator[BlockingEnvironment]:
    with open_blocking("test", root=root) as environment:
        yield environment


def in_threads(n: int, target: Callable[[], object]) -> tuple[list[threading.Thread], list[Any]]:
    """Start `n` threads running `target`; each result or exception lands in the list."""
    outcomes: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            outcome = target()
        except Exception as exc:
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for thread in threads:
        thread.start()
    return threads, outcomes


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "warmenv-blocking-loop"]


# --- stores --------------------------------------------------------------------


def test_a_blocking_store_gets_inserts_and_purges(env: BlockingEnvironment) -> None:
    store: BlockingStore[str, dict[str, int]] = env.store(NS)
    assert store.get("k") is None
    assert store.insert("k", {"block": 128}) == Stored()
    assert store.get("k") == {"block": 128}
    store.purge_key("k")
    assert store.get("k", "gone") == "gone"
    store.insert("a", {"x": 1})
    store.purge()
    assert env.store(NS).get("a") is None


def test_a_hit_is_answered_on_the_calling_thread(env: BlockingEnvironment) -> None:
    env.store(NS).insert("k", {"block": 128})
    codec = TracingCodec()
    store = env.store(NS, codec=codec)  # EAGER: loads (and decodes) on the loop thread
    loop_thread = loop_threads()[0].ident
    assert codec.decoded_on == [loop_thread]
    codec.decoded_on.clear()

    threads, outcomes = in_threads(4, lambda: store.get("k"))
    join(threads)

    assert outcomes == [{"block": 128}] * 4
    assert sorted(codec.decoded_on) == sorted(t.ident or 0 for t in threads)


def test_hits_answer_str_keys_other_keys_and_containers(env: BlockingEnvironment) -> None:
    env.store(NS).insert("a", {"x": 1})
    env.store(NS).insert("b", [2])
    env.store(NS).insert(1, "int key")
    store: BlockingStore[object, object] = env.store(NS)
    assert store.get("a") == {"x": 1}
    assert store.get("b") == [2]
    assert store.get(1) == "int key"
    assert store.get_or_compute("a", lambda: {"never": 0}) == {"x": 1}
    assert store.get("c", "default") == "default"


def test_a_miss_reads_through_to_entries_written_after_the_store_opened(
    env: BlockingEnvironment,
) -> None:
    store: BlockingStore[str, int] = env.store(NS)
    env.store(NS).insert("late", 7)  # another store, as another process would
    assert store.get("late") == 7


def test_a_mutated_value_does_not_change_what_the_next_caller_gets(
    env: BlockingEnvironment,
) -> None:
    store: BlockingStore[str, dict[str, list[int]]] = env.store(NS)
    store.insert("k", {"sizes": [1]})
    got = store.get("k")
    assert got is not None
    got["sizes"].append(2)
    assert store.get("k") == {"sizes": [1]}


def test_get_or_compute_runs_fn_on_the_calling_thread_with_its_arguments(
    env: BlockingEnvironment,
) -> None:
    store: BlockingStore[str, str] = env.store(NS)
    ran_on: list[int] = []

    def tune(key: str) -> str:
        ran_on.append(threading.get_ident())
        return f"tuned {key}"

    results = {key: store.get_or_compute(key, tune, key) for key in ("a", "b", "c")}

    assert results == {"a": "tuned a", "b": "tuned b", "c": "tuned c"}
    assert ran_on == [threading.get_ident()] * 3
    assert store.get_or_compute("a", tune, "a") == "tuned a"
    assert len(ran_on) == 3


def test_get_or_compute_passes_keyword_arguments_of_any_name_to_fn(
    env: BlockingEnvironment,
) -> None:
    store: BlockingStore[str, str] = env.store(NS)
    calls: list[tuple[object, ...]] = []

    def tune(size: int, *, key: str, fn: str = "f") -> str:
        calls.append((size, key, fn))
        return f"{size}-{key}-{fn}"

    assert store.get_or_compute("a", tune, 3, key="k", fn="g") == "3-k-g"
    assert store.get_or_compute("b", tune, size=4, key="j") == "4-j-f"
    assert store.get_or_compute("a", tune, 9, key="other") == "3-k-g"  # a hit
    assert calls == [(3, "k", "g"), (4, "j", "f")]


def test_a_stored_none_is_a_value_not_recomputed(env: BlockingEnvironment) -> None:
    store: BlockingStore[str, None] = env.store(NS)
    runs: list[str] = []
    assert store.get_or_compute("k", runs.append, "k") is None
    assert store.get_or_compute("k", runs.append, "k") is None
    assert runs == ["k"]


def test_eight_threads_asking_one_missing_key_compute_it_once(env: BlockingEnvironment) -> None:
    codec = TracingCodec()
    store = env.store(NS, codec=codec)
    started, release = threading.Event(), threading.Event()
    computes: list[int] = []

    def tune(key: str) -> dict[str, Any]:
        computes.append(threading.get_ident())
        started.set()
        assert release.wait(timeout=30)
        return {"key": key}

    first, outcomes = in_threads(1, lambda: store.get_or_compute("k", tune, "k"))
    assert started.wait(timeout=30)
    others, more = in_threads(7, lambda: store.get_or_compute("k", tune, "k"))
    # Twice: once to look in memory, once on the way to the run (where a store
    # without single flight would call tune).
    codec.wait_for(others, encodings=2)
    release.set()
    join(first + others)

    assert computes == [first[0].ident]
    assert outcomes + more == [{"key": "k"}] * 8
    assert len({id(value) for value in outcomes + more}) == 8  # each thread its own copy


def test_a_failed_compute_raises_in_every_waiting_thread_and_the_next_call_reruns(
    env: BlockingEnvironment,
) -> None:
    codec = TracingCodec()
    store = env.store(NS, codec=codec)
    started, release = threading.Event(), threading.Event()
    computes: list[int] = []

    def tune(key: str) -> dict[str, Any]:
        computes.append(threading.get_ident())
        started.set()
        assert release.wait(timeout=30)
        raise ValueError(f"no kernel fits {key}")

    first, outcomes = in_threads(1, lambda: store.get_or_compute("k", tune, "k"))
    assert started.wait(timeout=30)
    others, more = in_threads(7, lambda: store.get_or_compute("k", tune, "k"))
    codec.wait_for(others, encodings=2)
    release.set()
    join(first + others)

    assert len(computes) == 1
    assert len(outcomes + more) == 8
    assert all(isinstance(o, ValueError) and str(o) == "no kernel fits k" for o in outcomes + more)
    assert store.get_or_compute("k", lambda: {"second": True}) == {"second": True}


def test_a_compute_asking_for_its_own_key_raises_instead_of_waiting_forever(
    env: BlockingEnvironment,
) -> None:
    store: BlockingStore[str, int] = env.store(NS)

    def recurse() -> int:
        return store.get_or_compute("k", recurse) + 1

    with pytest.raises(WarmenvError, match="while computing that very key"):
        store.get_or_compute("k", recurse)
    assert store.get_or_compute("k", lambda: 1) == 1


def test_memoize_keys_sync_calls_by_their_arguments(env: BlockingEnvironment) -> None:
    store: BlockingStore[list[object], int] = env.store(NS)
    calls: list[tuple[int, int]] = []

    @store.memoize
    def add(a: int, b: int = 2) -> int:
        calls.append((a, b))
        return a + b

    assert [add(1), add(1, b=2), add(1, 3), add(1)] == [3, 3, 4, 3]
    assert calls == [(1, 2), (1, 3)]
    assert store.get([1, 2]) == 3


def test_memoize_names_an_argument_that_cannot_be_part_of_a_key(
    env: BlockingEnvironment,
) -> None:
    store: BlockingStore[list[object], int] = env.store(NS)

    @store.memoize
    def size(shape: object) -> int:
        return 1

    with pytest.raises(TypeError, match="'shape'"):
        size({1, 2})


def test_memoize_keys_calls_by_their_arguments_whatever_the_codec(
    env: BlockingEnvironment,
) -> None:
    # As Store.memoize does: the key is the arguments' JSON list, not the
    # codec's encoding (it refused any codec but JsonCodec and BytesCodec).
    store = env.store(NS, codec=TracingCodec())
    calls: list[tuple[int, int]] = []

    @store.memoize
    def tune(a: int, b: int = 2) -> dict[str, int]:
        calls.append((a, b))
        return {"sum": a + b}

    assert [tune(1), tune(1, b=2), tune(1, 3)] == [{"sum": 3}, {"sum": 3}, {"sum": 4}]
    assert calls == [(1, 2), (1, 3)]
    raw: BlockingStore[bytes, bytes] = env.store(NS, codec=BytesCodec())
    assert raw.get(b"[1,2]") == b'{"sum": 3}'


def test_import_bundle_takes_an_open_bundle_as_the_async_form_does(
    root: Path, tmp_path: Path
) -> None:
    with open_blocking("warm", root=root) as warm:
        warm.store(NS).insert("k", {"block": 128})
        export_bundle(warm, tmp_path / "b.bundle", name="b", version="1", format=BundleFormat.FLAT)
    bundle = FlatBundle.from_bytes((tmp_path / "b.bundle").read_bytes())
    with open_blocking("cold", root=root) as cold:
        report = import_bundle(bundle, cold)
        assert report.complete
        assert cold.store(NS).get("k") == {"block": 128}


def test_memoize_with_a_key_function(env: BlockingEnvironment) -> None:
    store: BlockingStore[str, str] = env.store(NS)

    def by_name(name: str, *, punctuation: str = "!") -> str:
        return name

    @store.memoize(key=by_name)
    def greet(name: str, *, punctuation: str = "!") -> str:
        return f"hello {name}{punctuation}"

    assert greet("ada") == "hello ada!"
    assert greet("ada", punctuation="?") == "hello ada!"
    assert store.get("ada") == "hello ada!"


def test_a_miss_is_read_on_the_calling_thread_and_then_held(env: BlockingEnvironment) -> None:
    writer = env.store(NS)
    for i in range(20):
        writer.insert(f"k{i}", {"i": i})
    codec = TracingCodec()
    store = env.store(NS, codec=codec, mode=CacheMode.LAZY)

    def read_all() -> list[object]:
        return [store.get(f"k{i}") for i in range(20)]

    threads, outcomes = in_threads(4, read_all)
    join(threads)

    assert outcomes == [[{"i": i} for i in range(20)]] * 4
    assert set(codec.decoded_on) <= {t.ident for t in threads}  # never the loop thread
    assert len(store) == 20
    codec.decoded_on.clear()
    assert store.get("k3") == {"i": 3}
    assert codec.decoded_on == [threading.get_ident()]  # a hit, from memory


def test_threads_reading_through_at_once_each_get_every_value(env: BlockingEnvironment) -> None:
    writer: BlockingStore[str, list[int]] = env.store(NS)
    for i in range(200):
        writer.insert(f"k{i}", [i, i])
    store: BlockingStore[str, list[int]] = env.store(NS, mode=CacheMode.LAZY)

    def read_all() -> list[list[int] | None]:
        got = [store.get(f"k{i}") for i in range(200)]
        for value in got:
            assert value is not None
            value.append(-1)  # each thread's own copy
        return got

    threads, outcomes = in_threads(8, read_all)
    join(threads)

    assert outcomes == [[[i, i, -1] for i in range(200)]] * 8
    assert [store.get(f"k{i}") for i in range(200)] == [[i, i] for i in range(200)]


def test_a_read_that_a_purge_overtakes_is_not_held(
    env: BlockingEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.store(NS).insert("k", {"v": 1})
    store: BlockingStore[str, dict[str, int]] = env.store(NS, mode=CacheMode.LAZY)
    read, purged = threading.Event(), threading.Event()
    get_blocking = SqliteStorage.get_blocking

    def slow_read(storage: SqliteStorage, key: bytes) -> bytes | None:
        data = get_blocking(storage, key)
        read.set()
        assert purged.wait(timeout=30)
        return data

    monkeypatch.setattr(SqliteStorage, "get_blocking", slow_read)
    reader, outcomes = in_threads(1, lambda: store.get("k"))
    assert read.wait(timeout=30)
    store.purge_key("k")  # deletes while the reader holds what it read
    purged.set()
    join(reader)

    assert outcomes == [{"v": 1}]  # read before the delete: an answer of its time
    assert len(store) == 0  # but not held, to be served after the purge
    assert store.get("k") is None


def test_a_read_made_while_a_purge_runs_is_dropped_when_it_ends(
    env: BlockingEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.store(NS).insert("k", {"v": 1})
    store: BlockingStore[str, dict[str, int]] = env.store(NS, mode=CacheMode.LAZY)
    entered, gate = threading.Event(), threading.Event()
    purge_key = SqliteStorage.purge_key

    async def slow_purge(storage: SqliteStorage, key: bytes) -> Purged | Failed:
        entered.set()
        await anyio.to_thread.run_sync(gate.wait, 30)
        return await purge_key(storage, key)

    monkeypatch.setattr(SqliteStorage, "purge_key", slow_purge)
    purger, _ = in_threads(1, lambda: store.purge_key("k"))
    assert entered.wait(timeout=30)
    assert store.get("k") == {"v": 1}  # not deleted yet: read on this thread, and held
    gate.set()
    join(purger)

    assert len(store) == 0
    assert store.get("k") is None


def test_a_hot_value_is_each_threads_own_copy(env: BlockingEnvironment) -> None:
    value = {"tiles": [16, 32], "nested": {"deep": [1]}}
    env.store(NS).insert("k", value)
    store: BlockingStore[str, dict[str, Any]] = env.store(NS)

    def mutate_copies() -> None:
        for _ in range(200):
            got = store.get("k")
            assert got == value
            got["tiles"].append(64)
            got["nested"]["deep"].append(2)
            got["added"] = True

    threads, outcomes = in_threads(4, mutate_copies)
    join(threads)

    assert outcomes == [None] * 4
    assert set(store.store.held.hot) == {"k"}  # internal: the copies came from the hot set
    assert store.get("k") == value


def test_get_or_compute_hands_out_copies_of_a_hot_value(env: BlockingEnvironment) -> None:
    value = {"tiles": [16, 32], "nested": {"deep": [1]}}
    store: BlockingStore[str, dict[str, Any]] = env.store(NS)
    store.insert("k", value)

    def never() -> dict[str, Any]:
        raise AssertionError("a hit must not compute")

    for _ in range(256):  # the hot set takes it in along the way
        got = store.get_or_compute("k", never)
        assert got == value
        got["tiles"].append(64)
        got["nested"]["deep"].append(2)
    assert set(store.store.held.hot) == {"k"}  # internal: the last copies came from the hot set
    assert store.get("k") == value


def test_a_list_of_small_ints_is_each_callers_own_copy(env: BlockingEnvironment) -> None:
    value = [7] * 200
    store: BlockingStore[str, list[int]] = env.store(NS)
    store.insert("k", value)
    for _ in range(3):
        got = store.get("k")
        assert got == value
        got.append(8)
        assert store.get_or_compute("k", list) == value


def test_a_blocking_store_takes_max_entries(env: BlockingEnvironment) -> None:
    filler: BlockingStore[str, int] = env.store(NS, mode=CacheMode.LAZY)
    for i in range(30):
        filler.insert(f"k{i}", i)
    store: BlockingStore[str, int] = env.store(NS, max_entries=10)
    assert store.max_entries == 10
    assert len(store) == 10
    assert [store.get(f"k{i}") for i in range(30)] == list(range(30))  # the rest read through
    assert len(store) <= 10


def test_a_blocking_store_takes_hot_bytes(env: BlockingEnvironment) -> None:
    store: BlockingStore[str, dict[str, int]] = env.store(NS, hot_bytes=0)
    assert store.hot_bytes == 0
    store.insert("k", {"a": 1})
    for _ in range(256):  # enough for a hot set to take it in
        assert store.get("k") == {"a": 1}
    assert not set(store.store.held.hot)  # internal: nothing held decoded
    assert env.store(NS).hot_bytes > 0


def test_a_blocking_store_refuses_a_bad_bound(env: BlockingEnvironment) -> None:
    with pytest.raises(ValueError, match="max_entries must be a positive int"):
        env.store(NS, max_entries=0)
    with pytest.raises(ValueError, match="hot_bytes must be an int >= 0"):
        env.store(NS, hot_bytes=-1)


# --- environments ------------------------------------------------------------------


def test_an_environment_is_shared_by_threads_over_one_loop_thread(
    root: Path, env: BlockingEnvironment
) -> None:
    def work(i: int) -> None:
        store: BlockingStore[str, int] = env.store(NS)
        store.insert(f"k{i}", i)
        with open_blocking("other", root=root) as other:
            other.store(NS).insert("x", i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    join(threads)

    store: BlockingStore[str, int] = env.store(NS)
    assert [store.get(f"k{i}") for i in range(8)] == list(range(8))
    assert len(loop_threads()) == 1


def test_a_blocking_environment_reprs_as_what_it_describes(env: BlockingEnvironment) -> None:
    assert repr(env) == f"<BlockingEnvironment: environment 'test' at {env.path}>"


def test_a_closed_blocking_environment_says_so_in_its_repr(root: Path) -> None:
    env = open_blocking("test", root=root).__enter__()
    env.close()
    assert repr(env) == f"<BlockingEnvironment: environment 'test' at {env.path}, closed>"


def test_a_blocking_store_reprs_as_its_namespace_and_what_closed_it_refuses_names_it(
    root: Path,
) -> None:
    env = open_blocking("test", root=root).__enter__()
    store: BlockingStore[str, int] = env.store(NS)
    where = f"SQLite {env.path} [{NS}]"
    assert repr(store) == f"<BlockingStore: {where}>"
    env.close()
    assert repr(store) == f"<BlockingStore: {where}, closed>"
    said = f"environment 'test' at {env.path} is closed; open it again to use it"
    closed = f"^{re.escape(said)}$"
    for use in (
        lambda: store.get("k"),
        lambda: store.get_or_compute("k", lambda: 1),
        lambda: store.insert("k", 1),
    ):
        with pytest.raises(ClosedError, match=closed):
            use()


def test_a_store_of_a_closed_environment_raises_on_a_key_it_held(root: Path) -> None:
    env = open_blocking("test", root=root).__enter__()
    store: BlockingStore[str, int] = env.store(NS)
    store.insert("m", 1)
    assert store.get("m") == 1
    env.close()
    with pytest.raises(ClosedError, match="closed"):
        store.get("m")
    with pytest.raises(ClosedError, match="closed"):
        store.get_or_compute("m", lambda: 2)


def test_closing_closes_the_environment_and_keeps_what_was_written(root: Path) -> None:
    with open_blocking("test", root=root) as env:
        store: BlockingStore[str, int] = env.store(NS)
        store.insert("k", 1)
    with pytest.raises(ClosedError):
        env.store(NS)
    with pytest.raises(ClosedError):
        store.get("missing")
    with pytest.raises(ClosedError):
        env.environment.database  # noqa: B018 (closed on the loop thread)
    with open_blocking("test", root=root) as again:
        assert again.store(NS).get("k") == 1


def test_no_thread_outlives_the_interpreter(root: Path) -> None:
    code = f"""
import atexit, json, threading
def report(when):
    print(json.dumps([when, sorted(t.name for t in threading.enumerate()
                                   if t is not threading.main_thread())]))
atexit.register(report, "exit")  # before warmenv's own hook, so it runs after it
from warmenv import Namespace
from warmenv.blocking import open_environment
with open_environment("t", root={str(root)!r}) as env:
    store = env.store(Namespace("a", "b", version="1"))
    store.get_or_compute("k", str.upper, "v")
    store.get("missing")
report("closed")
"""
    completed = run_python(code)
    assert completed.returncode == 0, completed.stderr
    lines = [json.loads(line) for line in completed.stdout.splitlines()]
    # In use: one loop thread (and whatever worker threads its loop keeps idle).
    assert lines[0][0] == "closed" and lines[0][1].count("warmenv-blocking-loop") == 1
    assert lines[1:] == [["exit", []]]


def test_get_or_compute_records_how_long_fn_took_on_the_calling_thread(root: Path) -> None:
    def tune() -> int:
        time.sleep(0.05)  # the computation's own time
        return 7

    with open_blocking("test", root=root) as env:
        store: BlockingStore[str, int] = env.store(NS)
        store.get_or_compute("k", tune)

    async def info() -> Any:
        async with open_environment("test", root=root) as again:
            return await again.storage(NS).info(b'"k"')

    recorded = anyio.run(info)
    assert recorded.origin is Origin.LOCAL
    assert recorded.cost is not None and recorded.cost >= 0.05


def counted(root: Path) -> tuple[int, int, int]:
    """(hits, misses, computes) of NS in the environment "test", as it keeps them."""

    async def statistics() -> tuple[int, int, int]:
        async with open_environment("test", root=root) as again:
            (counts,) = (await again.statistics()).namespaces
            return counts.hits, counts.misses, counts.computes

    return anyio.run(statistics)


def test_get_many_answers_hits_here_and_reads_the_rest_together(root: Path) -> None:
    with open_blocking("test", root=root) as env:
        store: BlockingStore[str, int] = env.store(NS)
        store.insert("held", 1)
        env.store(NS, BytesCodec()).insert(b'"stored"', b"2")  # not in `store`'s memory
        found = store.get_many(["absent", "held", "stored", "held"])
        assert list(found.items()) == [("held", 1), ("stored", 2)]
        assert store.get_many(["held", "stored"]) == {"held": 1, "stored": 2}
        assert store.get_many(iter([])) == {}
    assert counted(root) == (4, 1, 0)


def test_hits_answered_on_the_calling_thread_are_counted(root: Path) -> None:
    with open_blocking("test", root=root) as env:
        store: BlockingStore[str, int] = env.store(NS)
        store.insert("k", 1)
        for _ in range(3):
            assert store.get("k") == 1
            assert store.get_or_compute("k", int, "2") == 1
        assert store.get("absent") is None
    assert counted(root) == (6, 1, 0)


def test_threads_waiting_for_one_run_each_count_a_miss(root: Path) -> None:
    codec = TracingCodec()
    started, release = threading.Event(), threading.Event()

    def tune(key: str) -> dict[str, Any]:
        started.set()
        assert release.wait(timeout=30)
        return {"key": key}

    with open_blocking("test", root=root) as env:
        store = env.store(NS, codec=codec)
        first, _ = in_threads(1, lambda: store.get_or_compute("k", tune, "k"))
        assert started.wait(timeout=30)
        others, _ = in_threads(7, lambda: store.get_or_compute("k", tune, "k"))
        codec.wait_for(others, encodings=2)
        release.set()
        join(first + others)
    assert counted(root) == (0, 8, 1)


# --- statistics, explanations, gc -------------------------------------------------

OLD = Namespace("app", "blocking", version="0")


def fill(env: BlockingEnvironment) -> None:
    """The same entries, hits, misses and computation in whichever environment it is given."""
    old: BlockingStore[str, int] = env.store(OLD)
    store: BlockingStore[str, int] = env.store(NS)
    for i in range(5):
        old.insert(f"k{i}", i)
    for i in range(5):
        store.insert(f"k{i}", i)
    assert [store.get("k0"), store.get("k1"), store.get("absent")] == [0, 1, None]
    assert store.get_or_compute("computed", int, "7") == 7


def test_statistics_are_what_the_async_environment_reports(
    root: Path, env: BlockingEnvironment
) -> None:
    fill(env)
    ours = env.statistics()  # this process's counts, not flushed yet, included

    async def theirs() -> EnvironmentStatistics:
        async with open_environment("test", root=root) as same:
            return await same.statistics()

    assert isinstance(ours, EnvironmentStatistics)
    assert ours == anyio.run(theirs)
    counts = {n.namespace: (n.entries, n.hits, n.misses, n.computes) for n in ours.namespaces}
    assert counts == {str(NS): (6, 2, 2, 1), str(OLD): (5, 0, 0, 0)}


def test_explain_is_what_the_async_environment_explains(
    root: Path, env: BlockingEnvironment
) -> None:
    fill(env)
    asked = Namespace("app", "blocking", version="2")
    ours = [env.explain(asked), env.explain(asked, "k1"), env.explain(str(asked), key=b'"k1"')]

    async def theirs() -> list[Explanation]:
        async with open_environment("test", root=root) as same:
            return [
                await same.explain(asked),
                await same.explain(asked, "k1"),
                await same.explain(str(asked), key=b'"k1"'),
            ]

    assert ours == anyio.run(theirs)
    assert [str(e) for e in ours] == [str(e) for e in anyio.run(theirs)]
    assert {(n.namespace, n.has_key) for n in ours[1].nearby} == {(str(NS), True), (str(OLD), True)}


def test_gc_evicts_what_the_async_environment_evicts(root: Path) -> None:
    for name in ("ours", "theirs"):
        with open_blocking(name, root=root) as filling:
            fill(filling)
    with open_blocking("ours", root=root) as env:
        ours = [
            env.gc(older_than=timedelta(days=1)),
            env.gc(keep_versions=1),
            env.gc(max_bytes=20),
            env.gc(),
        ]
        ours_left = env.namespaces()

    async def theirs() -> tuple[list[Purged | Failed], list[Any]]:
        async with open_environment("theirs", root=root) as same:
            purged = [
                await same.gc(older_than=timedelta(days=1)),
                await same.gc(keep_versions=1),
                await same.gc(max_bytes=20),
                await same.gc(),
            ]
            return purged, await same.namespaces()

    assert (ours, ours_left) == anyio.run(theirs)
    assert ours[:2] == [Purged(0), Purged(5)]  # nothing a day old; then version "0" goes
    assert isinstance(ours[2], Purged) and ours[2].count > 0
    assert sum(n.bytes for n in ours_left) <= 20


def outcome(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as raised:
        call()
    return type(raised.value), str(raised.value)


# The blocking call, and the async one of the same name and arguments.
BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("gc", (), {"keep_versions": 0}),
    ("gc", (), {"max_bytes": -1}),
    ("gc", (), {"older_than": "yesterday"}),
    ("explain", (NS,), {"key": 5}),
]


@pytest.mark.parametrize(
    ("method", "args", "kwargs"), BAD_CALLS, ids=[f"{m}-{next(iter(k))}" for m, _, k in BAD_CALLS]
)
def test_a_bad_argument_raises_what_the_async_environment_raises(
    root: Path, env: BlockingEnvironment, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    ours = outcome(lambda: getattr(env, method)(*args, **kwargs))

    async def theirs() -> tuple[type[BaseException], str]:
        async with open_environment("test", root=root) as same:
            try:
                await getattr(same, method)(*args, **kwargs)
            except Exception as exc:
                return type(exc), str(exc)
        raise AssertionError(f"{method} accepted {args} {kwargs}")

    assert ours == anyio.run(theirs)
    assert ours[0] in (ValueError, TypeError)


def test_purge_bundle_and_vacuum_do_what_the_async_environment_does(
    root: Path, tmp_path: Path
) -> None:
    with open_blocking("source", root=root) as source:
        fill(source)
        bundle = tmp_path / "warm.bundle"
        export_bundle(source, bundle, name="warm", version="1")
    for name in ("ours", "theirs"):
        with open_blocking(name, root=root) as target:
            import_bundle(bundle, target)
            target.store(NS).insert("local", 1)
    with open_blocking("ours", root=root) as env:
        ours = [env.purge_bundle("warm"), env.purge_bundle("warm")]
        ours_left = env.namespaces()
        before, after = env.vacuum()

    async def theirs() -> tuple[list[Purged | Failed], list[Any]]:
        async with open_environment("theirs", root=root) as same:
            purged = [await same.purge_bundle("warm"), await same.purge_bundle("warm")]
            return purged, await same.namespaces()

    assert (ours, ours_left) == anyio.run(theirs)
    assert ours == [Purged(11), Purged(0)]  # every imported entry, once; the local one stays
    assert [(n.namespace, n.entries) for n in ours_left] == [(str(NS), 1)]
    assert before >= after > 0  # the file's sizes; 11 entries' pages freed, then given back
    with pytest.raises(ValueError, match="purge_bundle takes a bundle digest or name"):
        with open_blocking("ours", root=root) as env:
            env.purge_bundle("")


def test_open_environment_takes_max_bytes_statistics_and_create(root: Path) -> None:
    with pytest.raises(FileNotFoundError):
        with open_blocking("absent", root=root, create=False):
            pass
    assert not (root / "absent.db").exists()
    with open_blocking("bounded", root=root, max_bytes=20, statistics=False) as env:
        assert env.max_bytes == 20
        fill(env)
        counted = env.statistics().namespaces
        assert len(counted) == 2 and all(n.hits == n.misses == n.computes == 0 for n in counted)
        env.gc()
        assert sum(n.bytes for n in env.namespaces()) <= 20


def test_statistics_explain_and_gc_of_a_closed_environment_raise_closed_error(
    root: Path,
) -> None:
    with open_blocking("test", root=root) as env:
        pass
    calls = (env.statistics, lambda: env.explain(NS), env.gc, env.vacuum)
    for call in (*calls, lambda: env.purge_bundle("warm")):
        with pytest.raises(ClosedError, match="is closed; open it again"):
            call()


# --- a fleet's shared tier -------------------------------------------------------


@tolerating_coredis_streams
def test_blocking_environments_on_two_hosts_share_values_through_the_remote(
    tmp_path: Path, server: RedisServer
) -> None:
    with open_blocking("fleet", root=tmp_path / "a", remote=server.url) as a:
        assert a.remote is not None
        a.store(NS).insert("k", {"block": 128})
    with open_blocking("fleet", root=tmp_path / "b", remote=server.url) as b:
        assert b.store(NS).get("k") == {"block": 128}
        assert b.remote is not None and b.remote.statistics().hits == 1
    with open_blocking("fleet", root=tmp_path / "c", remote="") as c:
        assert c.remote is None
        assert c.store(NS).get("k") is None


@tolerating_coredis_streams
def test_threads_on_two_hosts_compute_each_key_once_fleet_wide(
    tmp_path: Path, server: RedisServer
) -> None:
    keys = [f"k{i}" for i in range(10)]
    computes: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(8)

    def tune(key: str) -> dict[str, str]:
        with lock:
            computes[key] += 1
        time.sleep(0.02)  # the computation's own time, so that hosts overlap
        return {"key": key, "by": threading.current_thread().name}

    with (
        open_blocking("fleet", root=tmp_path / "a", remote=server.url) as a,
        open_blocking("fleet", root=tmp_path / "b", remote=server.url) as b,
    ):
        stores = [a.store(NS), b.store(NS)]

        def ask(host: int) -> list[Any]:
            start.wait(timeout=30)
            return [stores[host].get_or_compute(key, tune, key) for key in keys]

        threads = []
        answers: list[list[Any]] = []
        for i in range(8):
            thread = threading.Thread(target=lambda i=i: answers.append(ask(i % 2)))
            threads.append(thread)
            thread.start()
        join(threads)
        leases = [host.remote.statistics() for host in (a, b) if host.remote is not None]

    assert computes == Counter(keys)  # once each, across both hosts and all threads
    assert len(answers) == 8 and all(answer == answers[0] for answer in answers)
    assert sum(s.leases for s in leases) == len(keys)


@tolerating_coredis_streams
def test_an_interrupted_compute_releases_the_fleet_lease_at_once(
    tmp_path: Path, server: RedisServer
) -> None:
    def interrupted() -> int:
        raise KeyboardInterrupt

    with open_blocking("fleet", root=tmp_path / "a", remote=server.url) as a:
        with pytest.raises(KeyboardInterrupt):
            a.store(NS).get_or_compute("k", interrupted)
    with open_blocking("fleet", root=tmp_path / "b", remote=server.url) as b:
        assert b.store(NS).get_or_compute("k", lambda: 2) == 2
        assert b.remote is not None
        statistics = b.remote.statistics()
    # Had the lease been left behind, b would have waited for it to expire.
    assert (statistics.leases, statistics.lease_waits) == (1, 0)


# --- from inside an event loop -------------------------------------------------


@pytest.mark.anyio
async def test_opening_on_an_event_loop_thread_says_to_use_the_async_api(root: Path) -> None:
    with pytest.raises(EventLoopThreadError, match="use the async API"):
        with open_blocking("test", root=root):
            pass  # pragma: no cover


@pytest.mark.anyio
async def test_a_store_used_on_an_event_loop_thread_raises_even_for_a_hit(root: Path) -> None:
    with ExitStack() as stack:
        # Worker threads may block: they are not the loop's thread.
        env = await anyio.to_thread.run_sync(stack.enter_context, open_blocking("t", root=root))
        store: BlockingStore[str, int] = await anyio.to_thread.run_sync(env.store, NS)
        await anyio.to_thread.run_sync(store.insert, "k", 1)
        assert await anyio.to_thread.run_sync(store.get, "k") == 1
        double = store.memoize(lambda x: 2 * x)
        by_key = store.memoize(key=lambda x: "k")(lambda x: 2 * x)
        assert await anyio.to_thread.run_sync(double, 3) == 6  # held now: a hit next
        assert await anyio.to_thread.run_sync(by_key, 0) == 1

        calls: list[Callable[[], object]] = [
            lambda: store.get("k"),
            lambda: store.get("missing"),
            lambda: store.get_or_compute("k", int),
            lambda: store.get_many(["k"]),
            lambda: double(3),
            lambda: by_key(0),
            lambda: store.insert("j", 2),
            lambda: env.store(NS),
        ]
        for call in calls:
            with pytest.raises(EventLoopThreadError, match="use the async API"):
                call()
        with pytest.raises(EventLoopThreadError):
            import_bundle(root / "x.bundle", env)
        await anyio.to_thread.run_sync(stack.close)


@pytest.mark.anyio
async def test_statistics_explain_and_gc_on_an_event_loop_thread_say_to_use_the_async_api(
    root: Path,
) -> None:
    with ExitStack() as stack:
        env = await anyio.to_thread.run_sync(stack.enter_context, open_blocking("t", root=root))
        store: BlockingStore[str, int] = await anyio.to_thread.run_sync(env.store, NS)
        await anyio.to_thread.run_sync(store.insert, "k", 1)
        # From a worker thread they work, as every blocking call does.
        before = await anyio.to_thread.run_sync(env.statistics)

        calls: list[Callable[[], object]] = [
            env.statistics,
            lambda: env.explain(NS, "k"),
            lambda: env.gc(max_bytes=0),
        ]
        for call in calls:
            with pytest.raises(EventLoopThreadError, match="use the async API"):
                call()
        # Refused before anything ran: gc(max_bytes=0) evicted nothing.
        assert await anyio.to_thread.run_sync(env.statistics) == before
        assert before.namespaces[0].entries == 1
        await anyio.to_thread.run_sync(stack.close)


# --- bundles --------------------------------------------------------------------


def recorder() -> tuple[list[Event], list[int], Callable[[Event], None]]:
    events: list[Event] = []
    threads: list[int] = []

    def record(event: Event) -> None:
        events.append(event)
        threads.append(threading.get_ident())

    return events, threads, record


def test_export_and_import_call_progress_on_the_calling_thread(
    root: Path, env: BlockingEnvironment, tmp_path: Path
) -> None:
    store: BlockingStore[str, int] = env.store(NS)
    for i in range(50):
        store.insert(f"k{i}", i)
    out = tmp_path / "warm.bundle"

    events, threads, record = recorder()
    exported = export_bundle(env, out, name="warm", version="1", progress=record)

    assert isinstance(exported, ExportReport) and exported.entries == 50
    assert isinstance(events[0], Started)
    assert all(isinstance(e, Progress) for e in events[1:-1]) and len(events) >= 3
    assert events[-1] == Finished(exported)
    assert set(threads) == {threading.get_ident()}

    events, threads, record = recorder()
    with open_blocking("fresh", root=root) as fresh:
        imported = import_bundle(out, fresh, progress=record, batch_size=16)
        assert fresh.store(NS).get("k49") == 49

    assert isinstance(imported, ImportReport) and imported.imported == 50
    assert isinstance(events[0], Started)
    assert sum(isinstance(e, Progress) for e in events) >= 4  # 50 entries, 16 a batch
    assert events[-1] == Finished(imported)
    assert set(threads) == {threading.get_ident()}


def test_the_blocking_forms_report_what_the_async_forms_report(
    root: Path, env: BlockingEnvironment, tmp_path: Path
) -> None:
    env.store(NS).insert("k", 1)
    out = tmp_path / "warm.bundle"
    export_bundle([env], out, name="warm", version="1")
    with open_blocking("one", root=root) as one:
        ours = import_bundle(str(out), one)

    async def theirs() -> ImportReport:
        from warmenv.bundle import import_bundle as async_import

        async with open_environment("two", root=root) as two:
            return await async_import(out, two)

    assert attrs_without_elapsed(ours) == attrs_without_elapsed(anyio.run(theirs))


def attrs_without_elapsed(report: ImportReport) -> tuple[object, ...]:
    return (report.namespaces, report.imported, report.skipped, report.failed, report.bytes)


def test_a_progress_callback_that_raises_stops_the_export_and_leaves_no_bundle(
    env: BlockingEnvironment, tmp_path: Path
) -> None:
    env.store(NS).insert("k", 1)
    out = tmp_path / "bundles" / "warm.bundle"
    out.parent.mkdir()

    def refuse(event: Event) -> None:
        if isinstance(event, Progress):
            raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        export_bundle(env, out, name="warm", version="1", progress=refuse)
    assert list(out.parent.iterdir()) == []
