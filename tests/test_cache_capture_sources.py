"""A capture reads only what is this user's, inside the cache (attack review 2, finding 3).

A file captured is restored as this machine's own: trusted even under
`require_signature`. So a capture follows the restore's rule on the source
tree: no symlink inside the cache is followed (torch's `fxgraph/` symlinked
to `~/.ssh` was captured), and no directory or file another user owns or can
write is read (a `nobody`-owned, world-writable subdirectory's planted `x.so`
was captured, then restored under `require_signature`). Where ownership
matters, the planted file is written by a child running as `nobody`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import run_python, unprivileged_user
from warmenv import Environment
from warmenv.caches import directory, triton
from warmenv.caches import torch as torch_cache

pytestmark = pytest.mark.anyio

TOOLS = ["directory", "torch"]


async def _capture(env: Environment, tool: str, cache: Path) -> None:
    if tool == "torch":
        await torch_cache.capture(env, cache)
    else:
        await directory.capture(env, cache, tool="cupy", facts=("cpu",))


async def _captured(env: Environment) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    for summary in await env.namespaces():
        found.update([pair async for pair in env.storage(summary.namespace).scan()])
    return found


@pytest.fixture
def cache() -> Iterator[Path]:
    """A cache directory of this user's, in a directory `nobody` may enter (pytest's
    own temporary directories are private to this user)."""
    base = Path(tempfile.mkdtemp(prefix="warmenv-capture-"))
    try:
        os.chmod(base, 0o755)
        made = base / "cache"
        made.mkdir(mode=0o755)
        (made / "mine.so").write_bytes(b"this user's own")
        yield made
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize("tool", TOOLS)
async def test_a_capture_reads_nothing_from_a_directory_another_user_can_write(
    cache: Path, warm_env: Environment, tool: str
) -> None:
    planted = cache / "kern"
    planted.mkdir()
    os.chmod(planted, 0o777)
    user = unprivileged_user()
    child = run_python(
        "import sys; open(sys.argv[1], 'wb').write(b'planted-by-nobody')",
        str(planted / "x.so"),
        user=user,
    )
    assert child.returncode == 0, child.stderr
    if user is not None:  # as root (CI): planted by a real other user
        assert (planted / "x.so").stat().st_uid != os.geteuid()
    # Otherwise no other user can be, and the directory anyone may write is the case.
    await _capture(warm_env, tool, cache)
    captured = await _captured(warm_env)
    assert b"planted-by-nobody" not in captured.values()
    assert b"this user's own" in captured.values()


@pytest.mark.parametrize("tool", TOOLS)
async def test_a_capture_reads_no_file_another_user_owns(
    cache: Path, warm_env: Environment, tool: str
) -> None:
    planted = cache / "theirs.so"
    planted.write_bytes(b"owned-by-nobody")
    if unprivileged_user() is not None:  # as root (CI): the file is given to another user
        shutil.chown(planted, "nobody")
    else:  # no other user to give it to: a file any user may write, refused by the same rule
        planted.chmod(0o666)
    await _capture(warm_env, tool, cache)
    captured = await _captured(warm_env)
    assert b"owned-by-nobody" not in captured.values()
    assert b"this user's own" in captured.values()


async def test_a_torch_capture_follows_no_symlinked_graph_directory(
    cache: Path, warm_env: Environment, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_ed25519").write_bytes(b"PRIVATE KEY")
    os.symlink(secret, cache / "fxgraph")
    (cache / "aotautograd").mkdir()
    os.symlink(secret / "id_ed25519", cache / "aotautograd" / "entry")
    report = await torch_cache.capture(warm_env, cache)
    captured = await _captured(warm_env)
    assert b"PRIVATE KEY" not in captured.values()
    assert b"this user's own" in captured.values()
    assert "fxgraph" in [left.path for graphs in report.graphs for left in graphs.left_out]


def _index(kernel: Path) -> str:
    return json.dumps({"child_paths": {"k.bin": str(kernel / "k.bin")}})


async def test_a_triton_capture_reads_no_index_in_a_kernel_directory_another_user_can_write(
    cache: Path, warm_env: Environment
) -> None:
    kernel = cache / "k"
    kernel.mkdir()
    os.chmod(kernel, 0o777)
    user = unprivileged_user()
    child = run_python(
        "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
        str(kernel / "__grp__k.json"),
        _index(kernel),
        user=user,
    )
    assert child.returncode == 0, child.stderr
    report = await triton.capture(warm_env, cache)
    assert report.groups == 0
    assert [(left.path, left.reason) for left in report.left_out] == [
        ("k", "a directory that can be written by other users (mode drwxrwxrwx)")
    ]
    assert not any(key.endswith(b"__grp__k.json") for key in await _captured(warm_env))


async def test_a_triton_capture_reads_no_index_another_user_owns(
    cache: Path, warm_env: Environment
) -> None:
    kernel = cache / "k"
    kernel.mkdir(mode=0o755)
    (kernel / "k.bin").write_bytes(b"this user's kernel")
    index = kernel / "__grp__k.json"
    index.write_text(_index(kernel))
    if unprivileged_user() is not None:  # as root (CI): the index is given to another user
        shutil.chown(index, "nobody")
        why = f"a file that belongs to another user (uid {index.stat().st_uid})"
    else:  # no other user to give it to: an index any user may write, refused by the same rule
        index.chmod(0o666)
        why = "a file that can be written by other users (mode -rw-rw-rw-)"
    report = await triton.capture(warm_env, cache)
    assert report.groups == 0
    assert [(left.path, left.reason) for left in report.left_out] == [("k/__grp__k.json", why)]
    assert not any(key.endswith(b"__grp__k.json") for key in await _captured(warm_env))
