"""An environment is never created or opened through a path another user can bend.

The attack (fs.protected_symlinks is 0 here, as in many containers): in a
shared directory of theirs, `nobody` plants `sub -> /root/victimdir`; root
opens `root=.../sub` and would create `prod3.db` inside its own directory at
their say. Such a root, and one under a directory others may write without
the sticky bit, opens in memory with one warning naming the step in the way,
and creates nothing; the setups people use (a directory of one's own under a
sticky `/tmp`, a symlink of one's own or root's, the default root) still open
on disk. The symlinks are planted by a child that is `nobody` (we run as root).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import warnings
from pathlib import Path

import anyio
import pytest

import warmenv.blocking
from helpers import json_lines, run_python, unprivileged_user
from test_unusable_places import _ASYNC_CHILD
from warmenv import Namespace, open_environment

NS = Namespace("app", "kernels", version="1")
_SYMLINK = "import os, sys; os.symlink(sys.argv[1], sys.argv[2])"


def _planted(shared_tmp: Path) -> tuple[Path, Path]:
    """`nobody`'s sticky directory holding `sub`, their symlink to root's `victimdir`."""
    victim = shared_tmp / "victimdir"
    victim.mkdir(mode=0o700)
    shared = shared_tmp / "shared"
    shared.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(shared, nobody.pw_uid, nobody.pw_gid)
    shared.chmod(0o1777)
    link = shared / "sub"
    planted = run_python(_SYMLINK, str(victim), str(link), user=unprivileged_user())
    assert planted.returncode == 0, planted.stderr
    assert link.lstat().st_uid == nobody.pw_uid
    return link, victim


def _assert_refused(warning: str, reason: str | None, link: Path) -> None:
    assert reason == (
        f"{link} is a symlink of another user's (uid {pwd.getpwnam('nobody').pw_uid}), "
        "who could point it anywhere"
    )
    assert f"cannot use {link / 'prod3.db'} ({reason})" in warning
    assert "in memory" in warning


@pytest.mark.anyio
@pytest.mark.parametrize("place", ["root", "missing-root-below", "file"])
async def test_a_root_through_another_users_symlink_stays_in_memory(
    shared_tmp: Path, place: str
) -> None:
    link, victim = _planted(shared_tmp)
    kwargs = {
        "root": {"root": link},
        "missing-root-below": {"root": link / "a" / "b"},
        "file": {"file": link / "prod3.db"},
    }[place]
    with pytest.warns(UserWarning) as caught:
        async with open_environment("prod3", **kwargs) as env:  # type: ignore[arg-type]
            await env.storage(NS).insert(b"k", b"v")
            assert env.in_memory
            reason = env.degraded.reason if env.degraded else None
    [warning] = [str(w.message) for w in caught]
    assert reason is not None and reason.startswith(f"{link} is a symlink of another user's")
    if place == "root":
        _assert_refused(warning, reason, link)
    assert list(victim.iterdir()) == []


def test_blocking_does_not_open_through_another_users_symlink(shared_tmp: Path) -> None:
    link, victim = _planted(shared_tmp)
    with pytest.warns(UserWarning) as caught:
        with warmenv.blocking.open("prod3", root=link) as env:
            env.store(NS).insert("k", "v")
            assert env.in_memory
            reason = env.degraded.reason if env.degraded else None
    [warning] = [str(w.message) for w in caught]
    _assert_refused(warning, reason, link)
    assert list(victim.iterdir()) == []


@pytest.mark.anyio
async def test_a_root_under_a_directory_others_may_write_without_the_sticky_bit_stays_in_memory(
    shared_tmp: Path,
) -> None:
    open_dir = shared_tmp / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.warns(UserWarning, match="without the sticky bit") as caught:
        async with open_environment("e", root=open_dir / "envs") as env:
            assert env.in_memory
            assert env.degraded is not None
            assert env.degraded.reason == (
                f"{open_dir} can be written by other users without the sticky bit "
                f"(mode drwxrwxrwx), who could swap what is in it; run `chmod +t {open_dir}` "
                "(the sticky bit /tmp has) or choose a root elsewhere"
            )
    assert len(caught) == 1
    assert list(open_dir.iterdir()) == []


@pytest.mark.anyio
async def test_running_the_chmod_the_warning_names_opens_the_root_on_disk(
    shared_tmp: Path,
) -> None:
    open_dir = shared_tmp / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.warns(UserWarning) as caught:
        async with open_environment("e", root=open_dir / "envs"):
            pass
    [fix] = re.findall(r"run `(chmod \+t [^`]+)`", str(caught[0].message))
    await anyio.run_process(shlex.split(fix))
    async with open_environment("e", root=open_dir / "envs") as env:
        assert not env.in_memory


# --- the setups people use still open on disk ------------------------------------


def _as_nobody(kwargs: dict[str, str], backend_name: str) -> dict[str, object]:
    child = run_python(_ASYNC_CHILD, json.dumps(kwargs), backend_name, user=unprivileged_user())
    [report] = json_lines(child)
    assert isinstance(report, dict)
    return report


@pytest.mark.anyio
@pytest.mark.parametrize("place", ["own-dir", "missing-dir", "own-symlink", "roots-symlink"])
async def test_a_users_own_root_under_a_sticky_directory_opens_on_disk(
    shared_tmp: Path, backend_name: str, place: str
) -> None:
    sticky = shared_tmp / "tmp"  # as /tmp: root's, mode 1777
    sticky.mkdir()
    sticky.chmod(0o1777)
    mine = sticky / "mine"
    made = run_python(
        "import os, sys; os.mkdir(sys.argv[1]); os.symlink(sys.argv[1], sys.argv[2])",
        str(mine),
        str(sticky / "my-link"),
        user=unprivileged_user(),
    )
    assert made.returncode == 0, made.stderr
    os.symlink(mine, sticky / "roots-link")
    root = {
        "own-dir": mine,
        "missing-dir": sticky / "new" / "deeper",
        "own-symlink": sticky / "my-link",
        "roots-symlink": sticky / "roots-link",
    }[place]
    report = _as_nobody({"root": str(root)}, backend_name)
    assert (report["in_memory"], report["stored"], report["warnings"]) == (False, True, [])
    assert (root / "e.db").is_file()


@pytest.mark.anyio
async def test_the_default_root_opens_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("XDG_DATA_HOME", "WARMENV_ROOT", "WARMENV_ENVIRONMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with open_environment() as env:
            assert not env.in_memory
            assert env.path.is_relative_to(tmp_path / "home")


@pytest.mark.anyio
async def test_a_root_made_under_a_umask_of_002_opens_on_disk_again(tmp_path: Path) -> None:
    """The first open made the root as `mkdir -p` does, 0777 less the umask: under a umask
    of 002 (user private groups) it was group-writable, and every later open of any of its
    environments was refused as one others could redirect (and `warmenv run` at once)."""
    root = tmp_path / "new" / "root"
    before = os.umask(0o002)
    try:
        async with open_environment("e", root=root) as env:
            assert not env.in_memory
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            async with open_environment("e", root=root) as env:
                assert not env.in_memory
    finally:
        os.umask(before)

    assert [oct(p.stat().st_mode & 0o777) for p in (root.parent, root)] == ["0o755", "0o755"]


def test_a_dotdot_after_a_missing_step_does_not_end_the_check(shared_tmp: Path) -> None:
    """`mine/missing/../../shared/sub`: the system climbs out of the missing step (which
    `mkdir(parents=True)` then creates) and goes on through `nobody`'s symlink, so the
    check goes on too; a missing step with no `..` after it still ends it."""
    from warmenv._fs import why_redirectable

    link, victim = _planted(shared_tmp)
    (shared_tmp / "mine").mkdir()
    bent = shared_tmp / "mine" / "missing" / ".." / ".." / "shared" / "sub" / "prod3.db"
    reason = why_redirectable(bent)
    assert reason is not None and reason.startswith(f"{link} is a symlink of another user's")
    assert why_redirectable(shared_tmp / "mine" / "missing" / "deeper" / "prod3.db") is None
    assert list(victim.iterdir()) == []
