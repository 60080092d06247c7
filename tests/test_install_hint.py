"""An extra's install hint works wherever warmenv was installed from (it is not on PyPI)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from helpers import CLONE, run_python
from warmenv._install import hint_from, install_hint

_REQUIRES = """\
Metadata-Version: 2.3
Name: warmenv
Version: 0.2.0
Requires-Dist: anyio>=4.16
Requires-Dist: httpx>=0.27; extra == 'http'
Requires-Dist: jax>=0.10; extra == "jax"
Requires-Dist: jaxlib>=0.10; extra == "jax"
Requires-Dist: torch==2.13.0; extra == "torch"
Requires-Dist: starlette>=0.37; extra == "examples"
"""


def _made(tmp_path: Path, direct_url: dict[str, object] | None = None) -> metadata.Distribution:
    info = tmp_path / "warmenv-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(_REQUIRES, encoding="utf-8")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url), encoding="utf-8")
    return metadata.PathDistribution(info)


def test_the_hint_in_this_editable_install_names_the_clone() -> None:
    assert install_hint("http") == f"pip install -e '{CLONE}[http]'"


def test_without_a_local_directory_the_hint_names_the_extras_requirements(tmp_path: Path) -> None:
    made = _made(tmp_path)
    assert hint_from(made, "http") == "pip install 'httpx>=0.27'"
    assert hint_from(made, "jax") == "pip install 'jax>=0.10' 'jaxlib>=0.10'"


def test_the_torch_hint_keeps_its_exact_pin(tmp_path: Path) -> None:
    assert hint_from(_made(tmp_path), "torch") == "pip install torch==2.13.0"


def test_installed_from_a_url_the_hint_names_the_requirements(tmp_path: Path) -> None:
    made = _made(tmp_path, {"url": "https://example.org/warmenv.tar.gz", "archive_info": {}})
    assert hint_from(made, "http") == "pip install 'httpx>=0.27'"


def test_installed_from_a_directory_not_editably_the_hint_has_no_dash_e(tmp_path: Path) -> None:
    made = _made(tmp_path, {"url": "file:///src/my%20warmenv", "dir_info": {}})
    assert hint_from(made, "sign") == "pip install '/src/my warmenv[sign]'"


_WITHOUT_HTTPX = """
import sys
sys.modules["httpx"] = None  # as if it were not installed
from warmenv.cli import main
sys.exit(main(["import", "--root", sys.argv[1], "http://127.0.0.1:9/x.bundle"]))
"""


def test_importing_by_url_without_httpx_says_how_to_install_it_from_here(tmp_path: Path) -> None:
    completed = run_python(_WITHOUT_HTTPX, str(tmp_path / "root"))
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr.strip().endswith(f"install it with: pip install -e '{CLONE}[http]'")
