"""One stuck restore blocks only itself: a tool's facts are never read on SQLite's thread.

A restore reads this machine's facts (a tool's version from its metadata,
found by walking `sys.path`) from files, and a file can hang: a dead NFS
mount, a FIFO where `importlib.metadata` reads (it is asked where warmenv's
own walk cannot go, a zip on the path). Read in the pass's hop on the
environment's one SQLite thread, such a fact stopped every call of the
environment; read on a worker thread before the pass, it stops that restore
alone. Here the fact waits on a real FIFO while another task queries the
environment, which answers; then the FIFO is written and the restore ends.
"""

from __future__ import annotations

import functools
import os
import sys
import zipfile
from pathlib import Path
from typing import IO

import anyio
import anyio.to_thread
import pytest

from warmenv import Namespace, open_environment
from warmenv.caches import triton

pytestmark = pytest.mark.anyio

APP = Namespace("myapp", "kernels", "1.0")
METADATA = "Metadata-Version: 2.1\nName: triton\nVersion: 9.9\n\n"


@pytest.fixture
def fifo_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Triton's METADATA a FIFO, behind a zip on `sys.path` (so `importlib.metadata` reads it)."""
    archive = tmp_path / "empty.zip"
    with zipfile.ZipFile(archive, "w"):
        pass
    found = tmp_path / "site" / "triton-9.9.dist-info"
    found.mkdir(parents=True)
    fifo = found / "METADATA"
    os.mkfifo(fifo)
    monkeypatch.setattr(sys, "path", [str(archive), str(tmp_path / "site"), *sys.path])
    return fifo


async def test_a_restore_stuck_reading_a_fact_leaves_the_environment_answering(
    fifo_metadata: Path, tmp_path: Path
) -> None:
    async with open_environment("t", root=tmp_path / "root") as env:
        await env.storage(APP).insert_many([(b"k", b"v")])
        async with anyio.create_task_group() as tg:
            tg.start_soon(triton.restore, env, tmp_path / "target")
            with anyio.fail_after(60):  # returns once the restore's fact has opened the FIFO
                writer: IO[str] = await anyio.to_thread.run_sync(
                    functools.partial(open, fifo_metadata, "w", encoding="utf-8")
                )
            try:
                with anyio.fail_after(10):
                    assert await env.storage(APP).get(b"k") == b"v"
            finally:
                writer.write(METADATA)
                writer.close()
