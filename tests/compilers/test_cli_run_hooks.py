"""`warmenv run`'s hooks outlive it, and no other user can put code where they are.

A process the command leaves running (`&`, nohup, setsid) keeps the
`PYTHONPATH` `warmenv run` gave it, and its later `import torch` loads the
entry points declared in the first directory there. So that directory is
never removed when `warmenv run` ends and is never one another user can
create or write: the attack review's scenario, with a real `warmenv run`
and a real other user (`nobody`, where the tests run as root).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from compilers.machines import require
from helpers import unprivileged_user

_PLANT = textwrap.dedent(
    """
    mkdir -p "$1/x-0.dist-info" &&
    printf 'Metadata-Version: 2.1\\nName: x\\nVersion: 0\\n' > "$1/x-0.dist-info/METADATA" &&
    printf '[torch.backends]\\nx = evilhook:autoload\\n' > "$1/x-0.dist-info/entry_points.txt" &&
    printf 'def autoload():\\n    print("planted")\\n' > "$1/evilhook.py"
    """
)


def test_no_other_user_can_plant_code_where_a_commands_hooks_outlive_warmenv_run(
    tmp_path: Path,
) -> None:
    require("torch")  # warmenv run --cache torch refuses to run without torch
    seen = tmp_path / "pythonpath"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("WARMENV_", "PYTHON"))}
    environ["XDG_CACHE_HOME"] = str(tmp_path / "home-cache")
    completed = subprocess.run(
        [sys.executable, "-m", "warmenv", "--root", str(tmp_path / "root"), "run",
         "--cache", "torch", "--", "sh", "-c", f'printf %s "$PYTHONPATH" > {seen}'],
        capture_output=True, text=True, timeout=300, env=environ, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    hooks = Path(seen.read_text().split(os.pathsep)[0])
    before = sorted(p.relative_to(hooks) for p in hooks.rglob("*"))
    user = unprivileged_user()
    if user is None:  # not root: no other user to be; the directory must keep them out
        for path in (hooks, *hooks.parents):
            mode = path.stat().st_mode
            assert not mode & (stat.S_IWGRP | stat.S_IWOTH) or mode & stat.S_ISVTX, path
        assert (hooks / "warmenv_run_hooks_torch.py").is_file()
        return
    planted = subprocess.run(
        ["sh", "-c", _PLANT, "plant", str(hooks)],
        user=user, capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert planted.returncode != 0, "nobody planted a torch.backends entry point"
    assert (hooks / "warmenv_run_hooks_torch.py").is_file()  # still there for a late process
    assert sorted(p.relative_to(hooks) for p in hooks.rglob("*")) == before
