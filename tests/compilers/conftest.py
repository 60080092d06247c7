"""The two machines every compiler test runs on (see machines.py)."""

from __future__ import annotations

import pytest

from compilers.machines import Machine


@pytest.fixture
def machines(tmp_path_factory: pytest.TempPathFactory) -> tuple[Machine, Machine]:
    first = tmp_path_factory.mktemp("machine-a") / "srv" / "app"
    second = tmp_path_factory.mktemp("b") / "home" / "ci" / "work" / "app"
    for machine in (first, second):
        machine.mkdir(parents=True)
    return Machine(first), Machine(second)
