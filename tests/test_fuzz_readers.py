"""A short, derandomised form of the fuzz run (tests/fuzz.py; `nox -s fuzz` runs the long one).

Whatever the bytes, the bundle readers and the manifest parser either work or
raise a `BundleError` (or `OSError`); see tests/fuzz.py for the inputs. The
defects the long run found have regression tests below; all are fixed, so
`fuzz.KNOWN_DEFECTS` (what the short form would let through) is empty.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz import (
    _GOOD_MANIFEST,
    KNOWN_DEFECTS,
    Case,
    bundle_cases,
    exercise_bundle,
    exercise_manifest,
    known_defect,
    manifest_inputs,
    sealed_digest,
    seed_bundles,
    write_flat,
    write_sqlite,
)

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("WARMENV_FUZZ_EXAMPLES", "40"))
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
    try:
        outcomes = await exercise_bundle(case, workdir)
    except Exception as exc:
        if known_defect(exc) is None:
            raise
        return
    assert set(outcomes) >= {"open_bundle", "import_bundle", "FlatBundle.from_bytes"}


@_SHORT
@given(data=manifest_inputs)
def test_any_manifest_text_parses_or_raises_a_bundle_error(data: bytes | str) -> None:
    try:
        exercise_manifest(data)
    except Exception as exc:
        if known_defect(exc) is None:
            raise


@pytest.mark.anyio
async def test_the_fuzz_inputs_reach_past_verification(tmp_path: Path) -> None:
    """A fuzz run that never got past the digest would prove little about the import."""
    seeds = seed_bundles()
    for kind, data in (
        ("flat", seeds.flat[1]),
        ("sqlite", seeds.sqlite[1]),
        ("flat format 1", seeds.flat[3]),
        ("sqlite format 1", seeds.sqlite[3]),
    ):
        case = Case(kind=kind, steps=(), data=data, reseal=False)
        outcomes = await exercise_bundle(case, tmp_path)
        assert outcomes["import_bundle"] == "ok"
        assert outcomes["open_bundle"] == "ok"


def test_known_defects_are_matched_by_type_and_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every finding so far is fixed (KNOWN_DEFECTS is empty); the matcher still works for
    # the next one.
    monkeypatch.setitem(KNOWN_DEFECTS, "example", (ValueError, "a namespace must be"))
    assert known_defect(ValueError("a namespace must be a non-empty str, got ''")) == "example"
    assert known_defect(ValueError("something else")) is None
    assert known_defect(RuntimeError("a namespace must be a non-empty str, got ''")) is None


# --- the defects the fuzz run found (docs/reliability.md) ------------------------------------


def _sealed(kind: str, entries: dict[str, dict[bytes, bytes]], encoding: str = "UTF-8") -> Case:
    manifest = json.dumps(dict(_GOOD_MANIFEST, digest=sealed_digest(entries)))
    if kind == "flat":
        data = write_flat(entries, manifest.encode())
    else:
        data = write_sqlite(seed_bundles().sqlite[0], entries, manifest.encode(), encoding)
    return Case(kind=f"{kind}-sealed", steps=(repr(entries),), data=data, reseal=False)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["flat", "sqlite"])
async def test_a_bundle_whose_namespace_is_empty_raises_only_bundle_errors(
    tmp_path: Path, kind: str
) -> None:
    """Found by the fuzz run: import_bundle and preflight(version=...) raise ValueError
    (from Namespace.raw), and `warmenv verify`/`check` call such a bundle ok."""
    await exercise_bundle(_sealed(kind, {"": {b"k": b"v"}}), tmp_path)


@pytest.mark.parametrize("field", ["name", "version", "created"])
def test_a_manifest_holding_a_lone_surrogate_is_rejected_or_writes_back(field: str) -> None:
    """Found by the fuzz run: from_json accepts "\\ud800" (JSON escapes decode to text
    that is not Unicode); to_json, and `warmenv inspect` printing the name, then raise
    UnicodeEncodeError."""
    exercise_manifest(json.dumps(dict(_GOOD_MANIFEST, **{field: "\ud800"})))


@pytest.mark.anyio
async def test_a_sqlite_table_page_claiming_one_cell_more_raises_only_bundle_errors(
    tmp_path: Path,
) -> None:
    """Found by the fuzz run: a table leaf page whose cell count is one too high passes
    the open (its checks read through the index) but the digest's rowid-order scan reads
    a row whose namespace is NULL and compares it with a str (bundle/sqlite.py `_digest`)."""
    seed = seed_bundles().sqlite[1]
    page_size = struct.unpack_from(">H", seed, 16)[0]
    leaves = [p for p in range(1, len(seed) // page_size) if seed[p * page_size] == 0x0D]
    for page in leaves:
        damaged = bytearray(seed)
        at = page * page_size + 3
        struct.pack_into(">H", damaged, at, struct.unpack_from(">H", seed, at)[0] + 1)
        step = f"page {page + 1} cells +1"
        case = Case(kind="sqlite", steps=(step,), data=bytes(damaged), reseal=False)
        await exercise_bundle(case, tmp_path)


@pytest.mark.anyio
@pytest.mark.parametrize("encoding", ["UTF-16le", "UTF-16be"])
async def test_a_sqlite_bundle_in_utf16_imports_or_raises_only_bundle_errors(
    tmp_path: Path, encoding: str
) -> None:
    """Found by the fuzz run: a SQLite bundle whose text encoding is UTF-16 opens and
    verifies (`warmenv verify` says ok), then the import's ATTACH raises
    sqlite3.OperationalError (bundle/importing.py `_attach`) into a UTF-8 environment."""
    entries = {"app/1/kernels": {b"k%d" % i: b"v%d" % i for i in range(5)}}
    await exercise_bundle(_sealed("sqlite", entries, encoding), tmp_path)
