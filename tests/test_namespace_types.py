"""A row whose namespace is not UTF-8 text: listed flagged, left out of exports, left by purge.

Something other than warmenv can write an environment's file: a namespace
stored as a BLOB (bytes bound from Python), as NULL where the column allows
it, or as text that is not UTF-8. No store can address such a namespace, so
its rows are not entries; every command and library call must still work:
list them (escaped; a non-text one by its content read as text, with
`NamespaceSummary.text` False and `(not text)` beside it on the terminal, never
a tag in its name), leave them out of exports, leave them alone when purging, and never fail
with a `TypeError` comparing bytes with text.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import anyio
import pytest

from conftest import KERNELS, sample_entries
from test_cli import warmenv
from test_cli_errors import assert_one_error_line
from warmenv import Purged, open_environment
from warmenv.bundle import export_bundle, open_bundle

# (what is stored as the namespace, the name warmenv reads, how the terminal shows it)
KINDS = {
    "blob": (b"app/1/k", "app/1/k", "app/1/k (not text)"),
    "blob-not-utf8": (b"app/1/\xff", "app/1/\udcff", "app/1/\\xff (not text)"),
    "null": (None, "", "(not text)"),
    "text-not-utf8": ("text-not-utf8", "app/1/\udcff", "app/1/\\xff"),
}
GOOD = sum(len(items) for items in sample_entries().values())


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _fill(root: Path) -> Path:
    async def fill() -> Path:
        async with open_environment("warm", root=root) as env:
            for namespace, items in sample_entries().items():
                await env.storage(namespace).insert_many(items.items())
            return env.path

    return anyio.run(fill)


def _add_bad_row(path: Path, kind: str) -> None:
    """One row, written with sqlite3 as another program would, under a bad namespace."""
    stored, _, _ = KINDS[kind]
    conn = sqlite3.connect(path)
    with conn:
        if kind == "null":  # warmenv's table says NOT NULL; another program's may not
            columns = ", ".join(
                name for (name,) in conn.execute("SELECT name FROM pragma_table_info('entries')")
            )
            conn.execute("ALTER TABLE entries RENAME TO old_entries")
            conn.execute(
                "CREATE TABLE entries (namespace TEXT, key BLOB NOT NULL, value BLOB NOT NULL, "
                "origin INTEGER NOT NULL, written_at REAL, cost REAL, "
                "bundle INTEGER REFERENCES bundles (id), last_hit INTEGER, "
                "PRIMARY KEY (namespace, key))"
            )
            conn.execute(f"INSERT INTO entries ({columns}) SELECT {columns} FROM old_entries")
            conn.execute("DROP TABLE old_entries")
        if kind == "text-not-utf8":
            conn.execute(
                "INSERT INTO entries (namespace, key, value, origin) "
                "VALUES (CAST(X'6170702f312fff' AS TEXT), X'6b', X'76', 0)"
            )
        else:
            conn.execute(
                "INSERT INTO entries (namespace, key, value, origin) VALUES (?, X'6b', X'76', 0)",
                (stored,),
            )
    conn.close()


def _bad_rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        (count,) = conn.execute(
            "SELECT count(*) FROM entries WHERE typeof(namespace) != 'text' "
            "OR CAST(namespace AS BLOB) = X'6170702f312fff'"
        ).fetchone()
    finally:
        conn.close()
    return int(count)


@pytest.fixture
def bad_root(tmp_path: Path, kind: str) -> Path:
    """A root whose environment 'warm' holds `sample_entries()` and one bad row."""
    root = tmp_path / "root"
    _add_bad_row(_fill(root), kind)
    return root


# --- the library, on every backend --------------------------------------------------


@pytest.mark.anyio
async def test_gc_keeping_versions_leaves_a_namespace_that_is_not_utf8_text(
    bad_root: Path, kind: str
) -> None:
    # It raised "a namespace must be a non-empty str, got b'app/1/k'", or could not
    # decode the text, and evicted nothing.
    async with open_environment("warm", root=bad_root) as env:
        await env.storage("app/9/kernels").insert(b"new", b"v")  # written last: the newest
        purged = await env.gc(keep_versions=1)
        listed = {s.namespace for s in await env.namespaces()}
    assert isinstance(purged, Purged) and purged.count > 0
    assert "app/1/kernels" not in listed and "app/9/kernels" in listed
    assert KINDS[kind][1] in listed
    assert _bad_rows(bad_root / "warm.db") == 1


def test_gc_keep_versions_on_the_command_line_leaves_it_too(bad_root: Path) -> None:
    completed = warmenv("gc", "--keep-versions", "1", "--env", "warm", root=bad_root)
    assert completed.returncode == 0, completed.stderr
    assert "Traceback" not in completed.stderr and "unexpected" not in completed.stderr
    assert _bad_rows(bad_root / "warm.db") == 1


@pytest.mark.anyio
async def test_namespaces_list_a_namespace_that_is_not_utf8_text_flagged(
    bad_root: Path, kind: str
) -> None:
    async with open_environment("warm", root=bad_root) as env:
        summaries = {s.namespace: s for s in await env.namespaces()}
        listed = {n: s.entries for n, s in summaries.items()}
    assert listed[KINDS[kind][1]] == 1
    assert not summaries[KINDS[kind][1]].addressable
    assert summaries[KINDS[kind][1]].text is (kind == "text-not-utf8")
    assert all(summaries[n].addressable for n in sample_entries())
    assert {n: listed[n] for n in sample_entries()} == {
        n: len(items) for n, items in sample_entries().items()
    }


@pytest.mark.anyio
async def test_statistics_list_a_namespace_that_is_not_utf8_text_flagged(
    bad_root: Path, kind: str
) -> None:
    async with open_environment("warm", root=bad_root) as env:
        await env.storage(KERNELS).get(b"k001")  # a hit pending, resolved against the file
        statistics = await env.statistics()
    by_name = {s.namespace: s for s in statistics.namespaces}
    assert by_name[KINDS[kind][1]].entries == 1
    assert by_name[KINDS[kind][1]].text is (kind == "text-not-utf8")
    assert by_name[str(KERNELS)].entries == len(sample_entries()[str(KERNELS)])


@pytest.mark.anyio
async def test_explain_reads_past_a_namespace_that_is_not_utf8_text(
    bad_root: Path, kind: str
) -> None:
    async with open_environment("warm", root=bad_root) as env:
        explanation = await env.explain("app/1/k", b"k")
        str(explanation)
    assert explanation.entries == 0 and explanation.has_key is False
    bad = [n for n in explanation.nearby if n.namespace == KINDS[kind][1]]
    assert all(n.has_key is False for n in bad)  # no store reaches it: it holds nothing for one


@pytest.mark.anyio
async def test_purging_every_addressable_namespace_leaves_the_bad_row_and_only_it(
    bad_root: Path,
) -> None:
    async with open_environment("warm", root=bad_root) as env:
        for summary in await env.namespaces():
            if summary.addressable:
                assert not isinstance(await env.storage(summary.namespace).purge(), Exception)
        left = [s.entries for s in await env.namespaces()]
        path = env.path
    assert left == [1]
    assert _bad_rows(path) == 1


@pytest.mark.anyio
async def test_export_leaves_out_a_namespace_that_is_not_utf8_text(
    bad_root: Path, tmp_path: Path, kind: str
) -> None:
    out = tmp_path / "out.bundle"
    async with open_environment("warm", root=bad_root) as env:
        report = await export_bundle(env, out, name="skips", version="1")
    assert report.entries == GOOD
    assert report.left_out == 1  # it was left out in silence
    async with open_bundle(out) as bundle:
        await bundle.verify()
        exported = {s.namespace for s in await bundle.namespaces()}
    assert exported == set(sample_entries())


# --- the command line -------------------------------------------------------------


def _as_json_text(namespace: str) -> str:
    """How `--json` writes a namespace: valid UTF-8, a byte that was not UTF-8 as `\\xff`."""
    return namespace.replace("\udcff", "\\xff")


def test_ls_lists_a_namespace_that_is_not_utf8_text_and_succeeds(bad_root: Path, kind: str) -> None:
    completed = warmenv("ls", "--env", "warm", root=bad_root)
    assert completed.returncode == 0, completed.stderr
    assert KINDS[kind][2] in completed.stdout
    assert completed.stderr == ""
    as_json = warmenv("ls", "--env", "warm", "--json", root=bad_root)
    assert as_json.returncode == 0, as_json.stderr
    listed = {(n["namespace"], n["text"]) for n in json.loads(as_json.stdout)["namespaces"]}
    # --json is UTF-8 JSON: a byte that is not UTF-8 is written `\xff`, as on the terminal;
    # the name holds no marker, the flag says whether it is text
    assert (_as_json_text(KINDS[kind][1]), kind == "text-not-utf8") in listed


def test_stats_lists_a_namespace_that_is_not_utf8_text_and_succeeds(
    bad_root: Path, kind: str
) -> None:
    completed = warmenv("stats", "--env", "warm", root=bad_root)
    assert completed.returncode == 0, completed.stderr
    assert KINDS[kind][2] in completed.stdout
    assert "Traceback" not in completed.stderr


def test_explain_succeeds_beside_a_namespace_that_is_not_utf8_text(bad_root: Path) -> None:
    completed = warmenv("explain", "--env", "warm", "app/1/k", "k", root=bad_root)
    assert completed.returncode == 0, completed.stderr
    assert "app/1/kernels" in completed.stdout


def test_export_on_the_command_line_says_what_it_left_out(bad_root: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "out.bundle")
    completed = warmenv(
        "export", out, "--name", "n", "--app-version", "1", "--env", "warm", root=bad_root
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == (
        "warmenv: warning: left out 1 row whose namespace is not UTF-8 text "
        "(another program wrote them; `warmenv ls` lists them)\n"
    )
    as_json = warmenv(
        "export",
        out,
        "--name",
        "n",
        "--app-version",
        "1",
        "--env",
        "warm",
        "--json",
        root=bad_root,
    )
    assert json.loads(as_json.stdout)["left_out"] == 1


def test_purge_leaves_a_namespace_that_is_not_utf8_text_and_says_so(
    bad_root: Path, kind: str
) -> None:
    completed = warmenv("purge", "--env", "warm", "--namespace", "app", "--yes", root=bad_root)
    assert completed.returncode == 0, completed.stderr
    if kind == "null":  # a NULL reads as "", under no prefix: nothing to say
        assert completed.stderr == ""
    else:
        assert completed.stderr.count("\n") == 1, completed.stderr
        assert completed.stderr.startswith("warmenv: warning: ")
        assert "not UTF-8 text" in completed.stderr and "warm.db" in completed.stderr
        assert f"'{KINDS[kind][1]}'".replace("\udcff", "\\xff") in completed.stderr
        assert ("(not text)" in completed.stderr) is (kind != "text-not-utf8")
    listed = warmenv("ls", "--env", "warm", "--json", root=bad_root)
    left = {n["namespace"] for n in json.loads(listed.stdout)["namespaces"]}
    assert left == {
        "app2/1/kernels",
        _as_json_text(KINDS[kind][1]),
    }  # app/... purged, the bad row kept
    assert _bad_rows(bad_root / "warm.db") == 1


def test_purge_matching_only_a_namespace_that_is_not_utf8_text_is_one_error_line(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    path = _fill(root)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO entries (namespace, key, value, origin) VALUES (?, X'6b', X'76', 0)",
            (b"bad/1/k",),
        )
    conn.close()
    completed = warmenv("purge", "--env", "warm", "--namespace", "bad", "--yes", root=root)
    line = assert_one_error_line(completed, 1)
    assert "nothing deleted" in line and "'bad/1/k' (not text)" in line and "warm.db" in line
    listed = warmenv("ls", "--env", "warm", "--json", root=root)
    assert len(json.loads(listed.stdout)["namespaces"]) == len(sample_entries()) + 1


def test_a_blob_namespace_named_like_a_stores_is_its_own_row_flagged_not_text(
    tmp_path: Path,
) -> None:
    # The name is the name, the flag says the type: a BLOB 'app/1/kernels' beside the
    # store's text 'app/1/kernels' is two namespaces, never added up, never purged as one.
    root = tmp_path / "root"
    path = _fill(root)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO entries (namespace, key, value, origin) VALUES (?, X'6b', X'76', 0)",
            (str(KERNELS).encode(),),
        )
    conn.close()

    async def read() -> tuple[set[tuple[str, bool, int]], set[tuple[str, bool, int]]]:
        async with open_environment("warm", root=root) as env:
            listed = {(s.namespace, s.text, s.entries) for s in await env.namespaces()}
            counted = {
                (s.namespace, s.text, s.entries) for s in (await env.statistics()).namespaces
            }
        return listed, counted

    listed, counted = anyio.run(read)
    kernels = len(sample_entries()[str(KERNELS)])
    assert {(str(KERNELS), True, kernels), (str(KERNELS), False, 1)} <= listed
    assert listed == counted
    as_json = warmenv("ls", "--env", "warm", "--json", root=root)
    assert {"namespace": str(KERNELS), "entries": 1, "bytes": 2, "text": False} in json.loads(
        as_json.stdout
    )["namespaces"]
    shown = warmenv("stats", "--env", "warm", root=root)
    assert f"{KERNELS} (not text)" in shown.stdout, shown.stdout
    stats_json = json.loads(warmenv("stats", "--env", "warm", "--json", root=root).stdout)
    assert [
        (n["text"], n["entries"])
        for n in stats_json["namespaces"]
        if n["namespace"] == str(KERNELS)
    ] == [
        (False, 1),
        (True, kernels),
    ]
    purged = warmenv(
        "purge", "--env", "warm", "--namespace", str(KERNELS), "--yes", "--json", root=root
    )
    assert purged.returncode == 0, purged.stderr
    document = json.loads(purged.stdout)
    assert document["deleted"] == kernels
    assert document["left"] == [
        {"namespace": str(KERNELS), "entries": 1, "bytes": 2, "text": False}
    ]
    assert _bad_rows(path) == 1
