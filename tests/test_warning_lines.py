"""Every warning warmenv emits names the caller's line, never one of warmenv's.

A warning's file and line are what a user reads first (and what `-W error`
or a filter by module acts on); pointing into warmenv sends them to code
they did not write. The two warnings an open can emit (the fallback to
memory, and an unknown schema dropped) are checked from `async with` on
every backend and from both blocking openers, whose open runs on another
thread, where no frame of the caller's is on the stack.
"""

from __future__ import annotations

import inspect
import sqlite3
import warnings
from pathlib import Path

import pytest

import warmenv.blocking
from warmenv import WarmenvWarning, open_environment
from warmenv.persistence.sqlite.opening import APPLICATION_ID


def _under_a_file(tmp_path: Path) -> Path:
    """A root that cannot be made (a regular file where a directory should be)."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "root"


def _old_schema(root: Path) -> Path:
    """An environment of ours with a schema this warmenv does not read (dropped on open)."""
    root.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(root / "old.db") as conn:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '0')")
        conn.execute("CREATE TABLE entries (namespace TEXT, key BLOB, value BLOB)")
    conn.close()
    return root


def _one_from_here(caught: list[warnings.WarningMessage], line: int, says: str) -> None:
    ours = [w for w in caught if issubclass(w.category, WarmenvWarning)]
    assert [(says in str(w.message), w.filename, w.lineno) for w in ours] == [
        (True, __file__, line)
    ]


@pytest.mark.anyio
async def test_the_fallback_to_memory_names_the_async_with(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        async with open_environment("prod", root=_under_a_file(tmp_path)) as env:
            assert env.in_memory
    _one_from_here(caught, line, "keeping its entries in memory")


@pytest.mark.anyio
async def test_an_unknown_schema_dropped_names_the_async_with(tmp_path: Path) -> None:
    root = _old_schema(tmp_path / "envs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        async with open_environment("old", root=root):
            pass
    _one_from_here(caught, line, "the table rebuilt")


def test_the_fallback_to_memory_names_the_blocking_with(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        with warmenv.blocking.open_environment("prod", root=_under_a_file(tmp_path)) as env:
            assert env.in_memory
    _one_from_here(caught, line, "keeping its entries in memory")


def test_the_fallback_to_memory_names_the_blocking_open_call(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        env = warmenv.blocking.open("prod", root=_under_a_file(tmp_path))
        env.close()
    _one_from_here(caught, line, "keeping its entries in memory")


def test_an_unknown_schema_dropped_names_the_blocking_open_call(tmp_path: Path) -> None:
    root = _old_schema(tmp_path / "envs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        with warmenv.blocking.open("old", root=root):
            pass
    _one_from_here(caught, line, "the table rebuilt")


def _line() -> int:
    """The caller's line number."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno
