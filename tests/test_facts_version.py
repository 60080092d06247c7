"""A tool's version fact is the one `importlib.metadata.version` reads, found without its scan.

`importlib.metadata` normalises the name of every metadata directory of every
directory on `sys.path` before it answers (about 2 ms in a fresh process with
torch installed, the largest part of a first restore's facts); warmenv walks
the same path in the same order and normalises only the names that can match
(`_facts._metadata_directory`), and hands anything it does not replay (a zip
on the path, an egg, another finder of distributions) to `importlib.metadata`.
Either way the answer is `importlib.metadata`'s: on every distribution
installed here, and on real metadata directories and zip files made here.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from warmenv._facts import _clean, _metadata_directory, fact_here


def _dist(where: Path, directory: str, text: str, filename: str = "METADATA") -> Path:
    path = where / directory
    path.mkdir(parents=True, exist_ok=True)
    (path / filename).write_text(text, encoding="utf-8", newline="")
    return path


def _metadata(name: str, version: str, newline: str = "\n") -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", "", "Long text."]
    return newline.join(lines) + newline


def _their_version(name: str) -> str:
    """`importlib.metadata.version(name)` as a fact holds it (made segment-safe)."""
    return _clean(importlib.metadata.version(name))


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """Two directories put first on `sys.path` (the earlier wins, as for imports)."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setattr(sys, "path", [str(first), str(second), *sys.path])
    yield [first, second]
    importlib.invalidate_caches()


def test_every_installed_distribution_reads_the_version_importlib_metadata_reads() -> None:
    names = {dist.metadata["Name"] for dist in importlib.metadata.distributions()}
    assert {"anyio", "attrs", "pytest", "warmenv"} <= names
    found = {name: fact_here(name) for name in sorted(names)}
    assert found == {name: _their_version(name) for name in sorted(names)}
    # Found by the walk, not handed back: an editable install's metadata is on the path too.
    assert all(_metadata_directory(name) is not None for name in names)


def test_the_first_directory_on_the_path_wins_as_for_importlib_metadata(
    on_path: list[Path],
) -> None:
    first, second = on_path
    _dist(second, "shadowed-1.0.dist-info", _metadata("shadowed", "1.0"))
    _dist(first, "shadowed-2.0.dist-info", _metadata("shadowed", "2.0"))
    assert fact_here("shadowed") == _their_version("shadowed") == "2.0"


def test_names_are_normalised_as_importlib_metadata_normalises_them(
    on_path: list[Path],
) -> None:
    first, _ = on_path
    _dist(first, "Foo.Bar__baz-3.0.dist-info", _metadata("Foo.Bar__baz", "3.0"))
    for asked in ("foo-bar-baz", "FOO_BAR.BAZ", "foo.bar_baz"):
        assert fact_here(asked) == _their_version(asked) == "3.0"


def test_only_the_headers_are_read_and_any_line_ending_is_a_line_ending(
    on_path: list[Path],
) -> None:
    first, _ = on_path
    # "Version:" in the description is not the header; the header comes after a long one.
    text = _metadata("crlf", "4.0", newline="\r\n").replace(
        "Long text.", "Version: 9.9\r\n" + "x" * 10_000
    )
    text = text.replace("Name: crlf", "Name: crlf\r\nSummary: " + "s" * 5_000)
    _dist(first, "crlf-4.0.dist-info", text)
    assert fact_here("crlf") == _their_version("crlf") == "4.0"


def test_metadata_without_a_version_header_is_read_by_importlib_metadata(
    on_path: list[Path],
) -> None:
    first, _ = on_path
    # An egg-info with PKG-INFO and no METADATA: the headers' shortcut finds nothing.
    _dist(first, "legacy-0.5.egg-info", _metadata("legacy", "0.5"), filename="PKG-INFO")
    assert _metadata_directory("legacy") is not None
    assert fact_here("legacy") == _their_version("legacy") == "0.5"


def test_a_zip_on_the_path_is_left_to_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("zipdist-1.2.dist-info/METADATA", _metadata("zipdist", "1.2"))
    monkeypatch.setattr(sys, "path", [str(archive), *sys.path])
    assert _metadata_directory("zipdist") is None  # the walk cannot read inside a zip
    assert fact_here("zipdist") == _their_version("zipdist") == "1.2"


def test_another_finder_of_distributions_is_left_to_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = _dist(tmp_path, "elsewhere-7.0.dist-info", _metadata("elsewhere", "7.0"))

    class Finder:
        @staticmethod
        def find_spec(*args: object) -> None:
            return None

        @staticmethod
        def find_distributions(
            context: importlib.metadata.DistributionFinder.Context,
        ) -> list[importlib.metadata.Distribution]:
            wanted = context.name in ("elsewhere", None)
            return [importlib.metadata.Distribution.at(found)] if wanted else []

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    assert _metadata_directory("elsewhere") is None
    assert _metadata_directory("attrs") is None  # any name: the finder may know it
    assert fact_here("elsewhere") == _their_version("elsewhere") == "7.0"
    assert fact_here("attrs") == _their_version("attrs")


def test_a_distribution_found_nowhere_is_not_installed(on_path: list[Path]) -> None:
    assert _metadata_directory("no-such-distribution-here") is None
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("no-such-distribution-here")
    assert fact_here("no-such-distribution-here") == "none"


# A metadata file is read bounded: never waited on, never more than a regular file's bytes.


def _child_fact(root: Path, name: str) -> subprocess.CompletedProcess[str]:
    """`fact_here(name)` in a fresh process with `root` first on its path, given 30 s: a
    read that waits on a FIFO or reads /dev/zero fails the test instead of hanging it."""
    code = (
        "import sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from warmenv._facts import fact_here\n"
        "print(fact_here(sys.argv[2]))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if os.path.isdir(p)))
    return subprocess.run(
        [sys.executable, "-c", code, str(root), name],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_fifo_metadata_is_not_waited_on(tmp_path: Path) -> None:
    found = tmp_path / "fifodist-1.0.dist-info"
    found.mkdir()
    os.mkfifo(found / "METADATA")
    done = _child_fact(tmp_path, "fifodist")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"
    assert "METADATA is a FIFO, not a regular file" in done.stderr


def test_a_metadata_linked_to_a_device_is_not_read(tmp_path: Path) -> None:
    found = tmp_path / "zerodist-1.0.dist-info"
    found.mkdir()
    (found / "METADATA").symlink_to("/dev/zero")
    done = _child_fact(tmp_path, "zerodist")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"
    assert "METADATA is a character device" in done.stderr


def test_a_metadata_linked_to_a_regular_file_is_read(on_path: list[Path]) -> None:
    first, _ = on_path
    store = _dist(first / "store", "linked-5.0.dist-info", _metadata("linked", "5.0"))
    (first / "linked-5.0.dist-info").mkdir()
    (first / "linked-5.0.dist-info" / "METADATA").symlink_to(store / "METADATA")
    assert fact_here("linked") == _their_version("linked") == "5.0"


def test_a_long_header_is_read_only_as_far_as_its_version(tmp_path: Path) -> None:
    # 16 MB with no blank line: read whole, growing one string searched after each 4 KiB,
    # it took a minute; the version is known from the first kilobyte.
    found = tmp_path / "longdist-1.0.dist-info"
    found.mkdir()
    with open(found / "METADATA", "w", encoding="utf-8") as file:
        file.write("Metadata-Version: 2.1\nName: longdist\nVersion: 1.0\nSummary: ")
        for _ in range(16):
            file.write("s" * 1_000_000)
    done = _child_fact(tmp_path, "longdist")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0"


def test_headers_too_long_before_the_version_make_it_none_with_why(
    on_path: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    first, _ = on_path
    text = _metadata("late", "2.0").replace("Name: late", "Name: late\nSummary: " + "s" * 70_000)
    _dist(first, "late-2.0.dist-info", text)
    assert fact_here("late") == "none"
    assert "headers run past the 65,536 characters read of them" in caplog.text


# Headers as the e-mail parser reads them (importlib.metadata's).


def test_a_header_name_is_matched_in_any_case(on_path: list[Path]) -> None:
    first, _ = on_path
    text = "Metadata-Version: 2.1\nName: anycase\nversion: 9.9\nVersion: 1.0\n\nBody.\n"
    _dist(first, "anycase-1.0.dist-info", text)
    assert fact_here("anycase") == _their_version("anycase") == "9.9"


def test_the_headers_end_at_the_first_line_that_is_not_one(on_path: list[Path]) -> None:
    first, _ = on_path
    text = "Metadata-Version: 2.1\nName: ended\nnot a header\nVersion: 3.0\n\nBody.\n"
    _dist(first, "ended-3.0.dist-info", text)
    assert importlib.metadata.version("ended") is None  # the Version line is in the body
    assert fact_here("ended") == "none"


def test_a_version_is_taken_with_its_spaces_and_continuations_as_email_takes_it(
    on_path: list[Path],
) -> None:
    first, _ = on_path
    text = "Name: spaced\nFrom here\n version: 0.1\nVersion:\t 4.0 \n .post1\nSummary: s\n\n"
    _dist(first, "spaced-4.0.dist-info", text)
    assert fact_here("spaced") == _their_version("spaced")
