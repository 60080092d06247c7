"""An environment never fails to open for reasons outside the program.

Every place the process may not look into (a root of another user's, mode
0700; a directory it may read but not search; a missing root below either;
a `file=` there; a working directory there, where the settings are looked
for) opens in memory with one warning whose reason names the directory in
the way, as the docs promise, on every backend and from `warmenv.blocking`.
Even `create=False` and `read_only=True`, which raise `FileNotFoundError`
for an environment that is not there, do not claim one is missing that
they could not look for. Each case runs in a child that is `nobody` (we run
as root, where modes do not bind).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers import json_lines, run_python, unprivileged_user
from warmenv import open_environment

_ASYNC_CHILD = textwrap.dedent(
    """
    import json, sys, warnings, anyio
    from warmenv import Namespace, Stored, open_environment

    async def main(kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with open_environment("e", **kwargs) as env:
                storage = env.storage(Namespace("app", "kernels", version="1"))
                stored = await storage.insert(b"k", b"v") == Stored()
                print(json.dumps({
                    "in_memory": env.in_memory,
                    "reason": env.degraded.reason if env.degraded else None,
                    "stored": stored,
                    "read": (await storage.get(b"k")).decode(),
                    "warnings": [str(w.message) for w in caught],
                }))

    anyio.run(main, json.loads(sys.argv[1]), backend=sys.argv[2])
    """
)

_BLOCKING_CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import warmenv.blocking
    from warmenv import Namespace, Stored

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with warmenv.blocking.{opener}("e", **json.loads(sys.argv[1])) as env:
            store = env.store(Namespace("app", "kernels", version="1"))
            stored = store.insert("k", "v") == Stored()
            print(json.dumps({{
                "in_memory": env.in_memory,
                "reason": env.degraded.reason if env.degraded else None,
                "stored": stored,
                "read": store.get("k"),
                "warnings": [str(w.message) for w in caught],
            }}))
    """
)


def _closed(directory: Path, mode: int = 0o700) -> Path:
    """`directory` made (root's), then closed to everyone else as `mode` says."""
    directory.mkdir()
    directory.chmod(mode)
    return directory


async def _holding_a_database(directory: Path) -> Path:
    directory.mkdir()
    async with open_environment("e", root=directory):
        pass
    directory.chmod(0o700)
    return directory


# Each case: the place, set up as root; the open's arguments and the directory in the way.
async def _root_0700(tmp: Path) -> tuple[dict[str, Any], Path]:
    locked = _closed(tmp / "locked")
    return {"root": str(locked)}, locked


async def _root_0700_holding_the_database(tmp: Path) -> tuple[dict[str, Any], Path]:
    locked = await _holding_a_database(tmp / "locked")
    return {"root": str(locked)}, locked


async def _root_readable_not_searchable(tmp: Path) -> tuple[dict[str, Any], Path]:
    locked = _closed(tmp / "locked", 0o744)
    return {"root": str(locked)}, locked


async def _missing_root_below_0700(tmp: Path) -> tuple[dict[str, Any], Path]:
    locked = _closed(tmp / "locked")
    return {"root": str(locked / "sub" / "deeper")}, locked


async def _file_below_0700(tmp: Path) -> tuple[dict[str, Any], Path]:
    locked = _closed(tmp / "locked")
    return {"file": str(locked / "mine.db")}, locked


async def _only_existing_below_0700(tmp: Path) -> tuple[dict[str, Any], Path]:
    locked = await _holding_a_database(tmp / "locked")
    return {"root": str(locked), "create": False}, locked


async def _read_only_below_0700(tmp: Path) -> tuple[dict[str, Any], Path]:
    locked = await _holding_a_database(tmp / "locked")
    return {"root": str(locked), "read_only": True}, locked


CASES = {
    "root-0700": _root_0700,
    "root-0700-holding-the-database": _root_0700_holding_the_database,
    "root-readable-not-searchable": _root_readable_not_searchable,
    "missing-root-below-0700": _missing_root_below_0700,
    "file-below-0700": _file_below_0700,
    "create-false-below-0700": _only_existing_below_0700,
    "read-only-below-0700": _read_only_below_0700,
}


def _assert_in_memory_because_of(report: object, locked: Path) -> None:
    assert isinstance(report, dict)
    reason = f"{locked} is not searchable by this process"
    assert report["reason"] == reason
    assert (report["in_memory"], report["stored"], report["read"]) == (True, True, "v")
    [warning] = report["warnings"]
    assert reason in warning and "in memory" in warning


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES)
async def test_a_place_the_process_may_not_look_into_opens_in_memory(
    shared_tmp: Path, backend_name: str, case: str
) -> None:
    kwargs, locked = await CASES[case](shared_tmp)
    child = run_python(_ASYNC_CHILD, json.dumps(kwargs), backend_name, user=unprivileged_user())
    [report] = json_lines(child)
    _assert_in_memory_because_of(report, locked)


@pytest.mark.parametrize("opener", ["open", "open_environment"])
def test_blocking_opens_in_memory_under_a_root_it_may_not_look_into(
    shared_tmp: Path, opener: str
) -> None:
    locked = _closed(shared_tmp / "locked")
    kwargs = {"root": str(locked)}
    code = _BLOCKING_CHILD.format(opener=opener)
    child = run_python(code, json.dumps(kwargs), user=unprivileged_user())
    [report] = json_lines(child)
    _assert_in_memory_because_of(report, locked)


@pytest.mark.anyio
async def test_a_working_directory_it_may_not_search_does_not_stop_the_open(
    shared_tmp: Path, backend_name: str
) -> None:
    # Where the settings are looked for (warmenv.toml, pyproject.toml from the
    # working directory up): `sudo -u app` keeps a working directory under /root.
    locked = _closed(shared_tmp / "home")
    writable = shared_tmp / "envs"
    writable.mkdir()
    writable.chmod(0o1777)  # as /tmp: others may write, not rename what is not theirs
    kwargs = json.dumps({"root": str(writable)})
    child = run_python(
        _ASYNC_CHILD, kwargs, backend_name, user=unprivileged_user(), cwd=str(locked)
    )
    [report] = json_lines(child)
    assert isinstance(report, dict)
    assert (report["in_memory"], report["stored"], report["warnings"]) == (False, True, [])
    assert (writable / "e.db").is_file()
