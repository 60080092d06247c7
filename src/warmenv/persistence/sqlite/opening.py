"""Opening an environment file: proving it is warmenv's, then preparing it.

Only a file warmenv can prove is its own is ever written, upgraded or
rebuilt. An environment is marked the SQLite way, `PRAGMA application_id =
APPLICATION_ID`, set in the transaction that creates its tables (a file
warmenv creates is built under a private name and linked into place, so it
is never seen unmarked), plus its `meta` table. A file written before the
mark existed is proven ours by its shape alone: exactly our tables, a
`meta` of our columns holding only our keys and a schema version warmenv
wrote (1 or 2) with that version's `entries` columns; the first writable
open marks it. Anything else at an environment's path (a SQLite database of
another program, a file that is not SQLite, an empty file warmenv did not
make) is refused with `NotAnEnvironmentError` and left byte for byte as it
is; a newer warmenv's file (`NewerSchemaError`) and a bundle are left alone
too. A read-only open (`prepare_readonly`) proves the same and writes
nothing, and `prove_unwritten` makes that proof before any read-write
connection touches an existing file (the environment's open and an export's
sources alike). Every function runs on a worker thread.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import attrs

from warmenv import _sqlite
from warmenv._errors import WarmenvError
from warmenv.persistence.sqlite import schema, uris
from warmenv.persistence.sqlite.schema import (
    CARRIED_COLUMNS,
    ENVIRONMENT_VERSION,
    IMPORTS_TABLE,
    SCHEMA_VERSION,
    SIGNERS_TABLE,
    STATISTICS_TABLES,
    transaction,
)

__all__ = [
    "APPLICATION_ID",
    "EnvironmentLockedError",
    "NewerSchemaError",
    "NotAnEnvironmentError",
    "Prepared",
    "prepare_new",
    "prepare_readonly",
    "prepare_writable",
    "is_busy",
    "is_marked_environment",
    "prove_unwritten",
]

APPLICATION_ID = 0x5741524D
"""`PRAGMA application_id` of every environment file: the bytes "WARM"."""
_APPLICATION_ID_AT = 68  # in the SQLite file's header, big-endian


def is_marked_environment(head: bytes) -> bool:
    """Whether a SQLite file (its format told by its magic, `bundle.formats.sniff`) that
    starts with `head` (its first 100 bytes or more) carries the environments' mark:
    named so where it is refused as something else (an export's OUT), never advised
    away as a stranger's file."""
    mark = head[_APPLICATION_ID_AT : _APPLICATION_ID_AT + 4]
    return mark == APPLICATION_ID.to_bytes(4, "big")


# SIGNERS_TABLE is made by the first import whose signature was checked, so it may be absent.
_OUR_TABLES = frozenset(
    {"meta", "entries", "bundles", *STATISTICS_TABLES, IMPORTS_TABLE, SIGNERS_TABLE}
)
_OUR_META_KEYS = frozenset({"schema_version", "upgraded_at"})
_META_COLUMNS = [("k", "TEXT"), ("v", "TEXT")]
# Declarations no table warmenv ever made has (in its CREATE TABLE, case and spacing aside).
_NEVER_DECLARED = ("COLLATE", "WITHOUT ROWID", "GENERATED", " AS ", "STRICT")
_CARRIED_VERSION = "2"


class NotAnEnvironmentError(WarmenvError):
    """The file at an environment's path is not one warmenv made: it was left as it is."""

    def __init__(self, why: str, path: Path | None = None) -> None:
        self.why = why
        """What the file is instead (one clause)."""
        self.path = path
        """The file, once known (the check runs where only the connection is)."""
        where = f"{path} is not a warmenv environment" if path else "not a warmenv environment"
        super().__init__(
            f"{where}: {why}; it was left as it is (move it away, or open another environment)"
        )

    def at(self, path: Path) -> NotAnEnvironmentError:
        """The same refusal, naming `path`."""
        return NotAnEnvironmentError(self.why, path)


class EnvironmentLockedError(WarmenvError):
    """Another process held the environment locked for longer than the lock timeout.

    Busy is not read-only: nothing was opened, and the next open, once the
    other process is done, opens the file as it is.
    """

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        super().__init__(
            f"{path} is locked by another process (waited {timeout:g} s, the lock_timeout); "
            "retry when it is done, or allow a longer lock_timeout"
        )


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for another connection's lock (`SQLITE_BUSY`)."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY


class NewerSchemaError(sqlite3.DatabaseError):
    """The file was written by a newer warmenv: left untouched rather than dropped."""


@attrs.frozen
class Prepared:
    """What opening an environment for writing found and did."""

    rebuilt_from: str | None = None
    """The unreadable version whose entries were dropped (None: nothing dropped)."""
    upgraded_from: str | None = None
    """The version upgraded in place (every entry kept)."""
    marked: bool = False
    """Whether a file of an earlier warmenv was given the `application_id` now."""


@attrs.frozen
class _Ours:
    """A file proven warmenv's: its version (1 or 2; None: marked, of no version we read)."""

    version: int | None
    found: str | None
    marked: bool


def prepare_new(conn: sqlite3.Connection) -> Prepared:
    """Create an environment's schema in a file warmenv has just created (or in memory)."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    schema.install_functions(conn)

    def body(conn: sqlite3.Connection) -> Prepared:
        schema.create_environment_schema(conn)
        schema.set_version(conn)
        _mark(conn)
        return Prepared()

    return transaction(conn, body)


def prepare_writable(conn: sqlite3.Connection) -> Prepared:
    """Check, upgrade and mark an existing environment, in one transaction.

    The file is proven ours first, before WAL mode changes its header
    (`NotAnEnvironmentError` otherwise, nothing written). Version 1 is
    upgraded in place (every entry and origin kept); a marked file of a
    version this warmenv does not know and that is not newer (0, missing,
    garbage) is dropped and rebuilt as in 0.1; a newer version raises
    `NewerSchemaError` and the file is left as it is. One transaction: a
    process killed half-way leaves the file as it was.
    """
    _prove_ours(conn)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    schema.install_functions(conn)

    def body(conn: sqlite3.Connection) -> Prepared:
        ours = _prove_ours(conn)  # again, under the write lock: another process may have acted
        marked = not ours.marked
        if marked:
            _mark(conn)
        if ours.version == 2:
            if not STATISTICS_TABLES | {IMPORTS_TABLE} <= schema.table_names(conn):
                schema.create_statistics_schema(conn)
            return Prepared(marked=marked)
        if ours.version == 1:
            schema.upgrade_1_to_2(conn)
            return Prepared(upgraded_from=SCHEMA_VERSION, marked=marked)
        if not schema.table_names(conn):  # marked and empty: nothing to drop
            schema.create_environment_schema(conn)
            schema.set_version(conn)
            return Prepared(marked=marked)
        conn.execute("DROP TABLE IF EXISTS entries")
        conn.execute("DROP TABLE IF EXISTS bundles")
        schema.create_environment_schema(conn)
        schema.set_version(conn)
        return Prepared(rebuilt_from=repr(ours.found))

    return transaction(conn, body)


def prepare_readonly(conn: sqlite3.Connection) -> int:
    """Check that a file opened only to read is an environment; its version (1 or 2).

    Nothing is written: a version-1 file is read as it is (reads work,
    provenance beyond the origin is unknown), an earlier warmenv's file is
    not marked. So is a bundle (never opened for writing), of format 1 or 2.
    """
    schema.install_functions(conn)
    ours = _prove_ours(conn, bundle=True)
    if ours.version is None:
        raise sqlite3.DatabaseError(f"schema version {ours.found!r}, not {ENVIRONMENT_VERSION}")
    return ours.version


def prove_unwritten(path: Path, *, busy_timeout: float) -> None:
    """Refuse a file that is not warmenv's on a connection that cannot change it.

    The last read-write connection to close a WAL database checkpoints it
    and removes its -wal and -shm files, so a proof made only on one would
    change a file that then turns out not to be ours: every read-write open
    of an existing file (an environment's, an export's source) comes after
    this. `NotAnEnvironmentError` (not naming the file: the caller's
    `at(path)` does) where a read-only connection shows it is not ours;
    another process's lock held past `busy_timeout` raises as SQLite's busy
    error. A file no read-only connection can read, or one read this way as
    of no version we read (a newer warmenv's, say), is left to the
    read-write open's own proof.
    """
    try:
        candidates = uris.read_only_uris(path.resolve())
    except (sqlite3.Error, OSError):
        return
    for uri in candidates:
        try:
            conn = _sqlite.open_file(uri, busy_timeout=busy_timeout)
        except sqlite3.Error:
            continue
        try:
            prepare_readonly(conn)
            return
        except sqlite3.Error as exc:
            if is_busy(exc):
                raise
            continue  # not readable this way, or not a version read here: the open decides
        finally:
            conn.close()


def _mark(conn: sqlite3.Connection) -> None:
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def _prove_ours(conn: sqlite3.Connection, *, bundle: bool = False) -> _Ours:
    """What makes the file ours, or the exception saying why it is not (or is left alone).

    `bundle`: a SQLite bundle is read as an environment of version 1 (a
    read-only open) rather than refused (`sqlite3.DatabaseError`, so that a
    writable open falls back to reading it).
    """
    try:
        application_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
            raise NotAnEnvironmentError("it is not a SQLite database") from None
        raise
    objects = [
        (str(kind), str(name))
        for kind, name in conn.execute("SELECT type, name FROM sqlite_master")
    ]
    marked = application_id == APPLICATION_ID
    if application_id not in (0, APPLICATION_ID):
        raise NotAnEnvironmentError(
            f"it is a SQLite database of another program (application_id {application_id:#x})"
        )
    if not objects and not marked:
        raise NotAnEnvironmentError("it is an empty file, and warmenv did not create it")
    tables = {name for kind, name in objects if kind == "table"}
    found: str | None = None
    meta = "meta" in tables and _columns(conn, "meta") == _META_COLUMNS
    if meta:
        found = schema.schema_version(conn)
        _check_not_newer(found)
        if schema.has_meta(conn, "manifest"):  # of either format
            if not bundle:
                raise sqlite3.DatabaseError("it is a bundle, not an environment: import it instead")
            return _Ours(_bundle_version(conn, found), found, marked)
    # Exactly our tables, for a marked file too: a view, a trigger or a declaration we
    # never write would run other code, or compare otherwise, behind every read.
    why = _not_our_schema(conn, objects)
    version = schema.environment_version(conn) if meta and "entries" in tables else None
    if why is None and not marked:
        why = _not_ours(conn, tables, found, version)
    if why is not None:
        raise NotAnEnvironmentError(why)
    return _Ours(version, found, marked)


def _check_not_newer(found: str | None) -> None:
    """Refuse a file of a newer schema: its entries are another warmenv's to keep."""
    if schema.is_newer(found, ENVIRONMENT_VERSION):
        raise NewerSchemaError(
            f"schema version {found!r} was written by a newer warmenv (this one reads "
            f"versions 1 and {ENVIRONMENT_VERSION}); upgrade warmenv, or delete the file"
        )


def _not_our_schema(conn: sqlite3.Connection, objects: list[tuple[str, str]]) -> str | None:
    """Why the file's schema is not one warmenv writes (None: it is).

    Only our tables and their automatic indexes; no view, trigger or index
    of anyone's; tables declared as we declare them (no collation, WITHOUT
    ROWID, generated or hidden column, virtual table).
    """
    for kind, name in objects:
        if kind == "table" and name not in _OUR_TABLES:
            return f"it has a table {name!r}, which warmenv never makes"
        if kind != "table" and not (kind == "index" and name.startswith("sqlite_autoindex_")):
            return f"it has a {kind} {name!r}, which warmenv never makes"
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
        declared = " ".join(str(sql).upper().split())
        if not declared.startswith("CREATE TABLE"):
            return f"its table {name!r} is not a plain table"
        for clause in _NEVER_DECLARED:
            if clause in declared:
                return f"its table {name!r} is declared {clause}, which warmenv never writes"
        if any(row[6] for row in conn.execute(f"PRAGMA table_xinfo({name})")):
            return f"its table {name!r} has a generated or hidden column"
    return None


def _not_ours(
    conn: sqlite3.Connection, tables: set[str], found: str | None, version: int | None
) -> str | None:
    """Why an unmarked file is not an environment of an earlier warmenv, or None: it is."""
    if "meta" not in tables or _columns(conn, "meta") != _META_COLUMNS:
        return "it has no warmenv `meta` table"
    keys = {str(row[0]) for row in conn.execute("SELECT k FROM meta")}
    if not keys <= _OUR_META_KEYS:
        return f"its `meta` table holds {sorted(keys - _OUR_META_KEYS)[0]!r}, not warmenv's keys"
    if version is None:
        return f"schema version {found!r} with {_entries_shape(tables)}, not one warmenv wrote"
    return None


def _bundle_version(conn: sqlite3.Connection, found: str | None) -> int | None:
    version = schema.environment_version(conn)
    if (
        version is None
        and found == _CARRIED_VERSION
        and schema.entry_columns(conn) == CARRIED_COLUMNS
    ):
        version = 1  # a bundle of format 2: its entries, read like a version-1 file's
    return version


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    return [
        (str(row[1]), str(row[2]).upper()) for row in conn.execute(f"PRAGMA table_info({table})")
    ]


def _entries_shape(tables: set[str]) -> str:
    return "an `entries` table of other columns" if "entries" in tables else "no `entries` table"
