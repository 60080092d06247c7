"""A SQLite bundle's schema is input: only the exact tables warmenv writes are read (issue 22, 3).

Each hostile bundle here is a real export whose rows are kept as they are (so
its digest still vouches for them) and whose schema is rewritten with sqlite3:
a collation, a view, a trigger, a generated column, WITHOUT ROWID, a UTF-16
encoding, an index with a collation, a default. A NOCASE namespace made
`verify` say ok while `inspect` merged two namespaces and an import of one
found nothing; each trick must be refused, as not a bundle, by verify, inspect
and import alike, with one line naming what is wrong, and nothing imported.
So must a bundle whose meta `schema_version` is not the format its tables are.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import anyio
import pytest

from conftest import env_contents
from helpers import counted
from test_cli import warmenv
from warmenv import Environment, blocking, open_environment
from warmenv.bundle import NotABundleError, export_bundle, import_bundle, open_bundle

pytestmark = pytest.mark.anyio

ENTRIES_2 = (
    "namespace TEXT NOT NULL{ns}, key BLOB NOT NULL, value BLOB NOT NULL, "
    "origin INTEGER NOT NULL, written_at REAL, cost REAL{extra}, PRIMARY KEY (namespace, key)"
)
COLUMNS_2 = "namespace, key, value, origin, written_at, cost"


_TRICKS = (
    "SQLite bundle schema tricks: collations, views, triggers, generated columns, WITHOUT "
    "ROWID, defaults, extra index or table, UTF-16 (asyncio, uvloop, trio)",
    "NotABundleError naming the trick from verify, inspect and import; nothing written",
)


def _entries(ns: str = "", extra: str = "", after: str = "") -> list[str]:
    """Statements replacing the entries table by one of the definition given, rows kept."""
    return [
        "ALTER TABLE entries RENAME TO stored",
        f"CREATE TABLE entries ({ENTRIES_2.format(ns=ns, extra=extra)}){after}",
        f"INSERT INTO entries ({COLUMNS_2}) SELECT {COLUMNS_2} FROM stored ORDER BY rowid",
        "DROP TABLE stored",
    ]


# (case, statements run on a copy of the export, what the refusal names)
TRICKS: list[tuple[str, list[str], str]] = [
    ("nocase namespace", _entries(ns=" COLLATE NOCASE"), "table 'entries' is not as"),
    ("rtrim namespace", _entries(ns=" COLLATE RTRIM"), "table 'entries' is not as"),
    ("without rowid", _entries(after=" WITHOUT ROWID"), "table 'entries' is not as"),
    (
        "generated column",
        _entries(extra=", shown TEXT GENERATED ALWAYS AS (lower(namespace)) VIRTUAL"),
        "table 'entries' is not as",
    ),
    ("default", _entries(ns=" DEFAULT 'app/1/kernels'"), "table 'entries' is not as"),
    (
        "view named entries",
        ["ALTER TABLE entries RENAME TO stored", "CREATE VIEW entries AS SELECT * FROM stored"],
        "view 'entries'",
    ),
    ("another view", ["CREATE VIEW names AS SELECT namespace FROM entries"], "view 'names'"),
    (
        "trigger",
        ["CREATE TRIGGER t AFTER INSERT ON entries BEGIN DELETE FROM meta; END"],
        "trigger 't'",
    ),
    (
        "index with a collation",
        ["CREATE INDEX by_name ON entries (namespace COLLATE NOCASE, key)"],
        "index 'by_name'",
    ),
    (
        "nocase meta",
        [
            "ALTER TABLE meta RENAME TO old_meta",
            "CREATE TABLE meta (k TEXT PRIMARY KEY COLLATE NOCASE, v TEXT NOT NULL)",
            "INSERT INTO meta SELECT * FROM old_meta",
            "DROP TABLE old_meta",
        ],
        "table 'meta' is not as",
    ),
    ("another table", ["CREATE TABLE notes (x)"], "table 'notes'"),
]


@pytest.fixture
async def export(warm_env: Environment, tmp_path: Path) -> Path:
    out = tmp_path / "real.bundle"
    await export_bundle(warm_env, out, name="real", version="1", format="sqlite")
    return out


def rewritten(export: Path, statements: list[str]) -> Path:
    """A copy of `export` with `statements` run on it (rows and manifest untouched)."""
    path = export.with_name("hostile.bundle")
    shutil.copyfile(export, path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()
    return path


def reencoded(export: Path, encoding: str) -> Path:
    """`export` rebuilt, the same definitions and rows, in a new file of another text
    encoding (fixed before its first table; ATTACH refuses mixed encodings)."""
    path = export.with_name(f"{encoding}.bundle")
    source = sqlite3.connect(export)
    target = sqlite3.connect(path, isolation_level=None)
    try:
        target.execute(f"PRAGMA encoding = '{encoding}'")
        target.execute("PRAGMA synchronous = OFF")  # a scratch file: no fsync per row
        tables = source.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
        for name, sql in tables.fetchall():
            target.execute(sql)
            rows = source.execute(f"SELECT * FROM {name} ORDER BY rowid").fetchall()
            marks = ", ".join("?" * len(rows[0]))
            target.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
    finally:
        source.close()
        target.close()
    return path


async def assert_refused(path: Path, why: str, cold_env: Environment) -> None:
    with pytest.raises(NotABundleError, match=why) as caught:
        async with open_bundle(path) as bundle:  # inspect, verify
            await bundle.verify()
    assert "not a warmenv bundle" in str(caught.value)
    assert "\n" not in str(caught.value)
    for verify in (True, False):
        with pytest.raises(NotABundleError, match=why):
            await import_bundle(path, cold_env, verify=verify)
    assert await env_contents(cold_env) == {}
    assert (await cold_env.statistics()).bundles == []


@pytest.mark.parametrize(("case", "statements", "why"), TRICKS, ids=[t[0] for t in TRICKS])
@counted(*_TRICKS)
async def test_a_bundle_whose_schema_is_not_ours_is_refused_by_every_reader(
    export: Path, cold_env: Environment, case: str, statements: list[str], why: str
) -> None:
    await assert_refused(rewritten(export, statements), why, cold_env)


@pytest.mark.parametrize("encoding", ["UTF-16le", "UTF-16be"])
@counted(*_TRICKS)
async def test_a_bundle_whose_text_is_not_utf8_is_refused_by_every_reader(
    export: Path, cold_env: Environment, encoding: str
) -> None:
    await assert_refused(reencoded(export, encoding), f"its text encoding is {encoding}", cold_env)


@counted(*_TRICKS)
async def test_a_format_1_bundle_with_a_collation_is_refused(
    warm_env: Environment, cold_env: Environment, tmp_path: Path
) -> None:
    out = tmp_path / "one.bundle"
    await export_bundle(warm_env, out, name="one", version="1", format="sqlite", format_version=1)
    columns = "namespace, key, value, origin"
    hostile = rewritten(
        out,
        [
            "ALTER TABLE entries RENAME TO stored",
            "CREATE TABLE entries (namespace TEXT NOT NULL COLLATE NOCASE, key BLOB NOT NULL, "
            "value BLOB NOT NULL, origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))",
            f"INSERT INTO entries SELECT {columns} FROM stored ORDER BY rowid",
            "DROP TABLE stored",
        ],
    )
    await assert_refused(hostile, "table 'entries' is not as", cold_env)


async def test_our_definitions_written_otherwise_are_still_read(
    export: Path, cold_env: Environment
) -> None:
    # 0.1 wrote its tables over several lines, with IF NOT EXISTS: what SQLite
    # keeps of a definition is compared, spacing and case aside.
    hostile = rewritten(
        export,
        [
            "ALTER TABLE entries RENAME TO stored",
            "create table IF NOT EXISTS entries (\n    namespace text not null,\n"
            "    key BLOB NOT NULL,\n    value BLOB NOT NULL,\n    origin INTEGER NOT NULL,\n"
            "    written_at REAL,\n    cost REAL,\n    PRIMARY KEY ( namespace , key )\n)",
            f"INSERT INTO entries SELECT {COLUMNS_2} FROM stored ORDER BY rowid",
            "DROP TABLE stored",
        ],
    )
    report = await import_bundle(hostile, cold_env)
    assert report.imported > 0


def test_the_cli_refuses_a_nocase_bundle_in_verify_inspect_and_import(tmp_path: Path) -> None:
    """The issue's case: `APP/1/k` and `app/1/k` under a NOCASE namespace column (a
    sync test: the commands run in their own processes, on their own loop)."""

    async def fill() -> None:
        async with open_environment("two", root=tmp_path / "source") as source:
            for key, namespace in ((b"a", "APP/1/k"), (b"b", "app/1/k")):
                await source.storage(namespace).insert_many([(key, namespace.encode())])

    anyio.run(fill)
    out = tmp_path / "two.bundle"
    blocking.export_bundle(tmp_path / "source", out, name="two", version="1")
    path = rewritten(out, _entries(ns=" COLLATE NOCASE"))
    root = tmp_path / "root"
    for args in (["verify"], ["inspect"], ["import", "--env", "e"]):
        completed = warmenv(args[0], str(path), *args[1:], root=root)
        assert completed.returncode != 0, (args, completed.stdout)
        assert "table 'entries' is not as warmenv writes it" in completed.stderr, completed.stderr
        assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert not list(root.glob("*.db"))


# --- the format a bundle claims is the format its tables are ---------------------------------

_VERSION = (
    "SQLite bundle whose meta schema_version is not its tables' format: 1 on format 2's "
    "tables, 2 on format 1's, missing, empty, unknown, not text, over 64 bytes "
    "(asyncio, uvloop, trio)",
    "NotABundleError naming the schema_version from verify, inspect and import; nothing written",
)


def _version(value: str) -> list[str]:
    return [f"UPDATE meta SET v = {value} WHERE k = 'schema_version'"]


# (case, the format exported, statements run on it, what the refusal names)
VERSIONS: list[tuple[str, int, list[str], str]] = [
    ("format 2 claiming 1", 2, _version("'1'"), "says format 1, but its tables are format 2's"),
    ("format 1 claiming 2", 1, _version("'2'"), "says format 2, but its tables are format 1's"),
    (
        "missing",
        2,
        ["DELETE FROM meta WHERE k = 'schema_version'"],
        "its meta table has no schema_version",
    ),
    ("empty", 2, _version("''"), "schema_version '' names no format"),
    ("zero", 2, _version("'0'"), "schema_version '0' names no format"),
    ("leading zero", 2, _version("'02'"), "schema_version '02' names no format"),
    ("decimal", 2, _version("'2.0'"), "schema_version '2.0' names no format"),
    ("spaced", 1, _version("' 1'"), "schema_version ' 1' names no format"),
    ("negative", 1, _version("'-1'"), "schema_version '-1' names no format"),
    ("a word", 2, _version("'two'"), "schema_version 'two' names no format"),
    ("a blob", 2, _version("x'32'"), "schema_version is a blob, not text"),
    ("control characters", 2, _version("'2' || char(27) || '[2J'"), r"'2\\x1b\[2J' names"),
    (
        "over 64 bytes",
        2,
        _version("'2' || printf('%.*c', 100, ' ')"),
        "schema_version is over 64 bytes",
    ),
]


@pytest.mark.parametrize(
    ("case", "format_version", "statements", "why"), VERSIONS, ids=[v[0] for v in VERSIONS]
)
@counted(*_VERSION)
async def test_a_bundle_claiming_a_format_its_tables_are_not_is_refused_by_every_reader(
    warm_env: Environment,
    cold_env: Environment,
    tmp_path: Path,
    case: str,
    format_version: int,
    statements: list[str],
    why: str,
) -> None:
    out = tmp_path / "real.bundle"
    await export_bundle(
        warm_env, out, name="real", version="1", format="sqlite", format_version=format_version
    )
    await assert_refused(rewritten(out, statements), why, cold_env)


@pytest.mark.parametrize("format_version", [1, 2])
async def test_a_bundle_claiming_its_own_format_is_read(
    warm_env: Environment, cold_env: Environment, tmp_path: Path, format_version: int
) -> None:
    out = tmp_path / "real.bundle"
    await export_bundle(
        warm_env, out, name="real", version="1", format="sqlite", format_version=format_version
    )
    report = await import_bundle(out, cold_env)
    assert report.imported > 0
    assert await env_contents(cold_env) == await env_contents(warm_env)


def test_the_cli_refuses_a_bundle_claiming_another_format_in_one_line(tmp_path: Path) -> None:
    async def fill() -> None:
        async with open_environment("one", root=tmp_path / "source") as source:
            await source.storage("app/1/k").insert_many([(b"a", b"1")])

    anyio.run(fill)
    out = tmp_path / "one.bundle"
    blocking.export_bundle(
        tmp_path / "source", out, name="one", version="1", format="sqlite", format_version=1
    )
    path = rewritten(out, _version("'2'"))
    root = tmp_path / "root"
    for args in (["verify"], ["inspect"], ["import", "--env", "e"]):
        completed = warmenv(args[0], str(path), *args[1:], root=root)
        assert completed.returncode != 0, (args, completed.stdout)
        assert "says format 2, but its tables are format 1's" in completed.stderr, completed.stderr
        assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert not list(root.glob("*.db"))
