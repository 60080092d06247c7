"""The SQLite bundle: the environment schema in one file, with its manifest.

It is the native format: importing it into a SQLite environment is a copy
inside SQLite (ATTACH, then INSERT ... SELECT), never a trip through Python.
It is written in journal mode DELETE so it reads from a read-only directory
(a container layer, site-packages, a Nix store) without needing to create a
shared-memory file next to it. Rows whose key or value is not a BLOB are
malformed and make the whole bundle corrupt; nothing is ever coerced.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar, final

import anyio.to_thread

from warmenv import _sqlite
from warmenv.bundle.base import (
    Bundle,
    BundleOpener,
    ClosesOnExit,
    CorruptBundleError,
    InvalidManifestError,
    NotABundleError,
    UnsupportedSchemaError,
)
from warmenv.bundle.manifest import BackgroundDigest, BundleManifest
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.storage import NamespaceSummary, check_batch_size, check_key

__all__ = ["SQLITE_MAGIC", "SqliteBundle", "bundle_uri"]

T = TypeVar("T")

SQLITE_MAGIC = b"SQLite format 3\x00"
_COLUMNS = [
    ("namespace", "TEXT"),
    ("key", "BLOB"),
    ("value", "BLOB"),
    ("origin", "INTEGER"),
]


def bundle_uri(path: Path, *, immutable: bool = False) -> str:
    """A read-only URI for `path` (immutable where no lock file can be made)."""
    return f"{path.resolve().as_uri()}?{'immutable=1' if immutable else 'mode=ro'}"


def _validate(conn: sqlite3.Connection) -> tuple[BundleManifest, list[tuple[str, int, int]]]:
    """Check the schema, the manifest and every row's types; list the namespaces."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table in ("meta", "entries"):
        if table not in tables:
            raise CorruptBundleError(f"it has no '{table}' table")
    columns = [(row[1], row[2].upper()) for row in conn.execute("PRAGMA table_info(entries)")]
    if columns != _COLUMNS:
        raise CorruptBundleError(f"its entries table has columns {columns}, not {_COLUMNS}")
    row = conn.execute("SELECT v FROM meta WHERE k = 'manifest'").fetchone()
    if row is None:
        raise InvalidManifestError("it has no manifest (meta key 'manifest')")
    if not isinstance(row[0], str):
        raise InvalidManifestError("its manifest is not text")
    manifest = BundleManifest.from_json(row[0])
    rows = conn.execute(
        "SELECT namespace, count(*), coalesce(sum(length(key) + length(value)), 0), "
        "sum(typeof(namespace) != 'text' OR typeof(key) != 'blob' OR typeof(value) != 'blob') "
        "FROM entries GROUP BY namespace ORDER BY namespace"
    ).fetchall()
    bad = sum(row[3] for row in rows)
    if bad:
        raise CorruptBundleError(f"{bad} rows have a namespace, key or value of the wrong type")
    namespaces = [(str(n), int(c), int(b)) for n, c, b, _ in rows]
    return manifest, namespaces


def _digest(conn: sqlite3.Connection) -> str:
    """The content digest of exactly the rows an import copies.

    Bundles are written in key order, so the table is read in rowid order
    (sequentially, and the same rows the copy reads) while checking that
    each row sorts after the last. A bundle whose rows are not in key order
    falls back to SQLite's integrity check and a read in index order.
    """
    digest = BackgroundDigest()
    try:
        cursor = conn.execute("SELECT namespace, key, value FROM entries ORDER BY rowid")
        previous_namespace: str | None = None
        previous_key = b""
        while rows := cursor.fetchmany(1024):
            for namespace, key, _ in rows:
                if namespace != previous_namespace:
                    if previous_namespace is not None and namespace < previous_namespace:
                        return _digest_in_index_order(conn)
                    previous_namespace = namespace
                elif key <= previous_key:
                    return _digest_in_index_order(conn)
                previous_key = key
            digest.add(rows)
        return digest.value()
    finally:
        digest.close()


def _digest_in_index_order(conn: sqlite3.Connection) -> str:
    # Reading in index order trusts the index to match the table: check that.
    problems = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
    if problems != ["ok"]:
        raise CorruptBundleError(f"SQLite finds it damaged: {'; '.join(problems)}")
    digest = BackgroundDigest()
    try:
        cursor = conn.execute("SELECT namespace, key, value FROM entries ORDER BY namespace, key")
        while rows := cursor.fetchmany(1024):
            digest.add(rows)
        return digest.value()
    finally:
        digest.close()


@final
class SqliteBundle(ClosesOnExit, Bundle):
    """A SQLite bundle opened read-only and validated."""

    __slots__ = ("_connection", "_manifest", "_summaries", "path")

    def __init__(
        self,
        connection: _sqlite.Connection,
        path: Path,
        manifest: BundleManifest,
        namespaces: list[tuple[str, int, int]],
    ) -> None:
        self._connection = connection
        self.path = path
        self._manifest = manifest
        self._summaries = [NamespaceSummary(n, c, b) for n, c, b in namespaces]

    @classmethod
    def open(cls, path: str | Path) -> BundleOpener[SqliteBundle]:
        """`async with SqliteBundle.open(path) as bundle:` opens and validates it."""
        return BundleOpener(partial(open_sqlite_bundle, Path(path)))

    @property
    def manifest(self) -> BundleManifest:
        return self._manifest

    def describe(self) -> str:
        return f"SQLite bundle {self.path} ({self._manifest.name!r})"

    async def namespaces(self) -> list[NamespaceSummary]:
        await anyio.lowlevel.checkpoint()
        return list(self._summaries)

    async def get(self, namespace: Namespace | str, key: bytes) -> bytes | None:
        check_key(key)
        return await self._run(partial(_get, str(namespace), key))

    async def scan(
        self, namespace: Namespace | str, batch_size: int = 1024
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        check_batch_size(batch_size)
        after: bytes | None = None
        while True:
            rows = await self._run(partial(_page, str(namespace), after, batch_size))
            for row in rows:
                yield row
            if len(rows) < batch_size:
                return
            after = rows[-1][0]

    async def compute_digest(self) -> str:
        """Check the file's integrity and hash its entries; `CorruptBundleError` if damaged."""
        try:
            return await self._run(_digest)
        except CorruptBundleError as exc:
            raise CorruptBundleError(f"{self.path}: {exc}") from None

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._connection.run(fn)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise CorruptBundleError(f"{self.path}: reading failed ({exc})") from None

    async def aclose(self) -> None:
        await self._connection.close()


def _get(namespace: str, key: bytes, conn: sqlite3.Connection) -> bytes | None:
    row = conn.execute(
        "SELECT value FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
    ).fetchone()
    return None if row is None else bytes(row[0])


def _page(
    namespace: str, after: bytes | None, limit: int, conn: sqlite3.Connection
) -> list[tuple[bytes, bytes]]:
    if after is None:
        sql = "SELECT key, value FROM entries WHERE namespace = ? ORDER BY key LIMIT ?"
        return conn.execute(sql, (namespace, limit)).fetchall()
    sql = "SELECT key, value FROM entries WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?"
    return conn.execute(sql, (namespace, after, limit)).fetchall()


def read_head(path: Path) -> bytes:
    """The first bytes of `path`, enough to tell the formats apart."""
    with open(path, "rb") as handle:
        return handle.read(len(SQLITE_MAGIC))


async def open_sqlite_bundle(path: Path) -> SqliteBundle:
    """Open and validate; every failure is a `BundleError` (or `OSError` if missing)."""
    head = await anyio.to_thread.run_sync(read_head, path)
    if head != SQLITE_MAGIC:
        raise NotABundleError(f"{path} is not a SQLite file, so not a SQLite bundle")
    last: Exception | None = None
    for immutable in (False, True):
        target = bundle_uri(path, immutable=immutable)
        try:
            connection, (manifest, namespaces) = await _sqlite.open_with(
                target, _validate, uri=True
            )
        except (InvalidManifestError, UnsupportedSchemaError, CorruptBundleError) as exc:
            raise type(exc)(f"{path}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise CorruptBundleError(f"{path}: text that is not UTF-8 ({exc})") from None
        except sqlite3.Error as exc:
            last = exc
            if "not a database" in str(exc) or "malformed" in str(exc):
                break
            continue
        return SqliteBundle(connection, path, manifest, namespaces)
    raise CorruptBundleError(f"{path}: SQLite cannot read it ({last})")
