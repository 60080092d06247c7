"""An import's private directory is claimed by a lock, not by the process id in its name.

Containers sharing a volume see each other's files but not each other's
processes: a process id from another PID namespace names nobody (or someone
else) here. So whoever cleans up stale private directories must leave alone
one whose lock is held, whatever its name says, and remove one whose lock
nobody holds. Every test here runs real processes: a holder that makes a
private directory and keeps it, and a cleaner that makes its own beside it
(every import does, removing the stale ones first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import one_trial
from warmenv.bundle import _files

_ROW = (
    "private import directories across PID namespaces: a live one whose pid is nobody's here "
    "(unshare -p, renamed), a killed holder's whose pid is alive",
    "the live directory and its copy kept, read whole by its holder; the dead holder's removed",
)

_HOLDER = """
import sys
from pathlib import Path
from warmenv.bundle import _files
directory = _files.private_directory(Path(sys.argv[1]))
(directory / "bundle.sqlite").write_bytes(b"a private copy")
print(directory, flush=True)
sys.stdin.readline()
copy = directory / "bundle.sqlite"
print(copy.read_bytes().decode() if copy.exists() else "moved", flush=True)
"""

_CLEANER = """
import sys
from pathlib import Path
from warmenv.bundle import _files
mine = _files.private_directory(Path(sys.argv[1]))
_files.remove_private(mine / "x")
print("cleaned", flush=True)
"""


def _environ() -> dict[str, str]:
    path = [p for p in sys.path if p and os.path.isdir(p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_environ(),
    )
    try:
        assert process.stdout is not None
        yield process, Path(process.stdout.readline().strip())
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=60)


def _clean(near: Path, *prefix: str) -> None:
    completed = subprocess.run(
        [*prefix, sys.executable, "-c", _CLEANER, str(near)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_environ(),
    )
    assert completed.returncode == 0 and completed.stdout == "cleaned\n", completed.stderr


def _finish(process: subprocess.Popen[str]) -> str:
    out, _ = process.communicate("go\n", timeout=60)
    assert process.returncode == 0
    return out


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True, timeout=60
    )
    return probe.returncode == 0


def test_a_cleaner_in_another_pid_namespace_leaves_a_live_private_directory(
    holder: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    with one_trial(*_ROW):
        if not _can_unshare():
            pytest.fail("needs root and unshare(1) (util-linux) for a PID namespace of its own")
        process, directory = holder
        # In the cleaner's own PID namespace the holder's process id names nobody.
        _clean(tmp_path, "unshare", "-p", "-f", "--mount-proc")
        assert directory.is_dir()
        assert _finish(process) == "a private copy\n"


def test_a_live_directory_whose_name_gives_a_process_that_is_not_here_is_kept(
    holder: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    with one_trial(*_ROW):
        process, directory = holder
        # As seen from another namespace: the name's process id is nobody's here.
        nobody = int(Path("/proc/sys/kernel/pid_max").read_text())  # above every process id
        moved = tmp_path / f"{_files.SNAPSHOT_PREFIX}{nobody}.moved"
        directory.rename(moved)
        _clean(tmp_path)
        assert moved.is_dir()
        assert _finish(process) == "moved\n"
        # Its holder is gone (the lock with it): the next cleaner removes it.
        _clean(tmp_path)
        assert not moved.exists()


def test_a_directory_whose_holder_was_killed_is_removed_even_if_its_pid_is_alive(
    holder: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    with one_trial(*_ROW):
        process, directory = holder
        process.kill()
        process.wait(timeout=60)
        # Its name now gives a live process here (ours): the lock, free, says it is stale.
        renamed = tmp_path / f"{_files.SNAPSHOT_PREFIX}{os.getppid()}.reused"
        directory.rename(renamed)
        _clean(tmp_path)
        assert not renamed.exists()


# --- an export's staging file: the same rule, by the same code (`_files._in_use`) ---------

_STAGING_ROW = (
    "export staging files across PID namespaces: a live one whose pid is nobody's here "
    "(unshare -p, renamed), a killed writer's whose pid is alive",
    "a real export beside it (its cleanup) keeps the live file whole and removes the dead writer's",
)

_WRITER = """
import os, sys
from pathlib import Path
from warmenv.bundle import _files
path, fd = _files.new_staging(Path(sys.argv[1]) / "b.bundle")
os.write(fd, b"half a bundle")
print(path, flush=True)
sys.stdin.readline()
print(path.read_bytes().decode() if path.exists() else "moved", flush=True)
"""

_EXPORTER = """
import sys
import anyio
from pathlib import Path
from warmenv import open_environment
from warmenv.bundle import export_bundle

async def main():
    near = Path(sys.argv[1])
    async with open_environment("e", root=near / "root") as env:
        await env.storage("app/1/x").insert(b"k", b"v")
        await export_bundle(env, near / "b.bundle", name="b", version="1")
    print("exported", flush=True)

anyio.run(main)
"""


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    process = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_environ(),
    )
    try:
        assert process.stdout is not None
        yield process, Path(process.stdout.readline().strip())
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=60)


def _export_beside(near: Path, *prefix: str) -> None:
    completed = subprocess.run(
        [*prefix, sys.executable, "-c", _EXPORTER, str(near)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_environ(),
    )
    assert completed.returncode == 0 and completed.stdout == "exported\n", completed.stderr


def test_an_export_in_another_pid_namespace_leaves_a_live_staging_file(
    writer: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    with one_trial(*_STAGING_ROW):
        if not _can_unshare():
            pytest.fail("needs root and unshare(1) (util-linux) for a PID namespace of its own")
        process, staging = writer
        _export_beside(tmp_path, "unshare", "-p", "-f", "--mount-proc")
        assert staging.is_file()
        assert _finish(process) == "half a bundle\n"


def test_a_live_staging_file_whose_name_gives_a_process_that_is_not_here_is_kept(
    writer: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    with one_trial(*_STAGING_ROW):
        process, staging = writer
        nobody = int(Path("/proc/sys/kernel/pid_max").read_text())  # above every process id
        moved = tmp_path / f".b.bundle.{nobody}.moved{_files.STAGING_SUFFIX}"
        staging.rename(moved)
        _export_beside(tmp_path)
        assert moved.read_bytes() == b"half a bundle"
        assert _finish(process) == "moved\n"
        _export_beside(tmp_path)  # its writer is gone, the lock with it
        assert not moved.exists()


def test_a_staging_file_whose_writer_was_killed_is_removed_even_if_its_pid_is_alive(
    writer: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    with one_trial(*_STAGING_ROW):
        process, staging = writer
        process.kill()
        process.wait(timeout=60)
        renamed = tmp_path / f".b.bundle.{os.getppid()}.reused{_files.STAGING_SUFFIX}"
        staging.rename(renamed)
        _export_beside(tmp_path)
        assert not renamed.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bundle", "root"]
