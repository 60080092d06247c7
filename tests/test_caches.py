"""The compiler-cache core and its generic directory form, with no compiler installed.

A captured tree restores at another absolute path, through a bundle, under
this machine's facts only; a hostile bundle's entries never leave the target,
never follow a symlink there, never land as a half file, and a target other
users can write is refused. The tools' own tests (real compilers) are in
tests/compilers/, run by `nox -s compilers`.
"""

from __future__ import annotations

import importlib.metadata
import os
import pkgutil
import pwd
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

import warmenv.caches
from helpers import json_lines, run_python, unprivileged_user
from warmenv import Environment, open_environment
from warmenv.bundle import export_bundle, import_bundle, preflight
from warmenv.caches import CacheTree, Facts, UnsafeTargetError, captured_trees, directory
from warmenv.caches._inprocess import where
from warmenv.caches._paths import Writer, checked_parts, relative_parts
from warmenv.caches._restore import restore_trees

pytestmark = pytest.mark.anyio

COMPILERS = ("jax", "jaxlib", "numba", "llvmlite", "triton", "torch")
TREE = directory.tree("demo", ("attrs", "cpu"))  # facts of this machine: attrs is installed
ATTRS = Facts.here("attrs").pairs[0][1]


def _cache(root: Path, files: dict[str, bytes]) -> Path:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


SAMPLE = {
    "a/b/kernel-1.bin": b"\x7fELF one",
    "a/kernel-2.bin": b"two" * 1000,
    "top.json": b"{}",
}


# --- importing warmenv never imports a compiler ---------------------------------------


def _cache_modules() -> list[str]:
    """warmenv, the package and each module in it but the tools' plug-ins (`_*_plugin`)."""
    modules = pkgutil.iter_modules(warmenv.caches.__path__)
    return ["warmenv", "warmenv.caches"] + [
        f"warmenv.caches.{m.name}" for m in modules if not m.name.endswith("_plugin")
    ]


@pytest.mark.parametrize("module", _cache_modules())
def test_importing_warmenv_or_a_cache_module_imports_no_compiler(module: str) -> None:
    child = run_python(
        textwrap.dedent(
            f"""
            import json, sys, importlib
            importlib.import_module({module!r})
            print(json.dumps(sorted(m for m in {COMPILERS!r} if m in sys.modules)))
            """
        )
    )
    assert json_lines(child) == [[]]


# What a warm start imports: the compiler's cache restored and captured, nothing else.
# The CLI's, the Redis tier's, the download's and the signer's libraries, and the
# rooms of warmenv a compiler hook never calls (the blocking face, a bundle's import,
# export and download), cost each process that warms a compiler their import.
NOT_ON_THE_WARM_PATH = (
    "rich",
    "argcomplete",
    "httpx",
    "coredis",
    "cryptography",
    "warmenv.cli",
    "warmenv.blocking",
    "warmenv.bundle.importing",
    "warmenv.bundle.exporting",
    "warmenv.bundle.download",
)


@pytest.mark.parametrize("tool", ["jax", "numba"])
def test_a_warm_start_imports_only_what_it_uses(tool: str, tmp_path: Path) -> None:
    # A tool's module, then the restore and the capture its use() makes (on the generic
    # tree: no compiler is installed here), each in a fresh process, on a real root.
    child = run_python(
        textwrap.dedent(
            f"""
            import json, sys, importlib
            importlib.import_module("warmenv.caches.{tool}")
            imported = [sorted(m for m in {NOT_ON_THE_WARM_PATH!r} if m in sys.modules)]
            from warmenv.caches import directory
            from warmenv.caches._inprocess import Tally, restored
            warmed = restored(
                "demo", directory.tree("demo", ("attrs", "cpu")), sys.argv[1] + "/cache",
                "default", sys.argv[1] + "/root", lambda: Tally(0, 0),
            )
            warmed.capture()
            imported.append(sorted(m for m in {NOT_ON_THE_WARM_PATH!r} if m in sys.modules))
            print(json.dumps(imported))
            """
        ),
        str(tmp_path),
    )
    assert json_lines(child) == [[[], []]]


def test_use_refuses_an_environment_of_another_kind_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"^env must be an environment's name, .* not int$"):
        where(3, None)  # type: ignore[arg-type]


# --- capture and restore ---------------------------------------------------------------


async def test_a_captured_tree_restores_at_another_absolute_path(
    env: Environment, tmp_path: Path
) -> None:
    source = _cache(tmp_path / "machine-1" / "cache", SAMPLE)
    captured = await warmenv.caches.capture(env, TREE, source)
    assert (captured.files, captured.stored, captured.bytes) == (
        3,
        3,
        sum(map(len, SAMPLE.values())),
    )
    keys = sorted([key async for key, _ in env.storage(TREE.namespace).scan()])
    assert keys == sorted(k.encode() for k in SAMPLE)  # relative: no machine path in a key

    target = tmp_path / "elsewhere" / "deeper" / "cache"
    restored = await warmenv.caches.restore(env, TREE, target)
    assert (restored.written, restored.kept, restored.refused) == (3, 0, ())
    assert _files(target) == SAMPLE


async def test_the_namespace_version_segment_holds_the_facts(tmp_path: Path) -> None:
    tree = directory.tree("demo", ("python", "cpu"))
    namespace = tree.namespace
    assert namespace.name == "caches.demo"
    assert Facts.parse(namespace.version) == tree.facts
    assert tree.facts.mismatches() == ()


async def test_a_tree_travels_through_a_bundle_into_a_fresh_root(
    env: Environment, tmp_path: Path
) -> None:
    await warmenv.caches.capture(env, TREE, _cache(tmp_path / "one", SAMPLE))
    bundle = tmp_path / "caches.bundle"
    await export_bundle([env], bundle, name="ci", version="1")
    async with open_environment("fresh", root=tmp_path / "fresh-root") as fresh:
        await import_bundle(bundle, fresh)
        report = await warmenv.caches.restore(fresh, TREE, tmp_path / "two")
    assert report.written == 3
    assert _files(tmp_path / "two") == SAMPLE


async def test_a_recapture_replaces_a_changed_file_and_counts_the_unchanged(
    env: Environment, tmp_path: Path
) -> None:
    source = _cache(tmp_path / "cache", SAMPLE)
    await warmenv.caches.capture(env, TREE, source)
    (source / "top.json").write_bytes(b'{"more": 1}')
    again = await warmenv.caches.capture(env, TREE, source)
    assert (again.stored, again.replaced, again.unchanged) == (0, 1, 2)
    assert await env.storage(TREE.namespace).get(b"top.json") == b'{"more": 1}'


async def test_capture_leaves_out_symlinks_and_says_so(env: Environment, tmp_path: Path) -> None:
    source = _cache(tmp_path / "cache", SAMPLE)
    (tmp_path / "secret").write_bytes(b"not yours")
    (source / "link").symlink_to(tmp_path / "secret")
    report = await warmenv.caches.capture(env, TREE, source)
    assert report.files == 3
    assert [(left.path, "symlink" in left.reason) for left in report.left_out] == [("link", True)]


async def test_a_file_already_in_the_target_is_kept(env: Environment, tmp_path: Path) -> None:
    await warmenv.caches.capture(env, TREE, _cache(tmp_path / "one", SAMPLE))
    target = _cache(tmp_path / "two", {"top.json": b"mine"})
    report = await warmenv.caches.restore(env, TREE, target)
    assert (report.written, report.kept) == (2, 1)
    assert (target / "top.json").read_bytes() == b"mine"


async def test_entries_captured_under_other_facts_are_skipped_with_the_reason(
    env: Environment, tmp_path: Path
) -> None:
    other = CacheTree("demo", Facts.of([("attrs", "0.9"), ("cpu", "x86_64-000000000000")]))
    await warmenv.caches.capture(env, other, _cache(tmp_path / "one", SAMPLE))
    report = await warmenv.caches.restore(env, TREE, tmp_path / "two")
    assert report.written == 0
    assert not any((tmp_path / "two").iterdir())
    [skipped] = report.skipped
    assert skipped.namespace == str(other.namespace)
    assert skipped.entries == 3
    assert any("CPU x86_64-000000000000 was captured" in r for r in skipped.reasons)
    assert "skipped caches.demo/" in str(report)


async def test_reports_count_one_file_in_the_singular(env: Environment, tmp_path: Path) -> None:
    captured = await warmenv.caches.capture(env, TREE, _cache(tmp_path / "one", {"a": b"x"}))
    assert str(captured).startswith("captured 1 file (1 byte) from ")
    restored = await warmenv.caches.restore(env, TREE, tmp_path / "two")
    assert str(restored).startswith("restored 1 file (1 byte) from ")
    other = CacheTree("demo", Facts.of([("attrs", "0.9"), ("cpu", "x86_64-000000000000")]))
    await warmenv.caches.capture(env, other, _cache(tmp_path / "three", {"b": b"y"}))
    skipped = await warmenv.caches.restore(env, TREE, tmp_path / "four")
    assert f"- skipped {other.namespace} (1 entry): " in str(skipped)


def test_captured_trees_say_per_tree_whether_it_can_hit_here() -> None:
    here = directory.tree("demo", ("python",)).namespace
    there = CacheTree("demo", Facts.of([("python", "cpython2.7")])).namespace
    checks = captured_trees([(str(here), 4), (str(there), 2), ("app/1/kernels", 9)])
    assert [(c.tool, c.entries, c.ok) for c in checks] == [("demo", 4, True), ("demo", 2, False)]
    assert "Python cpython2.7 was captured" in checks[1].reasons[0]


def test_facts_refuse_a_value_that_would_break_the_segment() -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        Facts((("jax", "0.10/2"),))
    assert Facts.of([("jax", "0.10/2")]).segment == "jax=0.10_2"


def test_a_fact_of_a_package_not_installed_reads_none() -> None:
    assert Facts.here("no-such-distribution-here").pairs == (("no-such-distribution-here", "none"),)
    [reason] = Facts.of([("no-such-distribution-here", "1.0")]).mismatches()
    assert "not installed here" in reason


def test_a_facts_version_is_the_one_importlib_metadata_reads() -> None:
    names = ("attrs", "anyio", "pytest", "warmenv")
    assert Facts.here(*names).pairs == tuple(
        (name, importlib.metadata.version(name)) for name in names
    )


def test_this_machines_cpu_is_read_without_starting_a_process() -> None:
    # `uname -p` (platform.processor()) was a process forked by every first restore.
    child = run_python(
        textwrap.dedent(
            """
            import json, sys
            started = []
            sys.addaudithook(
                lambda event, args: started.append(event)
                if event in ("subprocess.Popen", "os.fork", "os.posix_spawn", "os.exec")
                else None
            )
            from warmenv.caches import Facts
            Facts.here("cpu")
            print(json.dumps(started))
            """
        )
    )
    assert json_lines(child) == [[]]


# --- a hostile bundle ----------------------------------------------------------------

HOSTILE = {
    b"../escaped": "'..'",
    b"a/../../escaped": "'..'",
    b"/tmp/absolute": "absolute",
    b"C:/windows": "absolute",
    b"a\\..\\escaped": "backslash",
    b"dir/CON": "device name",
    b"dir/nul.txt": "device name",
    b"dir/com1.json": "device name",
    b"a//b": "empty component",
    b"./dot": "'.'",
    b"bell\x07": "control character",
    b"trailing.": "ends with",
    b"stream:zone": "':'",
    b"\xff\xfe": "not UTF-8",
    b"dir/.warmenv-0123.tmp": "reserves",
}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the target, which no restore may write into."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


@contextmanager
def _on_rename(hook: Callable[[str], object], *, after: bool = False) -> Iterator[None]:
    """Within the block every `os.rename` (a restored file's last step, `dst` its name in
    its directory) calls `hook(dst)` before renaming, or after it with `after`: a test
    records the order or the thread, or changes the target between two files."""
    real = os.rename

    def hooked(src: object, dst: str, **kwargs: object) -> None:
        if not after:
            hook(dst)
        real(src, dst, **kwargs)  # type: ignore[arg-type]
        if after:
            hook(dst)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "rename", hooked)
        yield


async def test_no_hostile_path_leaves_the_target(env: Environment, tmp_path: Path) -> None:
    storage = env.storage(TREE.namespace)
    await storage.insert_many([(key, b"payload") for key in HOSTILE] + [(b"fine/ok", b"ok")])
    target = tmp_path / "deep" / "target"
    report = await warmenv.caches.restore(env, TREE, target)
    assert report.written == 1
    refused = {r.path.encode("utf-8", "surrogateescape"): r.reason for r in report.refused}
    assert len(refused) == len(HOSTILE)
    for key, expected in HOSTILE.items():
        [reason] = [
            r.reason for r in report.refused if r.path == key.decode("utf-8", "backslashreplace")
        ]
        assert expected in reason, (key, reason)
    everything = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert [p for p in everything if not p.startswith("root")] == [
        "deep",
        "deep/target",
        "deep/target/fine",
        "deep/target/fine/ok",
    ]


async def test_case_folding_twins_are_refused_after_the_first(
    env: Environment, tmp_path: Path
) -> None:
    await env.storage(TREE.namespace).insert_many(
        [
            (b"Kernels/a", b"1"),
            (b"kernels/b", b"2"),
            (b"x/caf\xc3\xa9", b"3"),
            (b"x/cafe\xcc\x81", b"4"),
        ]
    )
    report = await warmenv.caches.restore(env, TREE, tmp_path / "t")
    assert report.written == 2
    assert sorted(r.path for r in report.refused) == ["kernels/b", "x/café"]
    assert all("differs only in case or Unicode form" in r.reason for r in report.refused)


async def test_a_twin_below_a_directory_already_claimed_is_refused(
    env: Environment, tmp_path: Path
) -> None:
    # Restored in key order: K/B/q, K/a/X, K/a/x, K/a/y, K/b/Q.
    await env.storage(TREE.namespace).insert_many(
        [(b"K/a/X", b"1"), (b"K/a/x", b"2"), (b"K/a/y", b"3"), (b"K/b/Q", b"4"), (b"K/B/q", b"5")]
    )
    report = await warmenv.caches.restore(env, TREE, tmp_path / "t")
    assert report.written == 3
    assert sorted(r.path for r in report.refused) == ["K/a/x", "K/b/Q"]
    assert sorted(p.name for p in (tmp_path / "t" / "K" / "a").iterdir()) == ["X", "y"]


async def test_a_symlink_already_in_the_target_is_never_followed(
    env: Environment, tmp_path: Path, outside: Path
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "linked").symlink_to(outside)  # a directory symlink in the way
    (target / "file.bin").symlink_to(outside / "victim")  # a dangling file symlink
    await env.storage(TREE.namespace).insert_many(
        [(b"linked/payload", b"evil"), (b"file.bin", b"evil"), (b"plain", b"ok")]
    )
    report = await warmenv.caches.restore(env, TREE, target)
    assert report.written == 1
    assert sorted((r.path, "symlink" in r.reason) for r in report.refused) == [
        ("file.bin", True),
        ("linked/payload", True),
    ]
    assert list(outside.iterdir()) == []


async def test_restored_files_and_directories_no_other_user_can_write(
    env: Environment, tmp_path: Path
) -> None:
    await warmenv.caches.capture(env, TREE, _cache(tmp_path / "one", SAMPLE))
    previous = os.umask(0)
    try:
        await warmenv.caches.restore(env, TREE, tmp_path / "two")
    finally:
        os.umask(previous)
    for path in (tmp_path / "two").rglob("*"):
        assert not path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH), path


async def test_a_target_other_users_can_write_is_refused(env: Environment, tmp_path: Path) -> None:
    target = tmp_path / "shared"
    target.mkdir()
    target.chmod(0o777)
    with pytest.raises(UnsafeTargetError, match="chmod go-w"):
        await warmenv.caches.restore(env, TREE, target)


async def test_a_target_under_a_directory_other_users_can_write_is_refused(
    env: Environment, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    await env.storage(TREE.namespace).insert_many([(b"k/one", b"1")])
    with pytest.raises(UnsafeTargetError, match="chmod go-w"):
        await warmenv.caches.restore(env, TREE, shared / "mine" / "cache")
    assert list(shared.iterdir()) == []


async def test_a_target_under_a_dangling_symlink_is_refused_naming_the_link_and_where_it_points(
    env: Environment, tmp_path: Path
) -> None:
    link = tmp_path / "mylink"
    link.symlink_to(tmp_path / "gone")
    await env.storage(TREE.namespace).insert_many([(b"k/one", b"1")])
    with pytest.raises(UnsafeTargetError) as raised:
        await directory.restore(env, link / "cache", tool="demo", facts=("attrs", "cpu"))
    assert f"{link} is a symlink to a missing path ({tmp_path / 'gone'})" in str(raised.value)
    assert not (tmp_path / "gone").exists()


async def test_a_symlinked_target_into_a_directory_other_users_can_write_is_refused(
    env: Environment, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    (shared / "cache").mkdir(parents=True)
    shared.chmod(0o777)
    (tmp_path / "cache").symlink_to(shared / "cache")
    await env.storage(TREE.namespace).insert_many([(b"k/one", b"1")])
    with pytest.raises(UnsafeTargetError, match="chmod go-w"):
        await warmenv.caches.restore(env, TREE, tmp_path / "cache")
    assert list((shared / "cache").iterdir()) == []


@pytest.mark.parametrize("where", ["target", "ancestor", "dotdot"])
async def test_a_target_through_another_user_s_symlink_is_refused(
    env: Environment, tmp_path: Path, where: str
) -> None:
    """A symlink another user owns on the way to the target (the target itself or a
    directory above it) could be pointed at their own directory after the restore:
    refused, nothing written where it points now."""
    nobody = pwd.getpwnam("nobody")
    real = tmp_path / "real"
    (real / "cache").mkdir(parents=True)
    link = tmp_path / "link"
    (real / "sub").mkdir()
    aimed = {"target": real / "cache", "ancestor": real, "dotdot": real / "sub"}[where]
    link.symlink_to(aimed)
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)
    # dotdot: `link/../cache` is real/cache to the system (`..` after following the
    # link), and tmp_path/cache to a path read as text.
    target = {"target": link, "ancestor": link / "cache", "dotdot": link / ".." / "cache"}[where]
    await env.storage(TREE.namespace).insert_many([(b"k/one", b"1")])
    with pytest.raises(UnsafeTargetError, match="symlink of another user's"):
        await warmenv.caches.restore(env, TREE, target)
    assert list((real / "cache").iterdir()) == []


_AS_ANOTHER_USER = textwrap.dedent(
    """
    import json, os, stat, sys, anyio
    from warmenv import open_environment
    from warmenv.caches import UnsafeTargetError, restore
    from warmenv.caches.directory import tree
    from warmenv.caches import Facts

    TREE = tree("demo", Facts.of([("demo", "1")]))
    home, open_dir, group_dir = sys.argv[1:4]

    async def main():
        outcome = {}
        async with open_environment("t", root=os.path.join(home, "root")) as env:
            await env.storage(TREE.namespace).insert_many([(b"k/one", b"1")])
            for label, target in (("world", open_dir), ("group", group_dir)):
                try:
                    await restore(env, TREE, target)
                    outcome[label] = "written"
                except UnsafeTargetError as error:
                    outcome[label] = str(error)
            report = await restore(env, TREE, os.path.join(home, "cache"))
            outcome["own"] = report.written
            outcome["modes"] = sorted(
                stat.filemode(os.stat(os.path.join(d, n)).st_mode)
                for d, dirs, files in os.walk(os.path.join(home, "cache"))
                for n in dirs + files
            )
        print(json.dumps(outcome))

    anyio.run(main)
    """
)


def test_as_another_user_a_target_others_can_write_is_refused(shared_tmp: Path) -> None:
    user = unprivileged_user()
    home = shared_tmp / "home"
    home.mkdir()
    if user is not None:
        import pwd

        entry = pwd.getpwnam(user)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    open_dir = shared_tmp / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    group_dir = shared_tmp / "group"
    group_dir.mkdir()
    group_dir.chmod(0o775)
    child = run_python(_AS_ANOTHER_USER, str(home), str(open_dir), str(group_dir), user=user)
    [outcome] = json_lines(child)
    assert isinstance(outcome, dict)
    assert "can be written by other users" in outcome["world"]
    assert "can be written by other users" in outcome["group"]
    assert outcome["own"] == 1
    assert outcome["modes"] == ["-rw-r--r--", "drwxr-xr-x"]
    assert list(open_dir.iterdir()) == [] and list(group_dir.iterdir()) == []


# --- a restore killed half-way ------------------------------------------------------

_RESTORING = textwrap.dedent(
    """
    import sys, anyio
    from warmenv import open_environment
    from warmenv.caches import CacheTree, Facts, restore

    TREE = CacheTree("demo", Facts.of([("demo", "1")]), index=("*.idx",))

    async def main():
        async with open_environment("e", root=sys.argv[1]) as env:
            print("restoring", flush=True)
            await restore(env, TREE, sys.argv[2], batch_bytes=1)
            print("done", flush=True)

    anyio.run(main)
    """
)
_CHILD_FILES = 24
_CHILD_SIZE = 4 * 1024 * 1024


def _payload(i: int) -> bytes:
    return bytes([i]) * _CHILD_SIZE


def _placed(directory: Path) -> bool:
    return directory.is_dir() and any(p.suffix == ".bin" for p in directory.iterdir())


def test_a_restore_killed_midway_leaves_no_half_file_and_no_index_before_its_children(
    tmp_path: Path,
) -> None:
    tree = CacheTree("demo", Facts.of([("demo", "1")]), index=("*.idx",))

    async def fill() -> None:
        async with open_environment("e", root=tmp_path / "root") as env:
            items = [(f"k/{i:02d}.bin".encode(), _payload(i)) for i in range(_CHILD_FILES)]
            await env.storage(tree.namespace).insert_many([*items, (b"k/all.idx", b"index")])

    async def restore_again() -> None:
        async with open_environment("e", root=tmp_path / "root") as env:
            await warmenv.caches.restore(env, tree, tmp_path / "target-0")

    anyio.run(fill)
    for attempt in range(3):
        target = tmp_path / f"target-{attempt}"
        child = subprocess.Popen(
            [sys.executable, "-c", _RESTORING, str(tmp_path / "root"), str(target)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline() == "restoring\n"
        deadline = time.monotonic() + 60
        # Kill it as soon as some file is placed, which is while others are being written.
        while not _placed(target / "k") and child.poll() is None:
            assert time.monotonic() < deadline, "the restore wrote nothing within 60 s"
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        named = {p.name: p for p in (target / "k").iterdir() if not p.name.startswith(".")}
        for name, path in named.items():
            if name.endswith(".bin"):
                assert path.read_bytes() == _payload(int(name[:2])), f"{name} is half written"
        if "all.idx" in named:
            assert len(named) == _CHILD_FILES + 1, "the index came before its children"

    # A leftover temporary file is removed by a later restore once it is old.
    leftovers = [p for p in (tmp_path / "target-0" / "k").iterdir() if p.name.startswith(".")]
    for path in leftovers:
        os.utime(path, (0, 0))
    anyio.run(restore_again)
    assert sorted(p.name for p in (tmp_path / "target-0" / "k").iterdir()) == sorted(
        [f"{i:02d}.bin" for i in range(_CHILD_FILES)] + ["all.idx"]
    )


async def test_index_files_come_after_every_other_file(env: Environment, tmp_path: Path) -> None:
    tree = CacheTree("demo", Facts.of([("demo", "1")]), index=("__grp__*",))
    await env.storage(tree.namespace).insert_many(
        [(b"k/__grp__a.json", b"{}"), (b"k/b.bin", b"b"), (b"z/c.bin", b"c")]
    )
    order: list[str] = []
    with _on_rename(order.append):
        await warmenv.caches.restore(env, tree, tmp_path / "t")
    assert order == ["b.bin", "c.bin", "__grp__a.json"]


# --- the restore's hops, and what they expose -------------------------------------------


async def test_a_small_restore_is_a_worker_hop_then_one_hop_to_the_sqlite_thread(
    env: Environment, tmp_path: Path
) -> None:
    await env.storage(TREE.namespace).insert_many([(k.encode(), v) for k, v in SAMPLE.items()])
    database = type(env.database)
    hops: list[str] = []
    run, to_thread = database.run, anyio.to_thread.run_sync

    async def counted_run(self: object, fn: object) -> object:
        hops.append("sqlite")
        return await run(self, fn)  # type: ignore[arg-type]

    async def counted_thread(fn: object, *args: object, **kwargs: object) -> object:
        hops.append("worker")
        return await to_thread(fn, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(database, "run", counted_run)
        patch.setattr(anyio.to_thread, "run_sync", counted_thread)
        report = await warmenv.caches.restore(env, TREE, tmp_path / "t")
    assert report.written == 3
    # The target's checks (and a tool's facts) on a worker thread, where a file that hangs
    # stops this restore alone; then the rows and files in one hop on SQLite's thread.
    assert hops == ["worker", "sqlite"]


async def test_a_restore_reads_through_a_small_page_cache_and_gives_the_size_back(
    env: Environment, tmp_path: Path
) -> None:
    # Each page a restore reads is read once: filling a large cache only grows the
    # process (a fresh one's SQLite thread a page at a time), so its hop uses a small one.
    await env.storage(TREE.namespace).insert_many([(k.encode(), v) for k, v in SAMPLE.items()])
    sizes: list[int] = []
    real = os.rename

    def cache_size(conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA cache_size").fetchone()[0])

    def recording(src: object, dst: str, **kwargs: object) -> None:
        sizes.append(cache_size(held))  # on SQLite's thread, in the hop
        real(src, dst, **kwargs)  # type: ignore[arg-type]

    before = await env.database.run(cache_size)
    held = await env.database.run(lambda conn: conn)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "rename", recording)
        await warmenv.caches.restore(env, TREE, tmp_path / "t")
    assert sizes == [-64] * len(SAMPLE)
    assert await env.database.run(cache_size) == before != -64


async def test_several_trees_restore_in_one_pass_each_under_its_directory(
    env: Environment, tmp_path: Path
) -> None:
    kernels = CacheTree("demo", Facts.of([("demo", "1")]), part="kernels", index=("*.idx",))
    graphs = CacheTree("demo", Facts.of([("demo", "1")]), part="graphs")
    await env.storage(kernels.namespace).insert_many([(b"a.idx", b"i"), (b"k/a.so", b"so")])
    await env.storage(graphs.namespace).insert_many([(b"g1", b"one"), (b"x/g2", b"two")])
    order: list[str] = []
    target = tmp_path / "t"
    with _on_rename(order.append):
        first, second = await restore_trees(env, target, [(kernels, ""), (graphs, "fxgraph")])
    assert order == ["a.so", "a.idx", "g1", "g2"]  # a tree's index before the next tree
    assert (first.written, second.written) == (2, 2)
    assert (first.target, second.target) == (target, target / "fxgraph")
    assert _files(target) == {
        "a.idx": b"i",
        "k/a.so": b"so",
        "fxgraph/g1": b"one",
        "fxgraph/x/g2": b"two",
    }


async def test_restored_files_are_written_off_the_event_loop_thread(
    any_env: Environment, tmp_path: Path
) -> None:
    await any_env.storage(TREE.namespace).insert_many([(k.encode(), v) for k, v in SAMPLE.items()])
    threads: set[int] = set()
    with _on_rename(lambda dst: threads.add(threading.get_ident())):
        report = await warmenv.caches.restore(any_env, TREE, tmp_path / "t")
    assert report.written == 3
    assert threads and threading.get_ident() not in threads


async def test_a_directory_swapped_for_a_symlink_between_two_files_is_never_followed(
    env: Environment, tmp_path: Path, outside: Path
) -> None:
    target = tmp_path / "target"
    await env.storage(TREE.namespace).insert_many([(b"k/1.bin", b"one"), (b"k/2.bin", b"two")])
    real = os.rename  # the swap's own move, not hooked

    def swapping(dst: str) -> None:
        if dst == "1.bin":  # between the two files: k moved away, a symlink in its place
            real(target / "k", target / "moved")
            (target / "k").symlink_to(outside)

    with _on_rename(swapping, after=True):
        report = await warmenv.caches.restore(env, TREE, target)
    assert report.written == 2
    assert list(outside.iterdir()) == []
    assert _files(target / "moved") == {"1.bin": b"one", "2.bin": b"two"}


async def test_a_symlink_put_at_a_files_name_after_the_listing_is_replaced_never_followed(
    env: Environment, tmp_path: Path, outside: Path
) -> None:
    target = tmp_path / "target"
    await env.storage(TREE.namespace).insert_many([(b"k/1.bin", b"one")])
    planted: list[str] = []

    def planting(dst: str) -> None:
        (target / "k" / dst).symlink_to(outside / "victim")
        planted.append(dst)

    with _on_rename(planting):
        report = await warmenv.caches.restore(env, TREE, target)
    assert planted == ["1.bin"]  # the symlink was there when the file took its name
    assert report.written == 1
    assert list(outside.iterdir()) == []
    assert not (target / "k" / "1.bin").is_symlink()
    assert (target / "k" / "1.bin").read_bytes() == b"one"


async def test_a_directory_put_at_a_files_name_after_the_listing_is_left_alone(
    env: Environment, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    await env.storage(TREE.namespace).insert_many([(b"k/1.bin", b"one"), (b"k/2.bin", b"two")])

    def planting(dst: str) -> None:
        if dst == "1.bin":
            (target / "k" / dst).mkdir()

    with _on_rename(planting):
        report = await warmenv.caches.restore(env, TREE, target)
    assert report.written == 1
    [refused] = report.refused
    assert refused.path == "k/1.bin" and "a directory is already at" in refused.reason
    assert sorted(p.name for p in (target / "k").iterdir()) == ["1.bin", "2.bin"]
    assert (target / "k" / "1.bin").is_dir()


async def test_an_index_is_rewritten_on_restore_once_its_files_are_there(
    env: Environment, tmp_path: Path
) -> None:
    def rewrite(writer: Writer, parts: tuple[str, ...], value: bytes) -> bytes | str:
        if writer.mode_at((*parts[:-1], "a.bin")) is None:
            return "its file is not there"
        return value + b" at " + str(writer.target).encode()

    tree = CacheTree("demo", Facts.of([("demo", "1")]), index=("*.idx",), rewrite=rewrite)
    await env.storage(tree.namespace).insert_many(
        [(b"k/a.bin", b"a"), (b"k/all.idx", b"index"), (b"lone/all.idx", b"index")]
    )
    target = tmp_path / "t"
    report = await warmenv.caches.restore(env, tree, target)
    assert (report.written, [(r.path, r.reason) for r in report.refused]) == (
        2,
        [("lone/all.idx", "its file is not there")],
    )
    assert (target / "k" / "all.idx").read_bytes() == f"index at {target}".encode()
    assert not (target / "lone").exists()


def test_a_plain_key_passes_the_same_rules_by_the_short_way() -> None:
    pieces = ["a", "Z9", "_", "-", "+", ".", "..", " ", ":", "\\", "/", "//", "con", "NUL", "com1",
              "\u00e9", "\x00", ".warmenv-", "x" * 250, "C:"]  # fmt: skip
    rng = random.Random(20)
    keys = [b""] + [
        "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))).encode() for _ in range(5000)
    ]
    keys += [b"a/" * 31 + b"b", b"a/" * 32 + b"b", b"a" * 255, b"a" * 256, b"con.txt/x"]
    for key in keys:
        assert relative_parts(key) == checked_parts(key, key.decode()), key


# --- preflight: warmenv check knows compilers ----------------------------------------


async def _bundle_of(env: Environment, tmp_path: Path, *trees: CacheTree) -> Path:
    for tree in trees:
        await warmenv.caches.capture(env, tree, _cache(tmp_path / tree.facts.segment, SAMPLE))
    bundle = tmp_path / "caches.bundle"
    await export_bundle([env], bundle, name="ci", version="1")
    return bundle


async def test_preflight_says_per_tool_whether_its_cache_can_hit_here(
    env: Environment, tmp_path: Path
) -> None:
    elsewhere = CacheTree("demo", Facts.of([("attrs", ATTRS), ("cpu", "x86_64-000000000000")]))
    report = await preflight(await _bundle_of(env, tmp_path, TREE, elsewhere))
    assert report.ok, report.reasons
    assert sorted((c.namespace, c.ok) for c in report.caches) == sorted(
        [(str(elsewhere.namespace), False), (str(TREE.namespace), True)]
    )
    assert "compiler cache demo: 3 files can hit here (3 more captured under other facts)" in (
        report.reasons
    )


async def test_preflight_refuses_a_cache_made_for_another_machine_and_says_why(
    env: Environment, tmp_path: Path
) -> None:
    other = CacheTree("jax", Facts.of([("jax", "0.0.1"), ("cpu", "x86_64-000000000000")]))
    report = await preflight(await _bundle_of(env, tmp_path, other))
    assert not report.ok
    [reason] = [r for r in report.reasons if r.startswith("compiler cache jax")]
    assert "none of its 3 files can hit here" in reason
    assert "jax 0.0.1 was captured" in reason
    assert "CPU x86_64-000000000000 was captured; this machine has" in reason


async def test_warmenv_check_names_the_compiler_caches(env: Environment, tmp_path: Path) -> None:
    other = CacheTree("jax", Facts.of([("jax", "0.0.1")]))
    bundle = await _bundle_of(env, tmp_path, TREE, other)
    completed = await anyio.run_process(
        [sys.executable, "-m", "warmenv", "check", str(bundle)], check=False
    )
    out = completed.stdout.decode()
    assert completed.returncode == 1, out
    assert "- compiler cache demo: 3 files can hit here" in out
    assert "- compiler cache jax: none of its 3 files can hit here: jax 0.0.1 was captured" in out
