"""Only a file warmenv can prove is its own is ever written, upgraded or rebuilt (issue 22).

Another program's SQLite database, a file that is not SQLite, an empty file
warmenv did not create: each is refused with one line naming it and left
byte for byte as it was, by the library and by every command; a read-only
command never creates, converts or rebuilds anything. Environments written
before the mark existed (0.1's version 1, and version 2 as the code before
this rule wrote it, run from the clone's history) still open, and get marked.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path

import pytest

from helpers import backend_label, one_trial, run_python
from test_cli import warmenv
from test_cli_errors import assert_one_error_line
from test_schema2 import V1_ENTRIES, build_v1, file_state
from warmenv import NotAnEnvironmentError, WarmenvError, open_environment
from warmenv.persistence.sqlite.opening import APPLICATION_ID
from warmenv.persistence.sqlite.schema import ENTRY_COLUMNS, ENVIRONMENT_COLUMNS
from warmenv.persistence.storage import Failed, Stored

pytestmark = pytest.mark.anyio

# The last commit before environments were marked: its schema module is run in a
# child to write a version-2 environment exactly as that code did.
BEFORE_THE_MARK = "9248de2"
REPOSITORY = Path(__file__).resolve().parent.parent
OLD_SCHEMA = "src/warmenv/persistence/sqlite/schema.py"


def _sqlite_file(path: Path, *statements: str, wal: bool = False) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    for statement in statements:
        conn.execute(statement)
    conn.close()


def _someones_entries(path: Path) -> None:  # the case
    _sqlite_file(
        path,
        "CREATE TABLE entries (id INTEGER PRIMARY KEY, title TEXT)",
        "INSERT INTO entries VALUES (1, 'my notes')",
        "CREATE TABLE meta (k, v)",
    )


def _no_entries_table(path: Path) -> None:
    _sqlite_file(path, "CREATE TABLE notes (x)", "INSERT INTO notes VALUES ('mine')")


def _wal_mode_database(path: Path) -> None:
    _sqlite_file(path, "CREATE TABLE t (x)", "INSERT INTO t VALUES (1)", wal=True)


def _wal_mode_database_with_its_log(path: Path) -> None:
    # Its writer ended without closing it: the commits are in the -wal beside it, and the
    # last read-write connection to close it would fold them in and delete the -wal/-shm.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0'); "
            "c.execute('CREATE TABLE mine (a)'); c.execute('INSERT INTO mine VALUES (1)'); "
            "c.commit(); os._exit(0)",
            str(path),
        ],
        check=True,
    )
    assert path.with_name(path.name + "-wal").stat().st_size > 0


def _meta_only(path: Path) -> None:  # our meta's exact columns and version, nothing else
    _sqlite_file(
        path,
        "CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
        "INSERT INTO meta VALUES ('schema_version', '2')",
    )


def _our_shape_another_programs_id(path: Path) -> None:
    build_v1(path, V1_ENTRIES, wal=False)
    _sqlite_file(path, "PRAGMA application_id = 1196444487")  # GeoPackage's "GPKG"


def _our_shape_with_a_foreign_key_in_meta(path: Path) -> None:
    build_v1(path, V1_ENTRIES, wal=False)
    _sqlite_file(path, "INSERT INTO meta VALUES ('owner', 'someone else')")


def _empty_file(path: Path) -> None:
    path.write_bytes(b"")


def _not_sqlite(path: Path) -> None:
    path.write_bytes(b"name,score\nada,10\n")


def _symlink_to_someones_empty_file(path: Path) -> None:
    target = path.parent.parent / "someone-else" / "empty"
    target.parent.mkdir()
    target.write_bytes(b"")
    path.symlink_to(target)


FOREIGN: dict[str, Callable[[Path], None]] = {
    "someones-entries": _someones_entries,
    "no-entries-table": _no_entries_table,
    "wal-mode": _wal_mode_database,
    "wal-mode-with-its-log": _wal_mode_database_with_its_log,
    "meta-only": _meta_only,
    "another-application-id": _our_shape_another_programs_id,
    "foreign-meta-key": _our_shape_with_a_foreign_key_in_meta,
    "empty-file": _empty_file,
    "not-sqlite": _not_sqlite,
    "symlink-to-an-empty-file": _symlink_to_someones_empty_file,
}


def _state(directory: Path) -> dict[str, str]:
    """Every file under `directory` (through symlinks) and a digest of its bytes.

    A -shm file is SQLite's shared memory for a WAL database's readers (an
    index of the -wal and their read marks, which any reader of the file,
    its owner's included, writes): only that it is there counts. The
    database and its -wal are compared byte for byte.
    """
    state = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            digest = "" if path.name.endswith("-shm") else sha256(path.read_bytes()).hexdigest()
            state[str(path.relative_to(directory))] = digest
    return state


_LIBRARY_CHECKED = (
    "writable and read-only opens: NotAnEnvironmentError naming the file in one line; "
    "every byte under the directory unchanged, nothing created"
)
_COMMANDS_CHECKED = (
    "exit 1, one line naming the file; every byte under the root unchanged, nothing created"
)
_COMMANDS = "ls, stats, explain, export on files that are not warmenv's (issue 22's and 9 kinds)"


@pytest.fixture(params=sorted(FOREIGN))
def foreign(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    FOREIGN[request.param](root / "e.db")
    return root / "e.db"


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
async def test_a_file_that_is_not_ours_is_refused_by_name_and_left_as_it_was(
    foreign: Path, read_only: bool, anyio_backend: object
) -> None:
    scenario = f"open_environment on {len(FOREIGN)} kinds of file that are not warmenv's"
    with one_trial(f"{scenario} ({backend_label(anyio_backend)})", _LIBRARY_CHECKED):
        before = _state(foreign.parent.parent)
        with pytest.raises(NotAnEnvironmentError, match="is not a warmenv environment") as caught:
            async with open_environment(file=foreign, read_only=read_only):
                pass
        assert isinstance(caught.value, WarmenvError) and caught.value.path == foreign
        assert str(foreign) in str(caught.value) and "\n" not in str(caught.value)
        assert _state(foreign.parent.parent) == before


@pytest.mark.parametrize("command", ["ls", "stats", "explain", "export"])
def test_a_read_only_command_refuses_someones_database_and_keeps_their_rows(
    tmp_path: Path, command: str
) -> None:
    root = tmp_path / "d"
    root.mkdir()
    _someones_entries(root / "app.db")
    with one_trial(_COMMANDS, _COMMANDS_CHECKED):
        _refused_by_command(tmp_path, root, command)


def _refused_by_command(tmp_path: Path, root: Path, command: str) -> None:
    before = _state(root)
    args = {
        "ls": ["ls"],
        "stats": ["stats"],
        "explain": ["explain", "app/1/k"],
        "export": ["export", str(tmp_path / "out.bundle"), "--name", "n", "--app-version", "1"],
    }[command]
    completed = warmenv(*args, "--env", "app", root=root)
    line = assert_one_error_line(completed, 1)
    assert line.startswith(
        f"warmenv: error: cannot use environment 'app': {root / 'app.db'} is not a warmenv "
        "environment: "
    )
    assert _state(root) == before
    assert not (tmp_path / "out.bundle").exists()
    with contextlib.closing(sqlite3.connect(root / "app.db")) as conn:
        assert conn.execute("SELECT * FROM entries").fetchall() == [(1, "my notes")]


def test_ls_names_each_kind_of_foreign_file_and_changes_none(foreign: Path) -> None:
    root = foreign.parent.parent
    with one_trial(_COMMANDS, _COMMANDS_CHECKED):
        before = _state(root)
        completed = warmenv("ls", "--env", "e", root=foreign.parent)
        assert "is not a warmenv environment: " in assert_one_error_line(completed, 1)
        assert _state(root) == before


@pytest.mark.parametrize("bundle_format", ["sqlite", "flat"])
def test_export_of_a_foreign_database_in_wal_mode_leaves_it_as_it_was(
    tmp_path: Path, bundle_format: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _wal_mode_database_with_its_log(root / "theirs.db")
    before = _state(root)
    out = tmp_path / "out.bundle"
    completed = warmenv(
        "export", str(out), "--name", "n", "--app-version", "1", "--format", bundle_format,
        str(root / "theirs.db"), root=tmp_path / "warmenv-root",
    )  # fmt: skip
    assert "is not a warmenv environment" in assert_one_error_line(completed, 1)
    assert _state(root) == before
    assert not out.exists()


def test_export_refuses_each_kind_of_foreign_source_file_and_changes_none(
    foreign: Path, tmp_path: Path
) -> None:
    # The one ownership proof (opening.prove_unwritten) holds for an export's SOURCE as
    # for an environment: another program's id or meta key on our shape is not ours.
    root = foreign.parent.parent
    before = _state(root)
    out = tmp_path / "out.bundle"
    completed = warmenv(
        "export", str(out), "--name", "n", "--app-version", "1", str(foreign),
        root=tmp_path / "warmenv-root",
    )  # fmt: skip
    assert "is not a warmenv environment" in assert_one_error_line(completed, 1)
    assert _state(root) == before
    assert not out.exists()


async def test_an_environment_opened_read_only_refuses_every_write(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        assert isinstance(await env.storage("app/1/k").insert(b"k", b"v"), Stored)
    before = _state(root)
    async with open_environment("e", root=root, read_only=True) as env:
        storage = env.storage("app/1/k")
        assert isinstance(await storage.insert(b"k2", b"v2"), Failed)
        assert isinstance(await storage.purge(), Failed)
        assert await storage.get(b"k") == b"v"
    assert _state(root) == before


def test_ls_of_a_directory_named_like_an_environment_says_what_it_is(tmp_path: Path) -> None:
    (tmp_path / "r" / "e.db").mkdir(parents=True)
    completed = warmenv("ls", "--env", "e", root=tmp_path / "r")
    line = assert_one_error_line(completed, 1)
    assert f"{tmp_path / 'r' / 'e.db'} is a directory, not a database file" in line
    assert list((tmp_path / "r" / "e.db").iterdir()) == []


def test_a_read_only_command_never_upgrades_a_version_1_file(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    path = tmp_path / "r" / "old.db"
    build_v1(path, V1_ENTRIES, wal=True)
    before = _state(tmp_path / "r")
    completed = warmenv("ls", "--env", "old", root=tmp_path / "r")
    assert completed.returncode == 0, completed.stderr
    assert "app/1/kernels" in completed.stdout
    assert _state(tmp_path / "r") == before
    assert file_state(path) == ("1", ENTRY_COLUMNS, len(V1_ENTRIES))


async def test_reading_an_environment_opens_it_as_it_is_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    build_v1(path, V1_ENTRIES, wal=True)
    before = _state(tmp_path)
    async with open_environment(file=path, read_only=True) as env:
        assert env.read_only and env.degraded is None
        assert await env.storage("app/1/kernels").get(b"k1") == b"local kernel"
    assert _state(tmp_path) == before
    with pytest.raises(FileNotFoundError):
        async with open_environment(file=tmp_path / "missing.db", read_only=True):
            pass
    assert not (tmp_path / "missing.db").exists()


def _application_id(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("PRAGMA application_id").fetchone()[0])


async def test_a_new_environment_is_marked_and_leaves_nothing_beside_it(root: Path) -> None:
    async with open_environment("e", root=root) as env:
        await env.storage("a/1").insert(b"k", b"v")
    assert _application_id(root / "e.db") == APPLICATION_ID
    assert sorted(p.name for p in root.iterdir()) == ["e.db"]


async def test_a_version_1_environment_of_0_1_opens_upgraded_and_marked(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    build_v1(path, V1_ENTRIES, wal=False)
    async with open_environment(file=path) as env:
        assert not env.in_memory and not env.read_only
        assert await env.storage("app/1/kernels").get(b"k2") == b"imported kernel"
    assert _application_id(path) == APPLICATION_ID
    assert file_state(path) == ("2", ENVIRONMENT_COLUMNS, len(V1_ENTRIES))


# Run in a child: the schema module of the code before the mark, from the clone's
# history, creates a version-2 environment and stores one entry as it did.
_OLD_CODE = """
import importlib.util, sqlite3, sys
spec = importlib.util.spec_from_loader("old_schema", loader=None)
old = importlib.util.module_from_spec(spec)
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), old.__dict__)
conn = sqlite3.connect(sys.argv[2], isolation_level=None)
old.prepare_writable(conn)
conn.execute(
    "INSERT INTO entries (namespace, key, value, origin, written_at) "
    "VALUES ('app/1/kernels', x'6b', x'76', 0, 1.0)"
)
conn.close()
"""


def _old_schema_source() -> str:
    shown = subprocess.run(
        ["git", "-C", str(REPOSITORY), "show", f"{BEFORE_THE_MARK}:{OLD_SCHEMA}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, (
        f"this test reads {BEFORE_THE_MARK} from the clone's history (a full clone: "
        f"git fetch --unshallow): {shown.stderr}"
    )
    return shown.stdout


async def test_a_version_2_environment_of_the_code_before_the_mark_opens_and_is_marked(
    tmp_path: Path,
) -> None:
    old_schema = tmp_path / "code" / "old_schema.py"
    old_schema.parent.mkdir()
    old_schema.write_text(_old_schema_source())
    (tmp_path / "envs").mkdir()
    path = tmp_path / "envs" / "before.db"
    made = run_python(_OLD_CODE, str(old_schema), str(path), timeout=60)
    assert made.returncode == 0, made.stderr
    assert _application_id(path) == 0
    before = _state(tmp_path / "envs")
    async with open_environment(file=path, read_only=True) as env:  # reading marks nothing
        assert await env.storage("app/1/kernels").get(b"k") == b"v"
    assert _state(tmp_path / "envs") == before
    async with open_environment(file=path) as env:
        assert not env.in_memory and not env.read_only
        assert await env.storage("app/1/kernels").get(b"k") == b"v"
    assert _application_id(path) == APPLICATION_ID


# --- exactly our schema: no view, trigger or declaration warmenv never writes --------

_ENDLESS_VIEW = (
    "CREATE VIEW entries AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
    "SELECT 'app/1/k' AS namespace, CAST(i AS BLOB) AS key, x'00' AS value, 0 AS origin, "
    "NULL AS written_at, NULL AS cost, NULL AS bundle, NULL AS last_hit FROM n"
)


def _endless_view(path: Path, *, marked: bool) -> None:
    """An `entries` view that never ends (the issue's case), in an unmarked or a marked file."""
    _sqlite_file(
        path,
        *([f"PRAGMA application_id = {APPLICATION_ID}"] if marked else []),
        "CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
        "INSERT INTO meta VALUES ('schema_version', '2')",
        _ENDLESS_VIEW,
    )


@pytest.mark.parametrize("marked", [False, True], ids=["unmarked", "marked"])
@pytest.mark.parametrize("command", ["ls", "stats", "export"])
def test_an_entries_view_is_refused_at_once_not_read_for_ever(
    tmp_path: Path, command: str, marked: bool
) -> None:
    root = tmp_path / "r"
    root.mkdir()
    _endless_view(root / "e.db", marked=marked)
    with one_trial(_VIEW, "exit 1 at once, one line naming the view; nothing created or changed"):
        _view_refused(tmp_path, root, command)


_VIEW = "ls, stats, export of an environment whose entries is an endless view (marked or not)"


def _view_refused(tmp_path: Path, root: Path, command: str) -> None:
    before = _state(root)
    args = {
        "ls": ["ls"],
        "stats": ["stats"],
        "export": ["export", str(tmp_path / "o.bundle"), "--name", "n", "--app-version", "1"],
    }[command]
    # A child with a timeout: reading the view never ends, so a hang is the failure.
    completed = warmenv(*args, "--env", "e", root=root)
    line = assert_one_error_line(completed, 1)
    assert "is not a warmenv environment: it has a view 'entries'" in line, line
    assert _state(root) == before and not (tmp_path / "o.bundle").exists()


async def test_a_trigger_added_to_an_environment_is_refused_at_the_next_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "e.db"
    async with open_environment(file=path) as env:
        await env.storage("app/1/k").insert(b"k", b"v")
    _sqlite_file(
        path,
        "CREATE TABLE log (x)",
        "CREATE TRIGGER spy AFTER INSERT ON entries BEGIN INSERT INTO log VALUES (new.key); END",
        "DROP TABLE log",
    )
    with pytest.raises(NotAnEnvironmentError, match="it has a trigger 'spy'"):
        async with open_environment(file=path):
            pass


@pytest.mark.parametrize(
    "declared",
    [
        "namespace TEXT COLLATE NOCASE NOT NULL",
        "namespace TEXT NOT NULL GENERATED ALWAYS AS ('app/1/k') VIRTUAL",
    ],
    ids=["collation", "generated-column"],
)
async def test_a_marked_file_whose_entries_table_we_never_declared_is_refused(
    tmp_path: Path, declared: str
) -> None:
    path = tmp_path / "e.db"
    _sqlite_file(
        path,
        f"PRAGMA application_id = {APPLICATION_ID}",
        "CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
        "INSERT INTO meta VALUES ('schema_version', '2')",
        f"CREATE TABLE entries ({declared}, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, written_at REAL, cost REAL, bundle INTEGER, "
        "last_hit INTEGER)",
    )
    before = _state(tmp_path)
    with pytest.raises(NotAnEnvironmentError, match="its table 'entries'"):
        async with open_environment(file=path):
            pass
    assert _state(tmp_path) == before
