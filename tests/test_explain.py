"""`env.explain`: why a lookup misses, and the log of a store's first miss.

Each test builds an environment whose namespaces differ from the asked one
in known segments, and checks the explanation lists exactly those, nearest
first, with their entry counts and whether the key is there.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import pytest

import warmenv.persistence.explain as explain_module
from redis_server import RedisServer
from test_store_read_through import GatedStorage
from warmenv import Environment, MemoryStorage, Namespace, open_environment
from warmenv.persistence import Store
from warmenv.persistence.explain import Explanation, Nearby
from warmenv.persistence.memory import memory_database
from warmenv.remote import RemoteStorage

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _fresh_first_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no namespace explained yet in this process."""
    monkeypatch.setattr(explain_module, "_explained", set())


async def fill(env: Environment, layout: dict[str, list[str]]) -> None:
    for namespace, keys in layout.items():
        store: Store[str, int] = await env.store(namespace)
        for key in keys:
            await store.insert(key, 1)


LAYOUT = {
    "app/1/kernels": ["k1", "k2", "k3"],  # an older version
    "app/2/tuned": ["k1"],  # another path
    "tool/2/kernels": ["k9"],  # another name
    "other/1/unrelated": ["k1"],  # shares only a version: not near
    "app/1/tuned": ["k1"],  # version and path differ
}


async def test_explain_lists_the_namespaces_that_differ_in_some_segments_nearest_first(
    env: Environment,
) -> None:
    await fill(env, LAYOUT)
    explanation = await env.explain("app/2/kernels", "k1")
    assert explanation == Explanation(
        namespace="app/2/kernels",
        key=b'"k1"',
        entries=0,
        has_key=False,
        nearby=(
            Nearby("app/1/kernels", ("version",), 3, True),
            Nearby("app/2/tuned", ("path",), 1, True),
            Nearby("tool/2/kernels", ("name",), 1, False),
            Nearby("app/1/tuned", ("version", "path"), 1, True),
        ),
    )


async def test_an_explanation_reads_as_one_sentence_per_nearby_namespace(
    env: Environment,
) -> None:
    await fill(env, LAYOUT)
    text = str(await env.explain("app/2/kernels", "k1"))
    lines = text.splitlines()
    assert lines[0] == (
        "namespace 'app/2/kernels' holds no entries, so key \"k1\" misses; nearest namespaces here:"
    )
    assert lines[1] == "  - 'app/1/kernels': version '1' instead of '2'; 3 entries; holds the key"
    assert lines[3] == "  - 'tool/2/kernels': name 'tool' instead of 'app'; 1 entry; not the key"
    assert len(lines) == 5


async def test_explain_suggests_first_the_namespace_of_the_version_and_path_swapped(
    env: Environment,
) -> None:
    await fill(env, {"myapp/2.0/tuning": ["k"], "myapp/1.0/tuning": ["k"]})
    lines = str(await env.explain("myapp/tuning/1.0")).splitlines()
    assert lines[1] == (
        "  - 'myapp/1.0/tuning': version and path swapped: did you mean 'myapp/1.0/tuning'?; "
        "1 entry"
    )
    assert lines[2].startswith("  - 'myapp/2.0/tuning': version '2.0' instead of 'tuning'")


async def test_explain_without_a_key_says_nothing_about_keys(env: Environment) -> None:
    await fill(env, LAYOUT)
    explanation = await env.explain("app/2/kernels")
    assert explanation.key is None and explanation.has_key is None
    assert {n.has_key for n in explanation.nearby} == {None}
    assert "key" not in str(explanation)


async def test_explain_says_when_the_namespace_holds_the_key(env: Environment) -> None:
    await fill(env, LAYOUT)
    explanation = await env.explain("app/1/kernels", "k2")
    assert explanation.entries == 3 and explanation.has_key is True
    assert "a lookup of it hits" in str(explanation)
    missing = await env.explain("app/1/kernels", "nope")
    assert missing.has_key is False
    assert 'holds 3 entries, but not key "nope"' in str(missing)


async def test_explain_takes_a_key_as_stored_when_given_bytes(env: Environment) -> None:
    await env.storage("app/1/raw").insert(b"\x00raw", b"v")
    explanation = await env.explain("app/2/raw", b"\x00raw")
    assert explanation.nearby == (Nearby("app/1/raw", ("version",), 1, True),)


async def test_explain_with_nothing_nearby_says_so(env: Environment) -> None:
    await fill(env, {"other/1/unrelated": ["k1"]})
    explanation = await env.explain("app/2/kernels", "k1")
    assert explanation.nearby == ()
    assert str(explanation) == (
        "namespace 'app/2/kernels' holds no entries, so key \"k1\" misses; no other namespace "
        "here differs from it only in its version or path (nothing like it was computed or "
        "imported in this environment)"
    )


async def test_explain_of_a_hit_with_nothing_nearby_does_not_say_nothing_was_computed(
    env: Environment,
) -> None:
    # It said "a lookup of it hits; ... (nothing like it was computed ...)".
    await fill(env, {"app/1/kernels": ["k1"]})
    explanation = await env.explain("app/1/kernels", "k1")
    assert str(explanation) == (
        "namespace 'app/1/kernels' holds key \"k1\": a lookup of it hits; no other namespace "
        "here differs from it only in its version or path"
    )


async def test_an_explanation_is_a_frozen_value(env: Environment) -> None:
    explanation = await env.explain("app/2/kernels")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        explanation.entries = 3  # type: ignore[misc]


async def test_a_long_explanation_counts_what_it_does_not_spell_out(env: Environment) -> None:
    await fill(env, {f"app/{v}/kernels": ["k"] for v in range(1, 15)})
    text = str(await env.explain("app/99/kernels"))
    assert text.splitlines()[-1] == "  and 4 more namespaces"


async def test_explain_works_on_an_environment_in_memory(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.warns(Warning, match="in memory"):
        async with open_environment("e", root=a_file) as env:
            assert env.in_memory
            await fill(env, LAYOUT)
            explanation = await env.explain("app/2/kernels", "k2")
    assert explanation.nearby[0] == Nearby("app/1/kernels", ("version",), 3, True)
    assert explanation.nearby[1] == Nearby("app/2/tuned", ("path",), 1, False)


# --- WARMENV_EXPLAIN_MISSES ----------------------------------------------------------


async def test_the_first_miss_of_a_namespace_is_explained_in_the_log(
    env: Environment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(env, LAYOUT)
    monkeypatch.setenv("WARMENV_EXPLAIN_MISSES", "1")
    store: Store[str, int] = await env.store("app/2/kernels")
    with caplog.at_level(logging.INFO, logger="warmenv.explain"):
        assert await store.get("k1") is None
        assert await store.get("k2") is None  # the second miss: no second explanation
    records = [r for r in caplog.records if r.name == "warmenv.explain"]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    message = records[0].getMessage()
    assert "'app/1/kernels': version '1' instead of '2'; 3 entries; holds the key" in message
    assert 'key "k1" misses' in message


async def test_misses_are_not_explained_unless_asked(
    env: Environment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(env, LAYOUT)
    monkeypatch.delenv("WARMENV_EXPLAIN_MISSES", raising=False)
    store: Store[str, int] = await env.store("app/2/kernels")
    with caplog.at_level(logging.INFO, logger="warmenv.explain"):
        assert await store.get("k1") is None
    assert [r for r in caplog.records if r.name == "warmenv.explain"] == []


async def test_each_namespace_gets_its_own_first_miss_explained(
    env: Environment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(env, LAYOUT)
    monkeypatch.setenv("WARMENV_EXPLAIN_MISSES", "1")
    with caplog.at_level(logging.INFO, logger="warmenv.explain"):
        for namespace in ("app/2/kernels", "app/3/kernels", "app/2/kernels"):
            store: Store[str, int] = await env.store(namespace)
            await store.get("k1")
    messages = [r.getMessage() for r in caplog.records if r.name == "warmenv.explain"]
    assert len(messages) == 2
    assert "'app/2/kernels'" in messages[0] and "'app/3/kernels'" in messages[1]


async def test_a_memory_store_miss_is_explained_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    table = memory_database()
    await MemoryStorage("app/1/kernels", table=table).insert(b'"k1"', b"1")
    monkeypatch.setenv("WARMENV_EXPLAIN_MISSES", "1")
    store: Store[str, int] = await Store.open(MemoryStorage("app/2/kernels", table=table))
    with caplog.at_level(logging.INFO, logger="warmenv.explain"):
        assert await store.get("k1") is None
    [record] = [r for r in caplog.records if r.name == "warmenv.explain"]
    assert "'app/1/kernels': version '1' instead of '2'; 1 entry; holds the key" in (
        record.getMessage()
    )


# --- Storage.explain: every storage explains itself --------------------------------------


async def test_a_first_miss_through_a_shared_tier_is_explained_from_the_local_storage(
    tmp_path: Path,
    server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_environment("e", root=tmp_path, remote=server.url) as env:
        await fill(env, LAYOUT)
        monkeypatch.setenv("WARMENV_EXPLAIN_MISSES", "1")
        store: Store[str, int] = await env.store("app/2/kernels")
        assert isinstance(env.storage("app/2/kernels"), RemoteStorage)
        with caplog.at_level(logging.INFO, logger="warmenv.explain"):
            assert await store.get("k1") is None
    [record] = [r for r in caplog.records if r.name == "warmenv.explain"]
    message = record.getMessage()
    assert "shared through Redis" in message
    assert "'app/1/kernels': version '1' instead of '2'; 3 entries; holds the key" in message


async def test_a_storage_with_a_shared_tier_explains_as_its_local_storage(
    tmp_path: Path, server: RedisServer
) -> None:
    async with open_environment("e", root=tmp_path, remote=server.url) as env:
        await fill(env, LAYOUT)
        shared = env.storage("app/2/kernels")
        assert isinstance(shared, RemoteStorage)
        explanation = await shared.explain(b'"k2"')
        assert explanation == await shared.local.explain(b'"k2"')
        assert explanation == await env.explain("app/2/kernels", "k2")
    assert explanation is not None
    assert explanation.nearby[0] == Nearby("app/1/kernels", ("version",), 3, True)


async def test_sqlite_and_memory_storages_explain_their_own_namespace(
    env: Environment, tmp_path: Path
) -> None:
    table = memory_database()
    for storages in (
        {ns: env.storage(ns) for ns in LAYOUT},
        {ns: MemoryStorage(ns, table=table) for ns in LAYOUT},
    ):
        for namespace, keys in LAYOUT.items():
            for key in keys:
                await storages[namespace].insert(f'"{key}"'.encode(), b"1")
        explanation = await storages["app/1/kernels"].explain(b'"k2"')
        assert explanation is not None
        assert (explanation.namespace, explanation.entries, explanation.has_key) == (
            "app/1/kernels",
            3,
            True,
        )
        assert [n.namespace for n in explanation.nearby] == ["app/1/tuned", "app/2/tuned"]
        assert str(await storages["app/1/kernels"].explain()) == (
            "namespace 'app/1/kernels' holds 3 entries; nearest namespaces here:\n"
            "  - 'app/1/tuned': path 'tuned' instead of 'kernels'; 1 entry\n"
            "  - 'app/2/tuned': version '2' instead of '1', path 'tuned' instead of "
            "'kernels'; 1 entry"
        )


async def test_a_storage_of_the_applications_own_is_not_explained(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    table = memory_database()
    await MemoryStorage("app/1/kernels", table=table).insert(b'"k1"', b"1")
    own = GatedStorage(MemoryStorage("app/2/kernels", table=table))
    assert await own.explain(b'"k1"') is None  # the protocol's default: nothing to compare
    monkeypatch.setenv("WARMENV_EXPLAIN_MISSES", "1")
    store: Store[str, int] = await Store.open(own)
    with caplog.at_level(logging.DEBUG, logger="warmenv.explain"):
        assert await store.get("k1") is None  # a miss, and no error
    assert [r for r in caplog.records if r.name == "warmenv.explain"] == []


# --- preflight: which of the application's namespaces would hit ------------------------


@pytest.fixture
async def layout_bundle(env: Environment, tmp_path: Path, bundle_format: str) -> Path:
    """A bundle (each format) of `LAYOUT`."""
    from warmenv.bundle import export_bundle

    await fill(env, LAYOUT)
    out = tmp_path / f"layout.{bundle_format}.bundle"
    await export_bundle(env, out, name="layout", version="1", format=bundle_format)
    return out


async def test_preflight_says_which_named_namespaces_the_bundle_holds(layout_bundle: Path) -> None:
    from warmenv.bundle import preflight

    report = await preflight(layout_bundle, namespaces=["app/1/kernels", "app/2/kernels"])
    assert report.ok
    assert report.would_hit == ("app/1/kernels",)
    (missing,) = report.would_miss
    assert missing == Explanation(
        namespace="app/2/kernels",
        key=None,
        entries=0,
        has_key=None,
        nearby=(
            Nearby("app/1/kernels", ("version",), 3, None),
            Nearby("app/2/tuned", ("path",), 1, None),
            Nearby("tool/2/kernels", ("name",), 1, None),
            Nearby("app/1/tuned", ("version", "path"), 1, None),
        ),
    )  # as env.explain would say it of an environment holding the bundle
    assert (
        "1 of 2 namespaces named is not in the bundle and will miss: 'app/2/kernels' "
        "(nearest there: 'app/1/kernels', version '1' instead of '2')"
    ) in report.reasons


async def test_preflight_will_not_hit_when_the_bundle_holds_none_of_the_named_namespaces(
    layout_bundle: Path,
) -> None:
    from warmenv.bundle import preflight

    report = await preflight(layout_bundle, namespaces=[Namespace("app", "kernels", version="3")])
    assert not report.ok
    assert report.would_hit == ()
    assert report.reasons[-1] == (
        "the namespace named is not in the bundle and will miss: 'app/3/kernels' "
        "(nearest there: 'app/1/kernels', version '1' instead of '3')"
    )
    assert "will not hit" in str(report)


async def test_preflight_says_when_every_named_namespace_would_hit(layout_bundle: Path) -> None:
    from warmenv.bundle import preflight

    report = await preflight(layout_bundle, namespaces=["app/1/kernels", "app/2/tuned"])
    assert report.ok and report.would_miss == ()
    assert report.reasons[-1] == "both namespaces named are in the bundle"


async def test_preflight_of_a_named_namespace_with_nothing_near_says_so(
    layout_bundle: Path,
) -> None:
    from warmenv.bundle import preflight

    report = await preflight(layout_bundle, namespaces=["zzz/1/none"])
    assert report.reasons[-1] == (
        "the namespace named is not in the bundle and will miss: 'zzz/1/none' "
        "(nothing like it there)"
    )


async def test_preflight_without_named_namespaces_lists_none(layout_bundle: Path) -> None:
    from warmenv.bundle import preflight

    report = await preflight(layout_bundle)
    assert (report.would_hit, report.would_miss) == ((), ())
    assert not any("named" in reason for reason in report.reasons)
