"""The compiler tests' machines (`nox -s compilers`): real compilers, two "machines".

A machine is a directory at its own absolute path (one deeper than the
other, neither a prefix of the other) holding the application's code, its
warmenv root and its compiler cache; each run is a fresh interpreter whose
working directory is that machine. What one machine captured reaches the
other only through a bundle: export, then import into a fresh root.

A compiler that is not installed fails its tests with the install hint:
these tests exist to prove the real thing works, so a skip would hide that.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from warmenv import open_environment
from warmenv.bundle import export_bundle, import_bundle

HINTS = {
    "jax": "pip install -e '.[jax]' from the clone  (jax and jaxlib)",
    "numba": "pip install -e '.[numba]' from the clone",
    "triton": "pip install -e '.[triton]' from the clone  (triton==3.8.0)",
    "torch": "pip install -e '.[torch]' from the clone  (torch==2.13.0: never a bare torch)",
}


def require(module: str) -> None:
    """Fail (never skip) when a compiler the test needs is missing, saying how to install it."""
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed; {HINTS.get(module, 'pip install ' + module)}")


def count_hops(monkeypatch: pytest.MonkeyPatch, hops: dict[str, int]) -> None:
    """From now until `monkeypatch.undo()`, count thread hops into `hops`: each
    `anyio.to_thread.run_sync` ("thread") and each `SqliteDatabase.run` ("sqlite").
    Call it inside the event loop, after the test's own set-up has made its hops."""
    from warmenv.persistence.sqlite.database import SqliteDatabase

    hops.update(thread=0, sqlite=0)
    to_thread, run = anyio.to_thread.run_sync, SqliteDatabase.run

    async def on_a_thread(*args: Any, **kwargs: Any) -> Any:
        hops["thread"] += 1
        return await to_thread(*args, **kwargs)

    async def on_sqlites_thread(self: SqliteDatabase, fn: Any) -> Any:
        hops["sqlite"] += 1
        return await run(self, fn)

    monkeypatch.setattr(anyio.to_thread, "run_sync", on_a_thread)
    monkeypatch.setattr(SqliteDatabase, "run", on_sqlites_thread)


@attrs.frozen
class Machine:
    home: Path

    @property
    def root(self) -> Path:
        return self.home / "warmenv-root"

    @property
    def cache(self) -> Path:
        return self.home / "cache"

    def write(self, name: str, code: str) -> Path:
        path = self.home / name
        path.write_text(textwrap.dedent(code), encoding="utf-8")
        return path

    def run(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> dict[str, Any]:
        """Run a fresh process here; its last stdout line is JSON, returned."""
        completed = self.process(*argv, env=env, timeout=timeout)
        assert completed.returncode == 0, completed.stderr[-4000:]
        lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
        assert lines, completed.stdout + completed.stderr[-4000:]
        found = json.loads(lines[-1])
        assert isinstance(found, dict)
        return found

    def warmenv_run(
        self,
        caches: tuple[str, ...],
        *command: str,
        env: dict[str, str] | None = None,
        timeout: float = 300,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """`warmenv run --cache ... --json -- python COMMAND` here: the command's JSON line
        (its first on standard output, which `--json` sends to standard error) and
        `warmenv run`'s report (the whole of standard output)."""
        options = [option for tool in caches for option in ("--cache", tool)]
        completed = self.process(
            *(sys.executable, "-m", "warmenv", "run", *options, "--json"),
            *("--", sys.executable, *command),
            env=env,
            timeout=timeout,
        )
        assert completed.returncode == 0, completed.stderr[-4000:]
        app = next(line for line in completed.stderr.splitlines() if line.startswith("{"))
        return json.loads(app), json.loads(completed.stdout)

    def process(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        variables = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("JAX_", "NUMBA_", "XLA_", "TRITON_", "TORCHINDUCTOR_", "WARMENV_"))
        }
        variables["WARMENV_ROOT"] = str(self.root)
        variables["XDG_CACHE_HOME"] = str(self.home / "user-cache")  # warmenv run's hooks
        variables.update(env or {})
        return subprocess.run(
            [sys.executable if argv[0] == "python" else argv[0], *argv[1:]],
            cwd=self.home,
            env=variables,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def ship(source: Machine, target: Machine, tmp_path: Path) -> None:
    """Export the source machine's environment and import it into the target's fresh root."""
    bundle = tmp_path / "caches.bundle"

    async def main() -> None:
        async with open_environment("default", root=source.root) as env:
            await export_bundle([env], bundle, name="ci", version="1")
        assert not target.root.exists()
        async with open_environment("default", root=target.root) as env:
            await import_bundle(bundle, env)

    anyio.run(main)


def copy_tree(source: Path, target: Path) -> None:
    """What users do today: copy the cache directory as it is."""
    shutil.copytree(source, target)
