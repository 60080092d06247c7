"""What is not a regular file in a directory warmenv reads is skipped, named, never waited on.

A compiler's cache directory (and `warmenv run`'s counts file, its hooks'
home, an import's staging area) is a directory the user, or another
process, can change between the listing and the open: a FIFO put there
would block an open forever, a device would never end. Every such file is
opened without following a symlink and without waiting, and read only if
it is a regular file once open (`warmenv._fs.open_found`). The FIFOs here
are real; each test is bounded: if an open waits on a FIFO, a timer opens
the FIFO's other end once the bound has passed, and the test fails.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import warmenv.caches
import warmenv.caches._paths
from warmenv import Environment
from warmenv.bundle import _files
from warmenv.caches import CacheTree, Facts, triton
from warmenv.caches._children import new_counts, read_counts
from warmenv.caches._hookdir import HookHome

BOUND = 20.0  # seconds: a skip takes microseconds; a wait lasts until the timer
T = TypeVar("T")

pytestmark = pytest.mark.anyio


@contextlib.contextmanager
def bounded(*fifos: Path) -> Iterator[threading.Event]:
    """An event set if the bound passed and the FIFOs had to be opened at the other end
    (something waited on one); the FIFOs are opened so that whatever waits goes on."""
    released = threading.Event()

    def release() -> None:
        released.set()
        for fifo in fifos:
            with contextlib.suppress(OSError):  # nobody waiting on this one: ENXIO
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(BOUND, release)
    timer.start()
    try:
        yield released
    finally:
        timer.cancel()


def within_bound(call: Callable[[], T], *fifos: Path) -> T:
    with bounded(*fifos) as released:
        result = call()
    assert not released.is_set(), f"it waited on a FIFO for {BOUND} s"
    return result


def _kernel(source: Path, name: str) -> Path:
    kernel = source / name
    kernel.mkdir(parents=True)
    (kernel / f"{name}.bin").write_bytes(b"\x7fELF " + name.encode())
    index = {"child_paths": {f"{name}.bin": str(kernel / f"{name}.bin")}}
    (kernel / f"__grp__{name}.json").write_text(json.dumps(index))
    return kernel


async def test_a_triton_capture_skips_a_fifo_and_a_symlink_to_a_device_and_names_them(
    env: Environment, tmp_path: Path
) -> None:
    source = tmp_path / "triton"
    _kernel(source, "good")
    fifo_kernel = _kernel(source, "fifo")
    (fifo_kernel / "__grp__fifo.json").unlink()
    os.mkfifo(fifo_kernel / "__grp__fifo.json")
    (fifo_kernel / "fifo.bin").unlink()
    os.mkfifo(fifo_kernel / "fifo.bin")
    zero_kernel = _kernel(source, "zero")
    (zero_kernel / "__grp__zero.json").unlink()
    (zero_kernel / "__grp__zero.json").symlink_to("/dev/zero")
    (zero_kernel / "zero.so").symlink_to("/dev/zero")
    os.mkfifo(source / "a-fifo-where-a-kernel-would-be")
    fifos = [fifo_kernel / "__grp__fifo.json", fifo_kernel / "fifo.bin"]

    with bounded(*fifos) as released:
        report = await triton.capture(env, source)
    assert not released.is_set(), f"the capture waited on a FIFO for {BOUND} s"

    assert report.groups == 1  # good's
    skipped = {(left.path, left.reason) for left in report.left_out}
    assert skipped == {
        ("fifo/__grp__fifo.json", "a FIFO, not a regular file"),
        ("zero/__grp__zero.json", "a symlink, not a regular file"),
    }
    left_files = {left.path: left.reason for left in report.files.left_out}
    assert "not a regular file" in left_files["fifo/fifo.bin"]
    assert "symlink" in left_files["zero/zero.so"]
    assert str(report).endswith("1 kernel indexes, 2 left out")


async def test_a_triton_index_grown_past_its_cap_is_left_out_named_unread(
    env: Environment, tmp_path: Path
) -> None:
    source = tmp_path / "triton"
    _kernel(source, "good")
    big = _kernel(source, "big")
    os.truncate(big / "__grp__big.json", 1 << 30)  # sparse: no disk is filled
    report = await triton.capture(env, source)
    assert report.groups == 1  # good's
    assert [(left.path, left.reason) for left in report.left_out] == [
        ("big/__grp__big.json", "it is larger than 1,048,576 bytes")
    ]


def test_a_cache_file_grown_past_the_cap_since_the_listing_is_read_no_further(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "small.bin").write_bytes(b"s" * 1000)
    (tmp_path / "grown.bin").write_bytes(b"g" * 1025)
    monkeypatch.setattr(warmenv.caches._paths, "MAX_FILE_BYTES", 1024)
    read = warmenv.caches._paths.read_files((tmp_path, ""), [("grown.bin", 10), ("small.bin", 10)])
    assert read == [
        ("grown.bin", "larger than 1,024 bytes (it grew since the listing)"),
        ("small.bin", b"s" * 1000),
    ]


def test_a_triton_index_swapped_for_a_fifo_after_the_listing_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    # What the listing saw no longer counts once the index is opened: here the
    # swap has happened, and the reader meets the FIFO itself.
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    os.mkfifo(kernel / "__grp__k.json")
    (kernel / "__grp__z.json").symlink_to("/dev/zero")
    at = os.open(kernel, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fifo = within_bound(
            lambda: triton._read_small("__grp__k.json", at), kernel / "__grp__k.json"
        )
        zero = within_bound(lambda: triton._read_small("__grp__z.json", at))
    finally:
        os.close(at)
    assert fifo == "a FIFO, not a regular file"
    assert zero == "a symlink, not a regular file"


async def test_a_file_swapped_for_a_fifo_or_a_device_symlink_mid_capture_is_skipped_and_named(
    env: Environment, tmp_path: Path
) -> None:
    source = tmp_path / "cache"
    source.mkdir()
    for name in ("a", "b", "c"):
        (source / name).write_bytes(name.encode() * 10)

    def swap_the_others(value: bytes) -> None:
        # Called as "a" is stored, after the listing and before "b" and "c" are read
        # (one file per batch): they change under the capture, as another process may.
        if value.startswith(b"a") and (source / "b").is_file():
            (source / "b").unlink()
            os.mkfifo(source / "b")
            (source / "c").unlink()
            (source / "c").symlink_to("/dev/zero")

    tree = CacheTree("demo", Facts.here("attrs"), cost=swap_the_others)
    with bounded(source / "b") as released:
        report = await warmenv.caches.capture(env, tree, source, batch_bytes=1)
    assert not released.is_set(), f"the capture waited on a FIFO for {BOUND} s"
    assert report.files == 1
    assert {(left.path, left.reason) for left in report.left_out} == {
        ("b", "a FIFO, not a regular file"),
        ("c", "a symlink, not a regular file"),
    }


def test_a_counts_file_the_command_replaced_by_a_fifo_is_not_waited_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counts = tmp_path / "counts.jsonl"
    new_counts(counts)
    counts.unlink()  # what the command `warmenv run` runs may do
    os.mkfifo(counts)
    with caplog.at_level(logging.WARNING, logger="warmenv.caches"):
        found = within_bound(lambda: read_counts(counts), counts)
    assert found == {}
    assert f"not reading the command's cache counts from {counts}: it is a FIFO" in caplog.text


def test_a_fifo_in_a_hooks_directory_is_not_waited_on_and_the_directory_is_made_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = {"hook.py": "x\n"}
    with HookHome() as home:
        made = home.directory(files)
    os.mkfifo(made / "planted")
    with HookHome() as home:
        again = within_bound(lambda: home.directory(files), made / "planted")
    assert sorted(p.name for p in again.iterdir()) == ["hook.py"]


def test_a_fifo_as_a_private_directory_s_lock_is_not_waited_on(tmp_path: Path) -> None:
    stale = tmp_path / f"{_files.SNAPSHOT_PREFIX}1.stale"
    stale.mkdir()
    os.mkfifo(stale / _files.LOCK_NAME)
    within_bound(lambda: _files.remove_stale_directories(tmp_path), stale / _files.LOCK_NAME)
    assert stale.is_dir()  # no lock warmenv makes: not ours to judge
