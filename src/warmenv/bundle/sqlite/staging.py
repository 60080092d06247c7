"""The SQLite bundle's file, written: a staging file filled in key order, then finished.

Export writes a SQLite bundle into a staging file beside its target (see
`warmenv.bundle.exporting`): the schema of the format asked for, the
entries as IMPORTED in (namespace, key) order, either appended a batch at a
time or, from a single source, copied inside SQLite (persistence's
`SourceCopy`, which runs every statement on the environment), then the manifest,
whose row was written ahead of the entries (`reserve`) so that it lies in the
file's first pages, where a range request reaches it.
Whatever SQLite says went wrong writing it is raised as the `OSError` it
stands for (a full disk, a read-only file system), naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import final

from warmenv import _sqlite
from warmenv.bundle.base import CarriedRow, PackedRow
from warmenv.bundle.manifest import BundleManifest
from warmenv.bundle.sqlite import schema as bundle_schema
from warmenv.bundle.sqlite.sources import reading
from warmenv.persistence.sqlite.export import SourceCopy
from warmenv.persistence.storage import Origin

__all__ = ["LARGE_BUNDLE", "LARGE_PAGE", "StagingFile"]

# SQLite's primary result codes, as the OSError they stand for.
_ERRNO_OF = {
    8: errno.EROFS,  # SQLITE_READONLY
    10: errno.EIO,  # SQLITE_IOERR
    13: errno.ENOSPC,  # SQLITE_FULL
    14: errno.EACCES,  # SQLITE_CANTOPEN
}


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        code = _ERRNO_OF.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF, errno.EIO)
        raise OSError(code, f"{os.strerror(code)} ({exc})", str(path)) from None


LARGE_BUNDLE = 4 << 20
LARGE_PAGE = 32768


@final
class StagingFile:
    """A SQLite bundle being written: the schema, entries in key order, then the manifest.

    Written without a journal (it is a staging file: a failure discards it)
    and switched to journal mode DELETE when finished, so the bundle reads
    from a read-only directory without a shared-memory file beside it.

    A bundle expected to hold `LARGE_BUNDLE` bytes or more is written with
    pages of `LARGE_PAGE` bytes instead of SQLite's 4 KiB: every pass an
    import makes over it (its checks, the digest, the copy) then reads a
    tenth as many pages, each one system call, and rows of about 1 KiB
    waste a quarter of a 4 KiB page but little of a large one. Small bundles
    keep small pages, which cost nothing to read either way.

    `format_version` 2 (the default) writes what each entry carries; 1 writes
    0.1's four columns and `schema_version` '1', for readers of format 1
    only, and what the rows carry is dropped.
    """

    def __init__(self, path: Path, *, expected_bytes: int = 0, format_version: int = 2) -> None:
        self.path = path
        self.format_version = format_version
        # The columns written beyond (namespace, key, value, origin), and what the
        # rows read back carry: nothing in format 1.
        self._carrying = format_version == 2
        self._conn: sqlite3.Connection | None = None
        self._copy: SourceCopy | None = None
        self._copied_rowid = 0
        self._copy_after: tuple[str, bytes] | None = None  # the last (namespace, key) copied
        self._reserved = False  # the meta rows written ahead of the entries
        self.skipped = 0
        self.totals: dict[str, tuple[int, int]] = {}
        """Entries and bytes per namespace of the attached source (`attach_source`)."""
        try:
            with _writing(path):
                conn = self._conn = _sqlite.open_file(f"{path.resolve().as_uri()}?mode=rwc")
                if expected_bytes >= LARGE_BUNDLE:
                    conn.execute(f"PRAGMA page_size={LARGE_PAGE}")  # before the first table
                conn.execute("PRAGMA journal_mode=OFF")
                conn.execute("PRAGMA synchronous=OFF")
                bundle_schema.create(conn, format_version)
        except BaseException:
            self.close()
            raise

    def _connection(self) -> sqlite3.Connection:
        assert self._conn is not None, "the staging file is closed"
        return self._conn

    def reserve(self, manifest: BundleManifest) -> None:
        """Write the `meta` rows now, before any entry, the manifest as it will be but for
        its digest and signature (placeholders of their final lengths): it then lies in
        the file's first pages, where a reader of its first bytes finds it
        (`warmenv.bundle.sqlite.head`), and `finish` rewrites it in place (a value of
        the same length: SQLite overwrites its pages where they are)."""
        with _writing(self.path):
            self._connection().execute(
                "INSERT INTO meta (k, v) VALUES ('schema_version', ?), ('manifest', ?)",
                (
                    bundle_schema.SCHEMA_VERSIONS[self.format_version],
                    manifest.to_json().decode("utf-8"),
                ),
            )
        self._reserved = True

    def begin(self) -> None:
        with _writing(self.path):
            self._connection().execute("BEGIN")

    def add(self, rows: list[CarriedRow], packed: list[PackedRow]) -> None:
        """Append entries (already in key order) as IMPORTED, with what they carry
        (in format 2; format 1 has no place for it). `packed` is not needed."""
        with _writing(self.path):
            if self._carrying:
                self._connection().executemany(
                    "INSERT INTO entries (namespace, key, value, origin, written_at, cost) "
                    f"VALUES (?, ?, ?, {int(Origin.IMPORTED)}, ?, ?)",
                    rows,
                )
            else:
                self._connection().executemany(
                    "INSERT INTO entries (namespace, key, value, origin) "
                    f"VALUES (?, ?, ?, {int(Origin.IMPORTED)})",
                    (row[:3] for row in rows),
                )

    def attach_source(self, source: Path, prefixes: list[str] | None) -> dict[str, tuple[int, int]]:
        """Copy from one environment inside SQLite (`SourceCopy`); the totals under one
        snapshot."""
        with reading(str(source)):
            copy = self._copy = SourceCopy(
                self._connection(), source, prefixes, carrying=self._carrying
            )
        self.skipped = copy.skipped
        self.totals = copy.totals
        return self.totals

    def copy_step(self, limit: int) -> list[CarriedRow]:
        """Copy the next `limit` entries from the attached source; the rows as written
        (empty: done), carrying nothing (`None`) in format 1."""
        with _writing(self.path):
            return self._copy_step(limit)

    def _copy_step(self, limit: int) -> list[CarriedRow]:
        conn = self._connection()
        assert self._copy is not None, "attach_source() first"
        self._copy.copy_batch(self._copy_after, limit)
        carried_read = "written_at, cost" if self._carrying else "NULL, NULL"
        # The staging table only grows, one rowid after the last: the batch is the rows
        # after those read back so far.
        rows: list[CarriedRow] = conn.execute(
            f"SELECT namespace, key, value, {carried_read} FROM main.entries "
            "WHERE rowid > ? ORDER BY rowid",
            (self._copied_rowid,),
        ).fetchall()
        if rows:
            self._copied_rowid += len(rows)
            self._copy_after = (rows[-1][0], rows[-1][1])
        return rows

    def finish(self, manifest: BundleManifest) -> None:
        """Write the manifest, commit, and leave a closed, synced file in journal mode DELETE."""
        with _writing(self.path):
            self._finish(manifest.to_json().decode("utf-8"))
        with open(self.path, "rb+") as handle:
            os.fsync(handle.fileno())

    def _finish(self, manifest_json: str) -> None:
        conn = self._connection()
        if self._reserved:
            conn.execute("UPDATE meta SET v = ? WHERE k = 'manifest'", (manifest_json,))
        else:
            conn.execute(
                "INSERT INTO meta (k, v) VALUES ('schema_version', ?), ('manifest', ?)",
                (bundle_schema.SCHEMA_VERSIONS[self.format_version], manifest_json),
            )
        conn.execute("COMMIT")
        if self._copy is not None:
            self._copy.detach()
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
        self._conn = None

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
