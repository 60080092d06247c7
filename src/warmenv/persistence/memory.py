"""Storage in process memory: the SQLite storage over a database in memory.

It serves tests, `MemoryStorage(namespace)` users, and the degraded mode of
an environment whose file cannot be used. It is not a second implementation
of the contract: a `:memory:` SQLite database with the environment's schema
(`persistence.sqlite.schema`), read and written by the same SQL as a file,
so the insert rule, eviction, keep_versions, statistics and quarantine are
the file's, written once. Its calls run on the caller's thread
(`_sqlite._memory`): a checkpoint first, then the whole operation, so
cancellation leaves a call either wholly applied or not applied at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import final

from warmenv import _sqlite
from warmenv.persistence.namespace import Namespace
from warmenv.persistence.sqlite import opening
from warmenv.persistence.sqlite.database import Degraded, SqliteDatabase
from warmenv.persistence.sqlite.storage import SqlStorage

__all__ = ["MemoryStorage", "memory_database"]

_MEMORY = Path(":memory:")


def memory_database(degraded: Degraded | None = None) -> SqliteDatabase:
    """A new, empty environment database in process memory (`degraded`: why, if a
    fallback), whose namespaces are `MemoryStorage`s. No event loop needed."""
    connection, _ = _sqlite.open_memory(opening.prepare_new)
    return SqliteDatabase(
        connection,
        _MEMORY,
        read_only=False,
        in_memory=True,
        degraded=degraded,
        storage=_namespace_of,
    )


def _namespace_of(db: SqliteDatabase, namespace: str) -> MemoryStorage:
    return MemoryStorage(namespace, table=db)


@final
class MemoryStorage(SqlStorage):
    """A namespace held in process memory; the same contract (and SQL) as a file's.

    `table` is the in-memory database it belongs to (`memory_database()`),
    shared by the namespaces of one in-memory environment; by default a
    database of its own.
    """

    __slots__ = ()

    def __init__(self, namespace: Namespace | str, *, table: SqliteDatabase | None = None) -> None:
        super().__init__(memory_database() if table is None else table, namespace)

    def describe(self) -> str:
        return f"memory [{self.namespace}]"
