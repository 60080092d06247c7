"""Malformed bundles: only BundleError subclasses come out, and nothing is written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import sample_entries
from warmenv import Environment, open_environment
from warmenv.bundle import BundleError, BundleFormat, export_bundle, import_bundle, open_bundle

pytestmark = pytest.mark.anyio

EXAMPLES = int(os.environ.get("WARMENV_FUZZ_EXAMPLES", "30"))
_templates: dict[str, bytes] = {}


async def _template(fmt: str, tmp: Path) -> bytes:
    """A small valid bundle of each format, made once per session."""
    if fmt not in _templates:
        async with open_environment("fuzz-source", root=tmp) as env:
            for namespace, items in sample_entries().items():
                await env.storage(namespace).insert_many(list(items.items())[:8])
            out = tmp / f"template.{fmt}"
            await export_bundle(env, out, name="fuzz", version="1", format=fmt)
        _templates[fmt] = out.read_bytes()
    return _templates[fmt]


mutations = st.lists(
    st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=8
)


def _mutate(data: bytes, flips: list[tuple[float, int]], cut: float | None) -> bytes:
    blob = bytearray(data)
    for where, xor in flips:
        blob[int(where * len(blob))] ^= xor
    if cut is not None:
        blob = blob[: int(cut * len(blob))]
    return bytes(blob)


async def _check_import(path: Path, env: Environment) -> None:
    try:
        report = await import_bundle(path, env)
    except BundleError:
        assert await env.namespaces() == [], "a rejected bundle wrote to the environment"
        return
    # The damage left a valid bundle (a changed label, say): it imports whole.
    async with open_bundle(path) as bundle:
        served = sum(s.entries for s in await bundle.namespaces())
    assert report.imported == served
    for summary in await env.namespaces():
        await env.storage(summary.namespace).purge()


@pytest.mark.parametrize("fmt", [BundleFormat.SQLITE, BundleFormat.FLAT])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(flips=mutations, cut=st.none() | st.floats(0, 1))
async def test_mutated_and_truncated_bundles_raise_only_bundle_errors(
    tmp_path_factory: pytest.TempPathFactory,
    fmt: str,
    flips: list[tuple[float, int]],
    cut: float | None,
) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    template = await _template(fmt, tmp_path_factory.mktemp("template"))
    path = tmp / "hostile.bundle"
    path.write_bytes(_mutate(template, flips, cut))
    async with open_environment("target", root=tmp) as env:
        await _check_import(path, env)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.binary(max_size=512))
async def test_random_bytes_raise_only_bundle_errors(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    tmp = tmp_path_factory.mktemp("random")
    path = tmp / "random.bundle"
    path.write_bytes(data)
    with pytest.raises(BundleError):
        async with open_bundle(path):
            pass


@pytest.mark.anyio
@pytest.mark.parametrize("cut", [10, 14, 40])  # in the version, the manifest length, the manifest
async def test_a_truncated_flat_header_error_names_the_file(tmp_path: Path, cut: int) -> None:
    # It said only "flat bundle truncated: the format version needs 4 bytes ...".
    path = tmp_path / "cut.bundle"
    path.write_bytes((await _template("flat", tmp_path))[:cut])
    said = f"{path} is a flat warmenv bundle cut short at byte {cut} (the "
    with pytest.raises(BundleError, match="^" + re.escape(said)):
        async with open_bundle(path):
            pass
