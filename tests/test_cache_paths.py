"""A compiler cache directory under an unknown user's home is one clear line, not a RuntimeError.

`Path.expanduser` raises a bare `RuntimeError` for `~nosuchuser/x`; the
configuration said so in one line since issue 22 (defect 12), but the
compiler caches expanded their directories themselves: `cache_dir=`, the
compilers' own variables (`TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`,
`TRITON_HOME`) and the directory given to capture and restore. Each is now
`warmenv._fs.expand_home`'s (the one expansion, which
`tests/test_architecture.py` keeps the only one), and its error names
where the path was given. Every entry point is tried; none needs the
compiler installed to refuse the path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import one_trial
from warmenv import WarmenvError, open_environment
from warmenv.caches import directory, jax, numba, torch, triton

NOBODY = "~warmenv-no-such-user/cache"
_ROW = (
    "compiler cache directories under an unknown user's home: use(cache_dir=) of jax, numba, "
    "torch; TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, TRITON_HOME; capture and restore",
    "one WarmenvError line naming the path and where it was given; no RuntimeError",
)

BLOCKING: dict[str, tuple[Callable[..., Any], dict[str, str], str]] = {
    "jax.use": (lambda root: jax.use("e", root=root, cache_dir=NOBODY), {}, "cache_dir"),
    "numba.use": (lambda root: numba.use("e", root=root, cache_dir=NOBODY), {}, "cache_dir"),
    "torch.use": (lambda root: torch.use("e", root=root, cache_dir=NOBODY), {}, "cache_dir"),
    "TORCHINDUCTOR_CACHE_DIR": (
        lambda root: torch.use("e", root=root),
        {"TORCHINDUCTOR_CACHE_DIR": NOBODY},
        "TORCHINDUCTOR_CACHE_DIR",
    ),
    "TRITON_CACHE_DIR": (
        lambda root: triton.cache_dir(),
        {"TRITON_CACHE_DIR": NOBODY},
        "TRITON_CACHE_DIR",
    ),
    "TRITON_HOME": (lambda root: triton.cache_dir(), {"TRITON_HOME": NOBODY}, "TRITON_HOME"),
}


@pytest.mark.parametrize("case", sorted(BLOCKING))
def test_a_cache_directory_under_an_unknown_home_is_one_line_naming_where(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    call, variables, where = BLOCKING[case]
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with one_trial(*_ROW):
        with pytest.raises(WarmenvError) as raised:
            call(tmp_path)
        assert str(raised.value).startswith(f"{where}: {NOBODY!r}"), raised.value
        assert "names no home directory" in str(raised.value)
    assert not (tmp_path / "e.caches").exists()  # the environment's own default


ASYNC: dict[str, Callable[..., Any]] = {
    "directory.capture": lambda env: directory.capture(env, NOBODY, tool="t", facts=("x",)),
    "directory.restore": lambda env: directory.restore(env, NOBODY, tool="t", facts=("x",)),
    "jax.capture": lambda env: jax.capture(env, NOBODY),
    "jax.restore": lambda env: jax.restore(env, NOBODY),
    "numba.restore": lambda env: numba.restore(env, NOBODY),
    "triton.restore": lambda env: triton.restore(env, NOBODY),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", sorted(ASYNC))
async def test_capture_and_restore_under_an_unknown_home_are_one_line(
    case: str, tmp_path: Path
) -> None:
    async with open_environment("e", root=tmp_path) as env:
        with one_trial(*_ROW):
            with pytest.raises(WarmenvError, match="names no home directory") as raised:
                await ASYNC[case](env)
            assert NOBODY in str(raised.value)
