"""A bundle's manifest lists its namespaces and comes first: a stale SQLite bundle by URL
is refused after its first pages, never its body.

Export writes (format 2) the namespaces into the manifest, and a SQLite bundle's
`meta` rows ahead of its entries, so `import_bundle(url, env, version=...)` reads
the manifest by `Range` requests to a real HTTP server started here (which counts
the bytes it sends). The list only ever refuses: a bundle it admits is downloaded
and opened as any other, and a list that does not match the entries makes the
bundle corrupt. A bundle without a list (format 1, or exported before it) is
downloaded first, as before.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from signed import rewrite_manifest
from test_download import BundleServer, staging_left
from test_download import server as server  # the fixture
from test_import_version import (
    NEW,
    OLD,
    OLD_CONFIGS,
    OTHER_APP,
    held,
    make_bundle,
    refused_as_stale,
    warmenv,
)
from warmenv import open_environment
from warmenv.bundle import (
    CorruptBundleError,
    SignatureError,
    StaleBundleError,
    Trust,
    export_bundle,
    generate_key,
    import_bundle,
    open_bundle,
    preflight,
    warm_up,
)
from warmenv.bundle.manifest import DIGEST_PLACEHOLDER, LISTED_BYTES, BundleManifest, listing

# (entries per namespace, bytes the refusal may cost): under 4 MiB export writes 4 KiB
# pages, and the schema and manifest lie in the first 64 KiB range; above, 32 KiB
# pages, and its five first pages (160 KiB) take a second range, to 256 KiB.
SIZES = {"4 KiB pages": (20, 64 << 10), "32 KiB pages": (60, 256 << 10)}


@pytest.fixture(params=list(SIZES))
def size(request: pytest.FixtureRequest) -> tuple[int, int]:
    return SIZES[str(request.param)]


@pytest.mark.anyio
@pytest.mark.parametrize("via", ["import_bundle", "warm_up"])
async def test_a_stale_sqlite_bundle_by_url_is_refused_after_its_first_pages_only(
    server: BundleServer, tmp_path: Path, root: Path, via: str, size: tuple[int, int]
) -> None:
    entries, budget = size
    bundle = await make_bundle(tmp_path / "old.bundle", [OLD, OLD_CONFIGS], "sqlite", entries)
    body = bundle.read_bytes()
    url = server.put("/old.bundle", body)
    async with open_environment("svc", root=root) as env:
        await refused_as_stale(via, url, env)
    sent = sum(s.sent for s in server.seen)
    assert all(s.range is not None for s in server.seen), server.seen  # never the whole body
    assert 0 < sent <= budget < len(body) // 8
    assert staging_left(root) == []


@pytest.mark.anyio
async def test_a_mixed_sqlite_bundle_by_url_imports_only_its_version_and_says_what_it_left(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    bundle = await make_bundle(tmp_path / "mixed.bundle", [OLD, NEW, OTHER_APP], "sqlite", 5)
    url = server.put("/mixed.bundle", bundle.read_bytes())
    async with open_environment("svc", root=root) as env:
        report = await import_bundle(url, env, version="1.1")
        assert await held(env) == {str(NEW): 5, str(OTHER_APP): 5}
    assert report.imported == 10 and report.other_versions == (str(OLD),)


async def export_format_1(out: Path) -> Path:
    async with open_environment("src", root=out.parent / "src-format-1") as env:
        await env.storage(OLD).insert_many((b"k%03d" % i, b"v" * 1000) for i in range(50))
        report = await export_bundle(env, out, name="CI", version="1.0", format_version=1)
    assert report.manifest.namespaces is None  # 0.1's manifest, exactly
    return out


@pytest.mark.anyio
async def test_a_sqlite_bundle_without_a_list_is_downloaded_then_refused_as_before(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    body = (await export_format_1(tmp_path / "old.bundle")).read_bytes()
    url = server.put("/old.bundle", body)
    async with open_environment("svc", root=root) as env:
        with pytest.raises(StaleBundleError, match=r"version '1\.1'"):
            await import_bundle(url, env, version="1.1")
        assert await held(env) == {}
        report = await import_bundle(url, env, version="1.0")  # and still imports
        assert report.imported == 50
    assert any(s.range is None and s.sent == len(body) for s in server.seen)
    assert staging_left(root) == []


def lying(body: bytes) -> bytes:
    """`body` with its manifest's list saying 1.1 where its entries are of 1.0 (the same
    length, so the file's structure holds in both formats; no digest covers a manifest)."""
    told = b'"namespaces": ["app/1.0/configs", "app/1.0/kernels"]'
    assert body.count(told) == 1
    return body.replace(told, told.replace(b"1.0", b"1.1"))


@pytest.mark.anyio
@pytest.mark.parametrize("format", ["sqlite", "flat"])
async def test_a_list_that_admits_a_stale_bundle_is_caught_when_its_body_is_read(
    server: BundleServer, tmp_path: Path, root: Path, format: str
) -> None:
    bundle = await make_bundle(tmp_path / "old.bundle", [OLD, OLD_CONFIGS], format, 3)
    url = server.put("/lying.bundle", lying(bundle.read_bytes()))
    async with open_environment("svc", root=root) as env:
        with pytest.raises(
            CorruptBundleError, match=r"list of namespaces lacks 'app/1\.0/configs'"
        ):
            await import_bundle(url, env, version="1.1")
        assert await held(env) == {}
    assert staging_left(root) == []


@pytest.mark.anyio
@pytest.mark.parametrize("format", ["sqlite", "flat"])
async def test_a_bundle_whose_list_lies_does_not_open(tmp_path: Path, format: str) -> None:
    bundle = await make_bundle(tmp_path / "old.bundle", [OLD, OLD_CONFIGS], format, 3)
    bundle.write_bytes(lying(bundle.read_bytes()))
    with pytest.raises(CorruptBundleError, match="its manifest's list of namespaces"):
        async with open_bundle(bundle):
            pass


@pytest.mark.anyio
@pytest.mark.parametrize("format", ["sqlite", "flat"])
async def test_the_manifest_lists_the_namespaces_exported(tmp_path: Path, format: str) -> None:
    bundle = await make_bundle(tmp_path / "mixed.bundle", [NEW, OLD, OTHER_APP], format, 2)
    async with open_bundle(bundle) as opened:
        assert opened.manifest.namespaces == (str(OLD), str(NEW), str(OTHER_APP))


def manifest() -> BundleManifest:
    return BundleManifest(
        name="n", version="1", created="c", environments=(), digest=DIGEST_PLACEHOLDER
    )


def test_a_list_too_long_for_the_manifest_is_left_out() -> None:
    many = [f"app/1/{i:07d}" + "x" * 40 for i in range(LISTED_BYTES // 50)]
    assert listing(manifest(), many).namespaces is None
    assert listing(manifest(), many[:100]).namespaces == tuple(many[:100])
    assert listing(manifest(), ["app/1/" + "x" * 5000]).namespaces is None  # over 4096


def test_the_list_is_sorted_as_the_digest_sorts_namespaces() -> None:
    assert listing(manifest(), ["b/1/x", "a/1/\u00e9", "a/1/z"]).namespaces == (
        "a/1/z",
        "a/1/\u00e9",
        "b/1/x",
    )


def test_a_listed_manifest_reads_back_as_written() -> None:
    listed = listing(manifest(), ["a/1/x", "b/1/y"])
    again = BundleManifest.from_json(listed.to_json())
    assert again == listed and again.uncovered() is None  # a signature covers the list


@pytest.mark.anyio
async def test_preflight_of_a_sqlite_bundle_by_url_reads_its_first_pages_only(
    server: BundleServer, tmp_path: Path
) -> None:
    bundle = await make_bundle(tmp_path / "old.bundle", [OLD, OLD_CONFIGS], "sqlite", 20)
    body = bundle.read_bytes()
    report = await preflight(server.put("/old.bundle", body), version="1.1")
    assert not report.ok and set(report.other_versions) == {str(OLD_CONFIGS), str(OLD)}
    assert all(s.range is not None for s in server.seen), server.seen
    assert sum(s.sent for s in server.seen) <= 64 << 10 < len(body) // 8


@pytest.mark.anyio
async def test_a_sqlite_bundle_signed_by_an_untrusted_key_is_refused_by_its_first_pages(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    key, other = generate_key(tmp_path / "ci"), generate_key(tmp_path / "other")
    async with open_environment("src", root=tmp_path / "src") as source:
        await source.storage(NEW).insert_many((b"k%03d" % i, b"v" * 40_000) for i in range(50))
        out = tmp_path / "signed.bundle"
        await export_bundle(source, out, name="CI", version="1.1", sign=tmp_path / "ci")
    body = out.read_bytes()
    url = server.put("/signed.bundle", body)
    async with open_environment("svc", root=root) as env:
        with pytest.raises(SignatureError, match=r"trust"):
            await import_bundle(url, env, version="1.1", trust=[other])
        assert await held(env) == {}
        assert all(s.range is not None for s in server.seen), server.seen
        assert sum(s.sent for s in server.seen) <= 64 << 10 < len(body) // 8
        assert (await import_bundle(url, env, version="1.1", trust=[key])).imported == 50


def test_the_command_line_refuses_a_stale_sqlite_url_by_its_first_pages(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    bundle = anyio.run(make_bundle, tmp_path / "mixed.bundle", [OLD, NEW], "sqlite", 20)
    body = bundle.read_bytes()
    url = server.put("/mixed.bundle", body)
    done = warmenv("import", url, "--app-version", "2.0", "--env", "svc", "--root", str(root))
    assert done.returncode == 1, done.stderr
    assert "no namespace is for version '2.0'" in done.stderr
    assert all(s.range is not None for s in server.seen), server.seen
    assert sum(s.sent for s in server.seen) <= 64 << 10 < len(body) // 8
    assert not (root / "svc.db").exists()


def _listing_no_namespace(bundle: Path) -> bytes:
    """`bundle` (SQLite) with its manifest's list holding '' (no namespace can be ''),
    as an attacker with the file writes it; its entries untouched."""
    rewrite_manifest(
        bundle, lambda document: document.update(namespaces=["", *document["namespaces"]])
    )
    return bundle.read_bytes()


@pytest.mark.anyio
@pytest.mark.parametrize("via", ["import_bundle", "preflight", "warm_up"])
async def test_a_list_naming_no_namespace_is_a_corrupt_bundle_before_the_list_is_used(
    server: BundleServer,
    tmp_path: Path,
    root: Path,
    via: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bundle = await make_bundle(tmp_path / "old.bundle", [OLD, OLD_CONFIGS], "sqlite", 3)
    url = server.put("/empty-name.bundle", _listing_no_namespace(bundle))
    said = rf"{re.escape(url)}: namespace '' is not valid"
    async with open_environment("svc", root=root) as env:
        if via == "preflight":
            with pytest.raises(CorruptBundleError, match=said):
                await preflight(url, version="1.1")
        elif via == "warm_up":
            handle = warm_up(url, env, version="1.1")
            await handle.wait()
            assert isinstance(handle.error, CorruptBundleError), handle.error
            assert re.match(said, str(handle.error))
            assert [r.exc_info for r in caplog.records if r.exc_info] == []  # no traceback
        else:
            with pytest.raises(CorruptBundleError, match=said):
                await import_bundle(url, env, version="1.1")
        assert await held(env) == {}
    assert staging_left(root) == []


def test_the_command_line_says_a_list_naming_no_namespace_is_corrupt(
    server: BundleServer, tmp_path: Path, root: Path
) -> None:
    bundle = anyio.run(make_bundle, tmp_path / "old.bundle", [OLD, OLD_CONFIGS], "sqlite", 3)
    url = server.put("/empty-name.bundle", _listing_no_namespace(bundle))
    done = warmenv("import", url, "--app-version", "1.1", "--env", "svc", "--root", str(root))
    assert done.returncode == 1, done.stderr  # a bad bundle, not a usage error (2)
    assert f"{url}: namespace '' is not valid" in done.stderr
    assert "Traceback" not in done.stderr


def _unlisted(bundle: Path) -> bytes:
    """`bundle` (SQLite) with no namespace list in its manifest, as an export before the
    list wrote it: its head no longer tells its namespaces."""
    rewrite_manifest(bundle, lambda document: document.pop("namespaces"))
    return bundle.read_bytes()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("format", "listed", "named"),
    [
        ("sqlite", True, True),  # namespaces to count: downloaded whole unless refused
        ("sqlite", False, False),  # a head that does not tell its namespaces
        ("flat", True, True),  # a flat head tells names but no counts
    ],
)
async def test_preflight_by_url_refuses_a_bundle_for_its_signature_by_its_head_alone(
    server: BundleServer, tmp_path: Path, format: str, listed: bool, named: bool
) -> None:
    key = generate_key(tmp_path / "ci")
    bundle = await make_bundle(tmp_path / "unsigned.bundle", [OLD, NEW], format, 20)
    body = bundle.read_bytes() if listed else _unlisted(bundle)
    url = server.put("/unsigned.bundle", body)
    report = await preflight(url, trust=[key], namespaces=[NEW] if named else None)
    assert not report.ok and report.signature_refused is not None
    assert "holds no entries" not in str(report), str(report)
    assert all(s.range is not None for s in server.seen), server.seen
    assert sum(s.sent for s in server.seen) <= 64 << 10 < len(body) // 8
    # Trusting nothing in particular, the same preflight reads on as before.
    server.seen.clear()
    assert (await preflight(url, trust=Trust(), namespaces=[NEW] if named else None)).ok
