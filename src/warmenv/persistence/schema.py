"""The environment file's rules, written once: schema, checks, opening, transactions, insert rule.

An environment database and a SQLite bundle share the first four columns of
`entries` (a bundle of format 1 has exactly those, one of format 2 adds
`written_at` and `cost`; an environment adds its provenance columns, at
version 2), so everything that knows what such a file looks like lives here:
the tables, the version checks and the upgrade from version 1, the check that
the `entries` table has the columns and column types warmenv wrote, the
read-only modes an existing file is opened in when it cannot be written, how
a transaction is run, how the insert rule is stated in SQL, how entries are
summed per namespace and how namespace prefixes become SQL conditions. Every
other module (environment storage, bundle files, the bulk paths of import and
export) calls these functions instead of repeating them, so a rule cannot
drift between copies. The functions that take a `sqlite3.Connection` run on
the connection's worker thread; those that take a path resolve it (a file
system call), so async code calls them on a worker thread too.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import attrs

from warmenv.persistence.storage import may_replace, wall_clock

__all__ = [
    "BUNDLE_COLUMNS",
    "BUNDLE_SCHEMA_VERSIONS",
    "BUNDLE_VERSION",
    "ENTRY_COLUMNS",
    "ENVIRONMENT_COLUMNS",
    "ENVIRONMENT_VERSION",
    "SCHEMA_VERSION",
    "STATISTICS_TABLES",
    "UPSERT",
    "NewerSchemaError",
    "Prepared",
    "create_bundle_schema",
    "create_environment_schema",
    "entries_shape_ok",
    "has_entry_columns",
    "has_meta",
    "install_functions",
    "length_limit",
    "meta_size",
    "namespace_addressable",
    "namespace_totals",
    "namespace_read",
    "open_uris",
    "prefix_sql",
    "range_totals",
    "read_only_uri",
    "read_only_uris",
    "transaction",
    "value_of",
    "well_typed",
    "writable",
]

T = TypeVar("T")

# Version 1: an environment of 0.1, and a SQLite bundle of format 1 (0.1's):
# exactly these columns, (column, declared type).
SCHEMA_VERSION = "1"
ENTRY_COLUMNS = [
    ("namespace", "TEXT"),
    ("key", "BLOB"),
    ("value", "BLOB"),
    ("origin", "INTEGER"),
]
_META_DDL = "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)"
# A SQLite bundle of format 2 (what export writes by default) adds what an entry
# carries to another machine, the environment's next two columns: written_at and
# cost (warmenv.persistence.carried). Its meta says schema_version 2. warmenv 0.1
# refuses it (other columns); import reads both formats, and export writes
# format 1 on request, exactly as 0.1 did, for readers that know no other.
BUNDLE_VERSION = "2"
BUNDLE_COLUMNS = [*ENTRY_COLUMNS, ("written_at", "REAL"), ("cost", "REAL")]
_BUNDLE_DDL = {
    1: (
        _META_DDL,
        "CREATE TABLE IF NOT EXISTS entries ("
        "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, PRIMARY KEY (namespace, key))",
    ),
    2: (
        _META_DDL,
        "CREATE TABLE IF NOT EXISTS entries ("
        "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
        "origin INTEGER NOT NULL, written_at REAL, cost REAL, PRIMARY KEY (namespace, key))",
    ),
}
# The meta `schema_version` of a SQLite bundle of each format, as text (0.1 wrote '1').
BUNDLE_SCHEMA_VERSIONS = {1: SCHEMA_VERSION, 2: BUNDLE_VERSION}

# An environment is at version 2: the entry file's columns, then provenance
# (written_at: unix seconds, NULL for entries that predate version 2; cost:
# seconds the computation took, NULL unless known; bundle: the `bundles` row an
# imported entry came from) and `last_hit`, the coarse recency eviction reads
# (unix seconds rounded down to HIT_GRANULARITY, NULL: never hit). The new
# columns come last and are nullable, so version 1 upgrades by ALTER TABLE
# ADD COLUMN: a change of the schema alone, no row rewritten.
ENVIRONMENT_VERSION = "2"
PROVENANCE_COLUMNS = [
    ("written_at", "REAL"),
    ("cost", "REAL"),
    ("bundle", "INTEGER"),
    ("last_hit", "INTEGER"),
]
ENVIRONMENT_COLUMNS = ENTRY_COLUMNS + PROVENANCE_COLUMNS
HIT_GRANULARITY = 60
"""Seconds: a hit is recorded at most once per entry per this long."""
_BUNDLES_DDL = (
    "CREATE TABLE IF NOT EXISTS bundles (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
    "digest TEXT NOT NULL UNIQUE, imported_at REAL NOT NULL)"
)
_ENVIRONMENT_DDL = (
    _META_DDL,
    _BUNDLES_DDL,
    "CREATE TABLE IF NOT EXISTS entries ("
    "namespace TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, "
    "origin INTEGER NOT NULL, written_at REAL, cost REAL, "
    "bundle INTEGER REFERENCES bundles (id), last_hit INTEGER, "
    "PRIMARY KEY (namespace, key))",
)
# Lookup statistics, added to by every process in UPSERT increments (so
# counts add up) and created on any writable open (so a version-2 file made
# before they existed gains them): per (namespace, origin of the entry hit),
# misses and computations under origin LOCAL; and per imported bundle (a
# `bundles` row).
_STATISTICS_DDL = (
    "CREATE TABLE IF NOT EXISTS statistics (namespace TEXT NOT NULL, origin INTEGER NOT NULL, "
    "hits INTEGER NOT NULL DEFAULT 0, saved_seconds REAL NOT NULL DEFAULT 0, "
    "misses INTEGER NOT NULL DEFAULT 0, computes INTEGER NOT NULL DEFAULT 0, "
    "compute_seconds REAL NOT NULL DEFAULT 0, PRIMARY KEY (namespace, origin))",
    "CREATE TABLE IF NOT EXISTS bundle_statistics (bundle INTEGER PRIMARY KEY "
    "REFERENCES bundles (id), hits INTEGER NOT NULL DEFAULT 0, "
    "saved_seconds REAL NOT NULL DEFAULT 0)",
)
STATISTICS_TABLES = frozenset({"statistics", "bundle_statistics"})
_UPGRADE_1_TO_2 = (
    _BUNDLES_DDL,
    "ALTER TABLE entries ADD COLUMN written_at REAL",
    "ALTER TABLE entries ADD COLUMN cost REAL",
    "ALTER TABLE entries ADD COLUMN bundle INTEGER REFERENCES bundles (id)",
    "ALTER TABLE entries ADD COLUMN last_hit INTEGER",
)
# The insert rule in SQL: an existing row is replaced only where may_replace
# says so, and a replaced row takes the newcomer's provenance (its recency stays).
UPSERT = (
    "INSERT INTO {table} (namespace, key, value, origin, written_at, cost, bundle) {source} "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
    "origin = excluded.origin, written_at = excluded.written_at, cost = excluded.cost, "
    "bundle = excluded.bundle "
    "WHERE warmenv_may_replace(entries.origin, excluded.origin)"
)


def read_only_uri(path: Path, *, immutable: bool = False) -> str:
    """A read-only URI for `path`: `mode=ro`, or `immutable=1` (no lock, no -shm
    file, no -wal file read: the main file's bytes alone)."""
    return f"{path.resolve().as_uri()}?{'immutable=1' if immutable else 'mode=ro'}"


def open_uris(path: Path, *, read_write: bool) -> list[str]:
    """The URIs to open an existing file by, in the order to try them.

    - `mode=rw`, with `read_write` and only where this process may write the
      file (`writable`): never creates the file, and the last connection to
      close it removes the -wal and -shm files it needed, so a read leaves
      nothing beside the file. A file we may not write is never offered to
      `mode=rw`: SQLite would quietly open it read-only, a check that writes
      nothing would pass, and every later write would fail one by one.
    - then `read_only_uris`: how a file is read that we do not (or cannot) write.
    """
    resolved = path.resolve()
    first = [f"{resolved.as_uri()}?mode=rw"] if read_write and writable(resolved) else []
    return first + read_only_uris(resolved)


def read_only_uris(path: Path) -> list[str]:
    """How to read a WAL database without writing it or creating any file beside it.

    A `mode=ro` connection cannot checkpoint, so it never removes the -wal
    and -shm files it opens, and where none exist and the directory is
    writable it creates them (owned by us, with the database's permission
    bits, so the file's owner may then be unable to write its own -shm).
    So the choice follows what is beside the file:

    - a rollback journal beside it (a file in journal mode DELETE being
      written, or left hot by a crash): `mode=ro`, which honours it.
    - no -wal file (or an empty one and no -shm): `immutable=1`, the main
      file alone, no lock, nothing created. It is complete: SQLite removes a
      -wal file only after checkpointing every commit in it into the main file.
    - a -wal file and a -shm file (a writer has the file open, or left them):
      `mode=ro` reads through them under the writers' locks, sees every
      commit and creates nothing; `immutable=1` after it would ignore the
      -wal's commits, so it is not tried.
    - a -wal file with content and no -shm (a writer died before
      checkpointing): its commits can only be read through a -shm file that
      we would create and leave behind, so the file is refused
      (`sqlite3.OperationalError`): opening it once as its owner recovers it.

    Residual risk of `immutable=1`: it takes no lock, so a writer who may
    write the file and opens it afterwards is not seen (its commits stay in
    its -wal, unseen by this connection until it is opened again), and if
    that writer checkpoints into the main file while a read is under way,
    that read may see pages of two versions (an error, or a torn result).
    Nothing safer exists for a reader that may not create the -shm file
    through which SQLite's readers and writers coordinate.
    """
    resolved = path.resolve()
    uri = resolved.as_uri()
    wal = _size(resolved.with_name(resolved.name + "-wal"))
    shm = _size(resolved.with_name(resolved.name + "-shm")) is not None
    journal = _journal(resolved.with_name(resolved.name + "-journal"))
    if journal == "hot" or (journal == "spent" and not _is_wal(resolved)):
        # A rollback journal (a file not in WAL mode, mid-write or left by a crash):
        # immutable=1 would read the half-written main file; mode=ro honours the journal
        # (or fails, where rolling it back would need a write), never reads torn pages.
        # A spent one (its header zeroed, as PERSIST leaves it) beside a WAL file is
        # none of that, and mode=ro there would create the -wal and -shm files.
        return [f"{uri}?mode=ro"]
    if wal is None or (wal == 0 and not shm):
        return [f"{uri}?immutable=1"]
    if shm:
        return [f"{uri}?mode=ro"]
    raise sqlite3.OperationalError(
        f"{resolved}-wal holds commits not yet in {resolved} and there is no -shm file "
        "(a writer stopped before checkpointing); reading it would leave a -shm file "
        "behind, so it is not read: open it once as a user who may write it"
    )


def writable(path: Path) -> bool:
    """Whether this process may open `path` for writing (what SQLite's `mode=rw` needs).

    Opened, not `os.access`ed: the answer is the kernel's for our effective
    user, groups, ACLs and a read-only mount alike. Non-blocking, so a FIFO
    answers at once; nothing is created or changed.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def _journal(path: Path) -> str | None:
    """What is at a database's `-journal` path: None (nothing, or empty), "spent" (a
    journal whose first byte is zero, which SQLite does not roll back) or "hot"
    (anything else, an unreadable one included: SQLite decides, never read around)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # a FIFO answers at once
    except FileNotFoundError:
        return None
    except OSError:
        return "hot"
    try:
        if os.fstat(fd).st_size == 0:
            return None
        return "spent" if os.pread(fd, 1, 0) == b"\0" else "hot"
    except OSError:
        return "hot"
    finally:
        os.close(fd)


def _is_wal(path: Path) -> bool:
    """Whether the database's header says WAL mode (read and write versions 2)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.pread(fd, 2, 18) == b"\x02\x02"
    except OSError:
        return False
    finally:
        os.close(fd)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


class NewerSchemaError(sqlite3.DatabaseError):
    """The file was written by a newer warmenv: left untouched rather than dropped."""


def well_typed(alias: str = "") -> str:
    """The condition a row must meet to be an entry: text namespace, blob key and value."""
    return (
        f"typeof({alias}namespace) = 'text' AND typeof({alias}key) = 'blob' "
        f"AND typeof({alias}value) = 'blob'"
    )


# The SQLite types a namespace can have besides text, as `namespace_read` tags them.
_NOT_TEXT_TAGS = ("<BLOB>", "<INTEGER>", "<REAL>", "<NULL>")


def namespace_read(column: str = "namespace") -> str:
    """How a namespace is read back from a file, as SQL, written once.

    Text reads as itself (text that is not UTF-8 comes back with surrogates,
    through `decode_text`). A value of another SQLite type (a row something
    else wrote: a BLOB, or an INTEGER, REAL or NULL where the column allows
    one) reads as its content as text followed by its type's tag, `app/1/k <BLOB>`
    (`<NULL>` alone), so it is listed and shown where its text would be, never
    mistaken for the text namespace a store addresses, and never compared with
    one in Python (bytes against str).
    """
    return (
        f"iif(typeof({column}) = 'text', {column}, coalesce(CAST({column} AS TEXT) || ' ', '') "
        f"|| '<' || upper(typeof({column})) || '>')"
    )


def namespace_addressable(namespace: str) -> bool:
    """Whether a namespace read from a file is one a store can address: non-empty UTF-8 text.

    False for text that is not UTF-8 (read with surrogates), for the empty
    string (`Namespace.raw` refuses it), and for a value of another type
    (tagged by `namespace_read`): their rows are listed, left out of exports,
    and left alone by what works namespace by namespace (purge).
    """
    if not namespace or namespace.endswith(_NOT_TEXT_TAGS):
        return False
    try:
        namespace.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_text(raw: bytes) -> str:
    """A text factory that reads text which is not UTF-8 (another program wrote it)
    instead of failing: its bytes come back as surrogates, shown escaped and never
    written back."""
    return raw.decode("utf-8", "surrogateescape")


def install_functions(conn: sqlite3.Connection) -> None:
    """Register the insert rule so SQL statements can apply it."""
    conn.create_function("warmenv_may_replace", 2, may_replace, deterministic=True)


def transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run `body` inside BEGIN IMMEDIATE ... COMMIT; on any failure, roll back.

    COMMIT itself can fail (busy, full disk, I/O error). It runs inside the
    same guard, so a failed COMMIT is rolled back too and the connection is
    never left inside a transaction holding the write lock.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite already rolled back (it does on some I/O errors)
        raise
    return result


def create_bundle_schema(conn: sqlite3.Connection, format_version: int = 2) -> None:
    """Create the tables of a SQLite bundle of format 2 (`BUNDLE_COLUMNS`) or 1
    (`ENTRY_COLUMNS`, 0.1's table exactly)."""
    for statement in _BUNDLE_DDL[format_version]:
        conn.execute(statement)


def create_environment_schema(conn: sqlite3.Connection) -> None:
    """Create an environment's tables (version 2) if they are missing."""
    for statement in _ENVIRONMENT_DDL:
        conn.execute(statement)
    create_statistics_schema(conn)


def create_statistics_schema(conn: sqlite3.Connection) -> None:
    """Create the statistics tables if they are missing (any writable version-2 open)."""
    for statement in _STATISTICS_DDL:
        conn.execute(statement)


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def entry_columns(conn: sqlite3.Connection, schema: str = "main") -> list[tuple[str, str]]:
    """The entries table's (column, declared type) list."""
    rows = conn.execute(f"PRAGMA {schema}.table_info(entries)")
    return [(str(row[1]), str(row[2]).upper()) for row in rows]


def has_entry_columns(conn: sqlite3.Connection, schema: str = "main") -> bool:
    """Whether `entries` starts namespace TEXT, key BLOB, value BLOB: a table export
    reads, of an environment of any version or a bundle of any format (origin is
    not read: a bundle's entries are imported whatever their origin was)."""
    return entry_columns(conn, schema)[:3] == ENTRY_COLUMNS[:3]


def entries_shape_ok(conn: sqlite3.Connection, schema: str = "main") -> bool:
    """Whether the entries table is exactly the one warmenv creates in an entry file."""
    return entry_columns(conn, schema) == ENTRY_COLUMNS


def environment_version(conn: sqlite3.Connection) -> int | None:
    """1 or 2 when the file is an environment of that version in the right shape, else None."""
    found = schema_version(conn)
    columns = entry_columns(conn)
    if found == ENVIRONMENT_VERSION and columns == ENVIRONMENT_COLUMNS:
        return 2
    if found == SCHEMA_VERSION and columns == ENTRY_COLUMNS:
        return 1
    return None


def schema_version(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    return None if row is None else str(row[0])


def meta_value(conn: sqlite3.Connection, key: str, *, limit: int | None = None) -> object:
    """The raw `meta` value under `key` (any SQLite type), or `None`.

    With `limit`, a value of more bytes is `sqlite3.DataError`, refused by
    SQLite from the record's header before it reads the value (see `length_limit`).
    """
    with contextlib.nullcontext() if limit is None else length_limit(conn, limit):
        row = conn.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
    return None if row is None else row[0]


@contextlib.contextmanager
def length_limit(conn: sqlite3.Connection, limit: int) -> Iterator[None]:
    """Refuse, for the block, any value of more than `limit` bytes that a query would read.

    SQLite checks a value's length (from its record's header) against
    SQLITE_LIMIT_LENGTH before reading it and raises `sqlite3.DataError`
    ("string or blob too big"): a hostile file's huge value never reaches
    memory, SQLite's or ours.
    """
    previous = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limit)
    try:
        yield
    finally:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, previous)


def has_meta(conn: sqlite3.Connection, key: str) -> bool:
    """Whether `meta` holds `key`, without fetching its value (which may be huge)."""
    return conn.execute("SELECT 1 FROM meta WHERE k = ?", (key,)).fetchone() is not None


# The size in bytes of a stored value, as SQL. octet_length (SQLite 3.43+) reads
# it from the record's header; before it, the value is cast to a blob inside SQLite.
_OCTETS = "octet_length(v)" if sqlite3.sqlite_version_info >= (3, 43) else "length(CAST(v AS BLOB))"


def meta_size(conn: sqlite3.Connection, key: str, *, limit: int) -> int | None:
    """The bytes of the `meta` value under `key` (the largest, should a `meta` made
    without its primary key hold the key twice), or `None` if there is none.

    Measured in SQLite, never read into Python. Where measuring would read the
    value (text, before SQLite 3.43), one of more than `limit` bytes is refused
    unread, as `sqlite3.DataError` (`length_limit`): known only to be too large.
    """
    with length_limit(conn, limit):
        count, size = conn.execute(
            f"SELECT count(*), max({_OCTETS}) FROM meta WHERE k = ?", (key,)
        ).fetchone()
    return None if not count else int(size or 0)


def _check_not_newer(found: str | None) -> None:
    """Refuse a file of a newer schema: its entries are another warmenv's to keep."""
    try:
        newer = found is not None and int(found) > int(ENVIRONMENT_VERSION)
    except ValueError:
        newer = False
    if newer:
        raise NewerSchemaError(
            f"schema version {found!r} was written by a newer warmenv (this one reads "
            f"versions 1 and {ENVIRONMENT_VERSION}); upgrade warmenv, or delete the file"
        )


def _check_not_bundle(conn: sqlite3.Connection) -> None:
    if has_meta(conn, "manifest"):
        raise sqlite3.DatabaseError("it is a bundle, not an environment: import it instead")


@attrs.frozen
class Prepared:
    """What opening an environment for writing found and did."""

    rebuilt_from: str | None = None
    """The unreadable version whose entries were dropped (None: nothing dropped)."""
    upgraded_from: str | None = None
    """The version upgraded in place (every entry kept)."""


def prepare_writable(conn: sqlite3.Connection) -> Prepared:
    """Create, check or upgrade an environment's schema, in one transaction.

    Version 1 is upgraded in place (every entry and origin kept); a version
    this warmenv does not know and that is not newer (0, missing, garbage) is
    dropped and rebuilt as in 0.1; a newer version raises `NewerSchemaError`
    and the file is left as it is. One transaction: a process killed half-way
    leaves the file at the version it had.
    """
    _refuse_early(conn)  # before WAL mode changes the file's header
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    install_functions(conn)

    def body(conn: sqlite3.Connection) -> Prepared:
        tables = table_names(conn)
        if not ({"meta", "entries"} & tables):
            create_environment_schema(conn)
            _set_version(conn)
            return Prepared()
        if "meta" in tables:
            found = schema_version(conn)
            _check_not_newer(found)
        else:
            found = None
        version = environment_version(conn) if {"meta", "entries"} <= tables else None
        if version == 2:
            if not STATISTICS_TABLES <= tables:
                create_statistics_schema(conn)
            return Prepared()
        if version == 1:
            _check_not_bundle(conn)
            upgrade_1_to_2(conn)
            return Prepared(upgraded_from=SCHEMA_VERSION)
        conn.execute("DROP TABLE IF EXISTS entries")
        conn.execute("DROP TABLE IF EXISTS bundles")
        create_environment_schema(conn)
        _set_version(conn)
        return Prepared(rebuilt_from=repr(found))

    return transaction(conn, body)


def _refuse_early(conn: sqlite3.Connection) -> None:
    """Leave a newer environment or a bundle byte for byte as it is: refuse before writing."""
    if "meta" not in table_names(conn):
        return
    _check_not_newer(schema_version(conn))
    _check_not_bundle(conn)  # of either format: a format-2 bundle says schema_version 2


def upgrade_1_to_2(conn: sqlite3.Connection) -> None:
    """Add the provenance columns and the bundles table (inside the caller's transaction).

    ALTER TABLE ADD COLUMN of a nullable column changes the schema only: no
    row is rewritten, so the upgrade takes the same time for any size, and
    entries written before it read `written_at` NULL (unknown). The time of
    the upgrade is kept in `meta` so that age-based gc can treat them as
    written then rather than never.
    """
    for statement in _UPGRADE_1_TO_2:
        conn.execute(statement)
    create_statistics_schema(conn)
    conn.execute(
        "INSERT OR REPLACE INTO meta (k, v) VALUES ('upgraded_at', ?)", (repr(wall_clock()),)
    )
    _set_version(conn)


def _set_version(conn: sqlite3.Connection) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO meta (k, v) VALUES ('schema_version', ?)", (ENVIRONMENT_VERSION,)
    )


def prepare_readonly(conn: sqlite3.Connection) -> int:
    """Check that a file opened read-only is an environment; its version (1 or 2).

    A version-1 file that cannot be written (a read-only layer) is read as
    it is: reads work, provenance beyond the origin is unknown. So is a
    bundle (never opened for writing), of format 1 or 2.
    """
    install_functions(conn)
    found = schema_version(conn)
    _check_not_newer(found)
    version = environment_version(conn)
    if version is None and found == BUNDLE_VERSION and entry_columns(conn) == BUNDLE_COLUMNS:
        version = 1  # a bundle of format 2: its entries, read like a version-1 file's
    if version is None:
        raise sqlite3.DatabaseError(f"schema version {found!r}, not {ENVIRONMENT_VERSION}")
    return version


_TOTAL_BYTES = "coalesce(sum(length(key) + length(value)), 0)"  # keys plus values


def value_of(namespace: str, key: bytes, conn: sqlite3.Connection) -> bytes | None:
    """The value stored for `(namespace, key)`, or None; a value that is not a BLOB
    (a row something else wrote) is no value, never coerced."""
    row = conn.execute(
        "SELECT value FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
    ).fetchone()
    if row is None or not isinstance(row[0], bytes):
        return None
    value: bytes = row[0]
    return value


def namespace_totals(
    conn: sqlite3.Connection,
    *,
    table: str = "entries",
    where: str = "1",
    params: tuple[object, ...] | list[object] = (),
) -> list[tuple[str, int, int]]:
    """(namespace, entries, bytes) per namespace of the rows meeting `where`, in order.

    Bytes are keys plus values, the one measure of size everywhere.
    """
    rows = conn.execute(
        f"SELECT {namespace_read()}, count(*), {_TOTAL_BYTES} "
        f"FROM {table} WHERE {where} GROUP BY namespace ORDER BY namespace",
        params,
    )
    return [(namespace, int(count), int(size)) for namespace, count, size in rows]


def range_totals(
    conn: sqlite3.Connection, *, table: str, where: str, params: tuple[object, ...]
) -> list[tuple[str, int, int]]:
    """`namespace_totals` of a range of rows read in table order (a batch of a bulk copy).

    Such a range almost always lies in one namespace, and then one aggregate
    over it says everything; grouping (which sorts the range, copying every
    value into the sorter) runs only for a range that spans namespaces. The
    rows' types are checked already (a namespace is never NULL).
    """
    first, last, count, size = conn.execute(
        f"SELECT min(namespace), max(namespace), count(*), {_TOTAL_BYTES} "
        f"FROM {table} WHERE {where}",
        params,
    ).fetchone()
    if not count:
        return []
    if first is not None and first == last:
        return [(first, int(count), int(size))]
    return namespace_totals(conn, table=table, where=where, params=params)


def prefix_sql(prefixes: list[str] | None, column: str = "namespace") -> tuple[str, list[str]]:
    """Namespace prefixes (whole segments) as an SQL condition on `column`, with parameters.

    A range comparison rather than LIKE, so `_` and `%` in a prefix match only
    themselves, and so the condition can use the (namespace, key) index.
    """
    if prefixes is None:
        return "1", []
    parts: list[str] = []
    params: list[str] = []
    for prefix in (p.rstrip("/") for p in prefixes):
        if not prefix:
            return "1", []
        # '0' is the character after '/': the range is exactly "starts with prefix/".
        parts.append(f"({column} = ? OR ({column} >= ? AND {column} < ?))")
        params += [prefix, prefix + "/", prefix + "0"]
    return "(" + " OR ".join(parts) + ")", params
