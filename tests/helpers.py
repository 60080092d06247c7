"""Helpers for tests that need real OS processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys


def _interpreter_for(user: str | None) -> str:
    """An interpreter `user` may execute: ours, or the system one of the same version."""
    if user is None:
        return sys.executable
    try:
        probe = subprocess.run([sys.executable, "-c", "pass"], user=user, capture_output=True)
    except PermissionError:
        pass  # our interpreter lives where `user` may not go (pyenv under /root)
    else:
        if probe.returncode == 0:
            return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    if system is None:
        raise RuntimeError(
            f"no {version} that the user {user!r} may execute; install one (apt-get install "
            f"{version}) so permission tests can run"
        )
    return system


def unprivileged_user() -> str | None:
    """The user permission tests run as: `nobody` under root (where chmod does not bind)."""
    return "nobody" if os.geteuid() == 0 else None


def run_python(
    code: str, *args: str, user: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (as `user`), seeing the same packages as we do."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [_interpreter_for(user), "-c", code, *args],
        user=user,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


def json_lines(completed: subprocess.CompletedProcess[str]) -> list[object]:
    assert completed.returncode == 0, completed.stderr
    return [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
