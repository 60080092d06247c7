"""Each environment's compiler caches default to a directory of its own.

A cache directory is captured whole into the environment a run names. Earlier
versions gave every environment of a root `<root>/caches/<tool>`, so a run
in `b` that compiled nothing captured what a run in `a` had left there (a
new-user review: "captured 2 files ... 2 new", and `ls b` listed
`caches.numba`). The default is now `<root>/<environment>.caches/<tool>`, the
one rule (`warmenv.caches._home`) behind `warmenv run`, each tool's
`default_cache_dir` and `use()`, and Triton's live directory. Nothing here
needs a compiler installed; the real two-environment run is in
tests/compilers/test_cli_run_environments.py.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from warmenv import blocking, open_environment
from warmenv.caches import directory, jax, numba, torch, triton

DEFAULTS: dict[str, Callable[..., Path]] = {
    "jax": jax.default_cache_dir,
    "numba": numba.default_cache_dir,
    "torch": torch.default_cache_dir,
    "triton-live": triton.live_cache_dir,
}


@pytest.mark.parametrize("tool", sorted(DEFAULTS))
def test_two_environments_of_one_root_default_to_directories_apart(
    tool: str, tmp_path: Path
) -> None:
    a = DEFAULTS[tool]("a", root=tmp_path)
    b = DEFAULTS[tool]("b", root=tmp_path)

    assert a == tmp_path / "a.caches" / tool
    assert b == tmp_path / "b.caches" / tool
    assert a not in (b, *b.parents) and b not in (a, *a.parents)


@pytest.mark.parametrize("tool", sorted(DEFAULTS))
def test_an_environment_named_like_a_tool_stays_clear_of_the_old_shared_directory(
    tool: str, tmp_path: Path
) -> None:
    """Earlier versions' `<root>/caches/<tool>` is left alone: no default lies in it."""
    found = DEFAULTS[tool](tool.partition("-")[0], root=tmp_path)

    assert tmp_path / "caches" not in found.parents


@pytest.mark.parametrize("tool", sorted(DEFAULTS))
def test_with_no_environment_given_the_default_is_the_configured_one(
    tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMENV_ROOT", str(tmp_path / "configured"))
    monkeypatch.setenv("WARMENV_ENVIRONMENT", "svc")

    assert DEFAULTS[tool]() == tmp_path / "configured" / "svc.caches" / tool


@pytest.mark.parametrize("tool", sorted(DEFAULTS))
def test_an_open_blocking_environment_gives_the_directory_beside_its_file(
    tool: str, tmp_path: Path
) -> None:
    with blocking.open_environment(file=tmp_path / "elsewhere" / "svc.db") as by_file:
        assert DEFAULTS[tool](by_file) == tmp_path / "elsewhere" / "svc.caches" / tool
    with blocking.open_environment("svc", root=tmp_path / "root") as by_name:
        assert DEFAULTS[tool](by_name) == DEFAULTS[tool]("svc", root=tmp_path / "root")


@pytest.mark.parametrize("tool", sorted(DEFAULTS))
def test_a_name_that_names_no_environment_is_refused_not_made_a_path(
    tool: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=re.escape("invalid environment name '../a'")):
        DEFAULTS[tool]("../a", root=tmp_path)
    with pytest.raises(TypeError, match="not int"):
        DEFAULTS[tool](3, root=tmp_path)


@pytest.mark.anyio
async def test_an_environment_s_caches_directory_is_made_closed_to_others_whatever_the_umask(
    tmp_path: Path,
) -> None:
    """A restore made `<name>.caches` as `mkdir -p` does (0777 less the umask): under a
    umask of 002 it was group-writable, and the next restore refused the target in it."""
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "gemm.cubin").write_bytes(b"compiled kernel")
    target = root / "a.caches" / "mykernels"
    async with open_environment("a", root=root) as env:
        await directory.capture(env, kernels, tool="mykernels", facts=("attrs",))
        before = os.umask(0o002)
        try:
            first = await directory.restore(env, target, tool="mykernels", facts=("attrs",))
            again = await directory.restore(env, target, tool="mykernels", facts=("attrs",))
        finally:
            os.umask(before)

    assert (first.written, again.kept) == (1, 1)
    assert stat.S_IMODE((root / "a.caches").stat().st_mode) == 0o755
