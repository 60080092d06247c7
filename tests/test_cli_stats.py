"""`warmenv stats`, `purge --bundle`, `gc` and `vacuum`, run as a user would, on every loop."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.progress import Progress

from helpers import one_trial
from redis_server import RedisServer, tolerating_coredis_streams
from test_cli import terminal, warmenv
from warmenv import open_environment
from warmenv.caches import directory
from warmenv.cli._format import per_second
from warmenv.cli._output import ProgressBar
from warmenv.cli._progress import EntriesColumn, EntriesRateColumn
from warmenv.cli.stats import seconds
from warmenv.persistence import Origin, Store
from warmenv.persistence.storage import BundleRef

NS = "app/1/kernels"
OTHER = "app/1/configs"
BUNDLE = BundleRef("H100 Linux", "blake2b-256:" + "cd" * 32)
LOOPS = ["asyncio", "uvloop", "trio"]
_VACUUM_READER = (
    "vacuum under another process's open read transaction (a real reader process; trio)",
    "exit 1 with one line saying a reader kept it from shrinking, no 'freed' report; once the "
    "reader is gone, vacuum gives the space back",
)
_AMBIGUOUS_PURGE = (
    "purge --bundle NAME / purge_bundle(NAME) where two imported bundles share the name "
    "(CLI on trio; library on asyncio, uvloop, trio, SQLite and memory)",
    "refused in one line listing both digests; nothing deleted; the digest then purges one",
)


def run(*args: str, root: Path, loop: str) -> subprocess.CompletedProcess[str]:
    return warmenv(*args, root=root, env={"WARMENV_CLI_BACKEND": loop})


def document(completed: subprocess.CompletedProcess[str]) -> Any:
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


async def _fill(root: Path) -> None:
    async with open_environment("stats", root=root) as env:
        await env.storage(NS).insert_many(
            [(b'"i%d"' % i, b"%d" % i) for i in range(4)],
            Origin.IMPORTED,
            cost=1.5,
            bundle=BUNDLE,
        )
        store: Store[str, int] = await env.store(NS)
        for _ in range(3):
            await store.get("i0")
        await store.get("i1")
        await store.get("absent")

        async def compute() -> int:
            return 7

        await store.get_or_compute("local", compute)
        await store.get("local")
        other: Store[str, int] = await env.store(OTHER)
        await other.insert("c", 1)


@pytest.fixture
def counted_root(tmp_path: Path) -> Path:
    """Environment 'stats': 4 imported entries (cost 1.5 s), 2 hit 4 times; 1 local, 2 misses."""
    root = tmp_path / "root"
    anyio.run(_fill, root)
    return root


@pytest.mark.parametrize("loop", LOOPS)
def test_stats_shows_hits_by_origin_misses_and_saved_seconds(counted_root: Path, loop: str) -> None:
    found = document(run("stats", "--env", "stats", "--json", root=counted_root, loop=loop))
    by_ns = {n["namespace"]: n for n in found["namespaces"]}
    kernels = by_ns[NS]
    assert kernels["hits_by_origin"] == {"local": 1, "imported": 4}
    assert (kernels["hits"], kernels["misses"], kernels["computes"]) == (5, 2, 1)
    assert kernels["saved_seconds"] == pytest.approx(3.0, abs=0.5)  # i0 and i1, once each
    assert kernels["entries"] == 5
    (bundle,) = found["bundles"]
    assert (bundle["name"], bundle["digest"], bundle["entries"], bundle["hits"]) == (
        BUNDLE.name,
        BUNDLE.digest,
        4,
        4,
    )
    assert (bundle["imported"], bundle["distinct_hits"]) == (4, 2)
    assert bundle["saved_seconds"] == pytest.approx(3.0)
    assert bundle["figure"] == "imported 4, hit 2 distinct, saved 3.000 s"


@pytest.mark.parametrize("loop", LOOPS)
def test_stats_prints_tables_and_a_summary(counted_root: Path, loop: str) -> None:
    completed = run("stats", "--env", "stats", root=counted_root, loop=loop)
    assert completed.returncode == 0, completed.stderr
    assert "app/1/kernels" in completed.stdout and "H100 Linux" in completed.stdout
    assert "5 hits, 2 misses (hit rate 71.4%)" in completed.stdout
    assert "in 2 namespaces" in completed.stdout


def test_stats_of_a_local_environment_has_no_remote_column(counted_root: Path) -> None:
    completed = run("stats", "--env", "stats", root=counted_root, loop="asyncio")
    assert completed.returncode == 0, completed.stderr
    header = next(line for line in completed.stdout.splitlines() if line.startswith("namespace"))
    assert header.split()[3:6] == ["hits", "local", "imported"]
    assert "remote" not in completed.stdout


async def _fetch_from_the_fleet(server: RedisServer, tmp_path: Path) -> Path:
    """Host a computes a value; host b fetches it from Redis (a remote hit), then hits it
    locally (its entry's origin is REMOTE), and misses one key: hits {remote: 2}."""

    async def compute() -> int:
        return 7

    async with open_environment("fleet", root=tmp_path / "a", remote=server.url) as a:
        computed: Store[str, int] = await a.store(NS)
        await computed.get_or_compute("k", compute)
    async with open_environment("fleet", root=tmp_path / "b", remote=server.url) as b:
        fetched: Store[str, int] = await b.store(NS)
        assert await fetched.get("k") == 7
        assert await fetched.get("k") == 7
        assert await fetched.get("absent") is None
        assert b.remote is not None and b.remote.statistics().hits == 1
    return tmp_path / "b"


@tolerating_coredis_streams
@pytest.mark.parametrize("loop", LOOPS)
def test_stats_shows_hits_fetched_from_the_remote(
    server: RedisServer, tmp_path: Path, loop: str
) -> None:
    root = anyio.run(_fetch_from_the_fleet, server, tmp_path)
    found = document(run("stats", "--env", "fleet", "--json", root=root, loop=loop))
    (kernels,) = found["namespaces"]
    assert kernels["hits_by_origin"] == {"remote": 2}
    assert (kernels["hits"], kernels["misses"]) == (2, 1)

    page = tmp_path / "fleet.html"
    completed = run("stats", "--env", "fleet", "--html", str(page), root=root, loop=loop)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    header = next(line for line in lines if line.startswith("namespace")).split()
    row = next(line for line in lines if line.startswith(NS)).split()
    # namespace, entries, size (a number and a unit), hits, then by origin.
    assert header[3:7] == ["hits", "local", "imported", "remote"]
    assert row[4:8] == ["2", "0", "0", "2"]
    parser = _Bars()
    parser.feed(page.read_text())
    hits = {b["data-series"]: b["data-value"] for b in parser.bars if b["chart"] == "hits"}
    assert hits == {"local": "0", "imported": "0", "remote": "2"}


def test_stats_of_a_namespace_prefix_shows_only_it(counted_root: Path) -> None:
    found = document(
        run("stats", "app/1/configs", "--env", "stats", "--json", root=counted_root, loop="asyncio")
    )
    assert [n["namespace"] for n in found["namespaces"]] == [OTHER]


def test_stats_of_a_prefix_matching_nothing_says_so(counted_root: Path) -> None:
    completed = run("stats", "nope", "--env", "stats", root=counted_root, loop="asyncio")
    assert completed.returncode == 1
    assert "no namespace matches 'nope'" in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1


def test_stats_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    completed = run("stats", "--env", "absent", root=root, loop="asyncio")
    assert completed.returncode == 1
    assert "no environment 'absent'" in completed.stderr
    assert not root.exists()


def test_stats_does_not_evict_under_a_configured_max_bytes(
    counted_root: Path, tmp_path: Path
) -> None:
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "warmenv.toml").write_text("max_bytes = 1\n")
    completed = subprocess.run(
        [
            *warmenv("--version", root=None).args[:3],
            "stats",
            "--env",
            "stats",
            "--json",
            "--root",
            str(counted_root),
        ],
        capture_output=True,
        text=True,
        cwd=config,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    found = json.loads(completed.stdout)
    assert sum(n["entries"] for n in found["namespaces"]) == 6


class _Bars(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.bars: list[dict[str, str | None]] = []
        self.svgs: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "svg":
            self.svgs.append(dict(attrs).get("class"))
        if tag == "rect":
            self.bars.append({**dict(attrs), "chart": self.svgs[-1]})


@pytest.mark.parametrize("loop", LOOPS)
def test_stats_html_writes_a_page_of_bar_charts(
    counted_root: Path, tmp_path: Path, loop: str
) -> None:
    page = tmp_path / "stats.html"
    completed = run("stats", "--env", "stats", "--html", str(page), root=counted_root, loop=loop)
    assert completed.returncode == 0, completed.stderr
    text = page.read_text()
    assert "<script" not in text and "http" not in text.replace("http://www.w3.org/2000/svg", "")
    parser = _Bars()
    parser.feed(text)
    assert parser.svgs == ["hits", "saved-namespaces", "saved-bundles"]
    hits = {
        (b["data-label"], b["data-series"]): float(b["data-value"] or 0)
        for b in parser.bars
        if b["chart"] == "hits"
    }
    assert hits[(NS, "local")] == 1 and hits[(NS, "imported")] == 4
    saved = [b for b in parser.bars if b["chart"] == "saved-bundles"]
    assert len(saved) == 1 and float(saved[0]["data-value"] or 0) == pytest.approx(3.0)
    assert "H100 Linux" in str(saved[0]["data-label"])


@pytest.mark.parametrize("loop", LOOPS)
def test_purge_bundle_removes_only_its_imported_entries(counted_root: Path, loop: str) -> None:
    found = document(
        run(
            "purge",
            "--bundle",
            "H100 Linux",
            "--yes",
            "--env",
            "stats",
            "--json",
            root=counted_root,
            loop=loop,
        )
    )
    assert found["deleted"] == 4
    after = document(run("stats", "--env", "stats", "--json", root=counted_root, loop=loop))
    entries = {n["namespace"]: n["entries"] for n in after["namespaces"]}
    assert entries == {NS: 1, OTHER: 1}  # the local value stays


def test_purge_bundle_by_digest_without_its_prefix(counted_root: Path) -> None:
    found = document(
        run(
            "purge",
            "--bundle",
            "cd" * 32,
            "--yes",
            "--env",
            "stats",
            "--json",
            root=counted_root,
            loop="asyncio",
        )
    )
    assert found["deleted"] == 4


def test_purge_of_an_unknown_bundle_names_the_ones_there(counted_root: Path) -> None:
    completed = run(
        "purge", "--bundle", "nope", "--yes", "--env", "stats", root=counted_root, loop="asyncio"
    )
    assert completed.returncode == 1
    assert "no bundle 'nope'" in completed.stderr and "'H100 Linux'" in completed.stderr


async def _two_of_one_name(root: Path) -> None:
    async with open_environment("stats", root=root) as env:
        rebuilt = BundleRef(BUNDLE.name, "blake2b-256:" + "ef" * 32)
        await env.storage(OTHER).insert_many([(b"r", b"1")], Origin.IMPORTED, bundle=rebuilt)


def test_purge_of_a_name_two_bundles_share_deletes_nothing_and_lists_their_digests(
    counted_root: Path,
) -> None:
    with one_trial(*_AMBIGUOUS_PURGE):
        anyio.run(_two_of_one_name, counted_root)
        before = document(
            run("stats", "--env", "stats", "--json", root=counted_root, loop="asyncio")
        )
        completed = run(
            "purge",
            "--bundle",
            "H100 Linux",
            "--yes",
            "--env",
            "stats",
            root=counted_root,
            loop="trio",
        )
        assert completed.returncode == 1
        assert completed.stderr.count("\n") == 1, completed.stderr
        assert "cd" * 32 in completed.stderr and "ef" * 32 in completed.stderr
        after = document(
            run("stats", "--env", "stats", "--json", root=counted_root, loop="asyncio")
        )
        assert after["namespaces"] == before["namespaces"]


def test_a_name_two_bundles_share_is_refused_before_the_prompt(counted_root: Path) -> None:
    # The CLI asks the library's rule (storage.bundles_to_purge) before it asks the user:
    # off a terminal without --yes the refusal, not "pass --yes", is what is said.
    anyio.run(_two_of_one_name, counted_root)
    completed = run(
        "purge", "--bundle", "H100 Linux", "--env", "stats", root=counted_root, loop="asyncio"
    )
    assert completed.returncode == 1
    assert "names 2 bundles imported into" in completed.stderr
    assert "cd" * 32 in completed.stderr and "ef" * 32 in completed.stderr
    assert "--yes" not in completed.stderr


def test_purge_bundle_without_yes_off_a_terminal_is_a_usage_error(counted_root: Path) -> None:
    completed = run(
        "purge", "--bundle", "H100 Linux", "--env", "stats", root=counted_root, loop="asyncio"
    )
    assert completed.returncode == 2
    assert "4 entries imported from 'H100 Linux'" in completed.stderr


@pytest.mark.parametrize("loop", LOOPS)
def test_gc_evicts_to_a_size_never_hit_entries_first(counted_root: Path, loop: str) -> None:
    # 32 bytes: i0..i3 5 each, "local" 8, configs' c 4. Hit (recorded at the
    # flush): i0, i1, local. Never hit: i2, i3 and c, which go first.
    found = document(
        run("gc", "--max-bytes", "20", "--env", "stats", "--json", root=counted_root, loop=loop)
    )
    assert (found["evicted"], found["bytes"]) == (3, 18)
    after = document(run("stats", "--env", "stats", "--json", root=counted_root, loop=loop))
    entries = {n["namespace"]: n["entries"] for n in after["namespaces"]}
    assert entries == {NS: 3}  # configs, never looked up and now empty, is gone


def test_gc_takes_sizes_with_units(counted_root: Path) -> None:
    found = document(
        run(
            "gc",
            "--max-bytes",
            "1KiB",
            "--env",
            "stats",
            "--json",
            root=counted_root,
            loop="asyncio",
        )
    )
    assert (found["evicted"], found["max_bytes"]) == (0, 1024)


def test_gc_without_a_bound_is_a_usage_error(counted_root: Path) -> None:
    completed = run("gc", "--env", "stats", root=counted_root, loop="asyncio")
    assert completed.returncode == 2
    assert "--max-bytes" in completed.stderr


def test_gc_rejects_a_bad_size_in_one_line(counted_root: Path) -> None:
    completed = run(
        "gc", "--max-bytes", "lots", "--env", "stats", root=counted_root, loop="asyncio"
    )
    assert completed.returncode == 2
    assert "'lots' is not a size" in completed.stderr


def test_gc_keeps_the_newest_versions(counted_root: Path) -> None:
    async def older() -> None:
        async with open_environment("stats", root=counted_root) as env:
            await env.storage("app/0/kernels").insert(b"old", b"x")

    anyio.run(older)
    found = document(
        run(
            "gc",
            "--keep-versions",
            "1",
            "--env",
            "stats",
            "--json",
            root=counted_root,
            loop="asyncio",
        )
    )
    assert found["evicted"] >= 1


@pytest.mark.parametrize("loop", LOOPS)
def test_vacuum_reports_the_file_shrinking(counted_root: Path, loop: str) -> None:
    async def bulk() -> None:
        async with open_environment("stats", root=counted_root) as env:
            await env.storage("big/1/x").insert_many((b"%d" % i, b"v" * 1000) for i in range(2000))
            await env.storage("big/1/x").purge()

    anyio.run(bulk)
    found = document(run("vacuum", "--env", "stats", "--json", root=counted_root, loop=loop))
    assert found["before"] > found["after"] > 0
    assert found["before"] - found["after"] > 1_000_000


_READER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN")
conn.execute("SELECT count(*) FROM entries").fetchone()
print("reading", flush=True)
sys.stdin.readline()
"""


def test_vacuum_under_a_reader_that_stays_says_it_could_not_shrink_the_file(
    counted_root: Path,
) -> None:
    with one_trial(*_VACUUM_READER):

        async def bulk() -> None:
            async with open_environment("stats", root=counted_root) as env:
                await env.storage("big/1/x").insert_many(
                    (b"%d" % i, b"v" * 1000) for i in range(500)
                )
                await env.storage("big/1/x").purge()

        anyio.run(bulk)
        database = counted_root / "stats.db"
        wal = database.with_name("stats.db-wal")
        size = database.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        reader = subprocess.Popen(
            [sys.executable, "-c", _READER, str(database)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert reader.stdout is not None and reader.stdout.readline() == "reading\n"
            completed = run(
                "vacuum", "--env", "stats", "--wait", "0.5", root=counted_root, loop="trio"
            )
        finally:
            reader.communicate("done\n", timeout=60)
        assert completed.returncode == 1, completed.stderr
        assert completed.stderr.count("\n") == 1, completed.stderr
        assert "another process kept a read transaction open" in completed.stderr
        assert "freed" not in completed.stdout
        again = document(
            run("vacuum", "--env", "stats", "--json", root=counted_root, loop="asyncio")
        )
        assert again["after"] < size  # once the reader is gone, the space is given back


def test_stats_html_escapes_control_and_format_characters_from_files(tmp_path: Path) -> None:
    hostile_ns = "app\x1b[2J/1/evil\u202e"
    hostile_bundle = BundleRef("bad\x07name\u202e", "blake2b-256:" + "ef" * 32)

    async def fill() -> None:
        async with open_environment("stats", root=tmp_path / "root") as env:
            await env.storage(hostile_ns).insert_many(
                [(b'"k"', b"1")], Origin.IMPORTED, cost=1.0, bundle=hostile_bundle
            )
            store: Store[str, int] = await env.store(hostile_ns)
            await store.get("k")

    anyio.run(fill)
    page = tmp_path / "stats.html"
    completed = run(
        "stats", "--env", "stats", "--html", str(page), root=tmp_path / "root", loop="asyncio"
    )
    assert completed.returncode == 0, completed.stderr
    text = page.read_text()
    assert not [ch for ch in text if ch in "\x1b\x07\u202e"]
    assert "\\x1b[2J" in text


# --- plural forms: "1 hit", "1 namespace", "1 entry/s" ---------------------------------

# A count of one followed by a plural noun the commands print ("all 1 namespaces").
ONE_PLURAL = re.compile(r"(?<![\d,.])1 (namespaces|entries|keys|hits|misses)\b")


async def _one_of_each(root: Path) -> None:
    async with open_environment("one", root=root) as env:
        store: Store[str, int] = await env.store(NS)
        await store.insert("k", 1)
        assert await store.get("k") == 1
        assert await store.get("absent") is None


@pytest.mark.parametrize("loop", LOOPS)
def test_stats_of_one_hit_one_miss_and_one_namespace_says_them_in_the_singular(
    tmp_path: Path, loop: str
) -> None:
    root = tmp_path / "root"
    anyio.run(_one_of_each, root)
    page = tmp_path / "one.html"
    completed = run("stats", "--env", "one", "--html", str(page), root=root, loop=loop)
    assert completed.returncode == 0, completed.stderr
    # The value was inserted, so it recorded no cost: what its hit saved is not known.
    assert (
        "1 hit, 1 miss (hit rate 50.0%); what the hit saved is unknown (no cost recorded) "
        "in 1 namespace" in completed.stdout
    )
    text = page.read_text()
    assert "<p>1 hit, 1 miss; what the hit saved is unknown (no cost recorded).</p>" in text
    assert ">1 hit</text>" in text and "local 1 hit</title>" in text
    assert not ONE_PLURAL.search(completed.stdout) and not ONE_PLURAL.search(text)


def test_a_bundle_of_one_entry_is_verified_in_the_singular(tmp_path: Path) -> None:
    root = tmp_path / "root"
    anyio.run(_one_of_each, root)
    bundle = str(tmp_path / "one.bundle")
    exported = warmenv(
        "export", bundle, "--env", "one", "--name", "one", "--app-version", "1", root=root
    )
    assert exported.returncode == 0, exported.stderr
    completed = warmenv("verify", bundle, root=root)
    assert completed.returncode == 0, completed.stderr
    assert ": ok (1 entry, digest " in completed.stdout
    assert not ONE_PLURAL.search(completed.stdout), completed.stdout


def test_a_duration_of_thousands_of_hours_is_grouped_as_the_counts_are() -> None:
    # Hits on values whose carried cost is just under a week add up fast.
    assert seconds(10_000 * 604_799.0) == "1,679,997.2 h"
    assert seconds(7_200.0) == "120.0 min" and seconds(3.5) == "3.500 s"


def test_the_demo_says_its_one_namespace_in_the_singular(tmp_path: Path) -> None:
    completed = warmenv("demo", root=tmp_path / "demo")
    assert completed.returncode == 0, completed.stderr
    assert "its namespace is for version '1'" in completed.stdout
    assert not ONE_PLURAL.search(completed.stdout), completed.stdout
    assert not re.search(r"(?<![\d,.])1 entries/s", completed.stdout)


def test_a_rate_of_one_entry_a_second_is_singular(monkeypatch: pytest.MonkeyPatch) -> None:
    assert per_second(1.0) == per_second(0.6) == per_second(1.49) == "1 entry/s"
    assert per_second(0.4) == "0 entries/s"
    assert per_second(3_100.2) == "3,100 entries/s"
    progress = Progress(EntriesColumn(), EntriesRateColumn())
    one = progress.add_task("one", entries=1, total_entries=None, entries_per_second=1.2)
    many = progress.add_task("many", entries=2, total_entries=40, entries_per_second=None)
    one_task, many_task = (t for t in progress.tasks if t.id in (one, many))
    assert str(EntriesColumn().render(one_task)) == "1 entry"
    assert str(EntriesRateColumn().render(one_task)) == "1 entry/s"
    assert str(EntriesColumn().render(many_task)) == "2/40 entries"
    assert str(EntriesRateColumn().render(many_task)) == "? entries/s"
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    bar = ProgressBar(total_entries=40, total_bytes=None)
    bar.update(1)
    clock[0] += 1.0
    bar.update(2)
    assert bar.describe() == "2/40 (5%), 1 entry/s"


def test_no_line_of_a_table_ends_in_spaces_plain_or_on_a_terminal(counted_root: Path) -> None:
    # The plain header's last column and rich's table title were padded with spaces.
    plain = run("stats", "--env", "stats", root=counted_root, loop="asyncio")
    assert plain.returncode == 0, plain.stderr
    status, shown = terminal("stats", "--env", "stats", "--root", str(counted_root))
    assert status == 0
    for text in (plain.stdout, shown.decode("utf-8")):
        padded = [line for line in text.replace("\r", "").splitlines() if line.endswith(" ")]
        assert padded == [], text


async def _directory_cache(root: Path, source: Path) -> None:
    source.mkdir()
    (source / "kernel.bin").write_bytes(b"compiled")
    async with open_environment("dirs", root=root) as env:
        await directory.capture(env, source, tool="cupy", facts=("python",))


def test_stats_shows_a_directory_form_cache_as_not_counted(tmp_path: Path) -> None:
    # The generic directory form has no counters: its 0 hits would read as a cache never hit.
    root = tmp_path / "root"
    anyio.run(_directory_cache, root, tmp_path / "cupy")
    found = document(run("stats", "--env", "dirs", "--json", root=root, loop="asyncio"))
    (namespace,) = found["namespaces"]
    assert namespace["namespace"].startswith("caches.cupy/")
    assert (namespace["counted"], namespace["saved_seconds"]) == (False, None)
    completed = run("stats", "--env", "dirs", root=root, loop="asyncio")
    assert completed.returncode == 0, completed.stderr
    [row] = [line for line in completed.stdout.splitlines() if "caches.cupy/" in line]
    assert row.count("not counted") == 6, row  # hits, local, imported, misses, hit rate, saved
