"""A short, derandomised form of the fuzz run (tests/fuzz.py; `nox -s fuzz` runs the long one).

Whatever the bytes, the bundle readers and the manifest parser either work or
raise a `BundleError` (or `OSError`); see tests/fuzz.py for the inputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz import Case, bundle_cases, exercise_bundle, exercise_manifest, manifest_inputs
from warmenv import open_environment

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("WARMENV_FUZZ_EXAMPLES", "60"))
_SHORT = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


@pytest.mark.anyio
@_SHORT
@given(case=bundle_cases())
async def test_any_bundle_bytes_open_read_verify_and_import_or_raise_a_bundle_error(
    tmp_path_factory: pytest.TempPathFactory, case: Case
) -> None:
    workdir = tmp_path_factory.mktemp("fuzz")
    async with open_environment("fuzz", root=workdir / "root") as env:
        outcomes = await exercise_bundle(case, workdir, env)
    assert set(outcomes) >= {"open_bundle", "import_bundle", "FlatBundle.from_bytes"}


@_SHORT
@given(data=manifest_inputs)
def test_any_manifest_text_parses_or_raises_a_bundle_error(data: bytes | str) -> None:
    exercise_manifest(data)


@pytest.mark.anyio
async def test_the_fuzz_inputs_reach_past_verification(tmp_path: Path) -> None:
    """A fuzz run that never got past the digest would prove little about the import."""
    from fuzz import seed_bundles

    seeds = seed_bundles()
    async with open_environment("fuzz", root=tmp_path / "root") as env:
        for kind, data in (("flat", seeds.flat[1]), ("sqlite", seeds.sqlite[1])):
            case = Case(kind=kind, steps=(), data=data, reseal=False)
            outcomes = await exercise_bundle(case, tmp_path, env)
            assert outcomes["import_bundle"] == "ok"
            assert outcomes["open_bundle"] == "ok"
