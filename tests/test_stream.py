from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from warmenv import ConfigError, load_config, open_environment, stream
from warmenv.stream import StreamId, StreamPolicy


@pytest.fixture(autouse=True)
def _restore_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test leaves the process-wide policy (and whether code chose it) as it found it."""
    monkeypatch.setattr(stream, "_policy", stream.policy())
    monkeypatch.setattr(stream, "_chosen", stream.policy_chosen())


def test_the_default_policy_is_per_thread() -> None:
    assert stream.policy() is StreamPolicy.PER_THREAD


def test_stream_ids_are_hashable_ordered_ints() -> None:
    assert StreamId(1) < StreamId(2)
    assert {StreamId(3), StreamId(3)} == {StreamId(3)}
    assert int(StreamId(7)) == 7 == StreamId(7).value


def test_new_never_repeats() -> None:
    ids = {stream.new() for _ in range(1000)}
    assert len(ids) == 1000
    assert StreamId(0) not in ids


def test_per_thread_is_stable_in_a_thread_and_distinct_between_threads() -> None:
    stream.set_policy(StreamPolicy.PER_THREAD)
    mine = stream.current()
    assert stream.current() == mine
    theirs: list[StreamId] = []
    thread = threading.Thread(target=lambda: theirs.append(stream.current()))
    thread.start()
    thread.join()
    assert theirs[0] != mine


def test_per_thread_ids_are_not_reused_by_later_threads() -> None:
    stream.set_policy(StreamPolicy.PER_THREAD)
    seen: list[StreamId] = []
    for _ in range(20):
        thread = threading.Thread(target=lambda: seen.append(stream.current()))
        thread.start()
        thread.join()
    assert len(set(seen)) == 20


def test_single_is_always_stream_zero() -> None:
    stream.set_policy(StreamPolicy.SINGLE)
    assert stream.current() == StreamId(0)


def test_set_policy_rejects_other_values() -> None:
    with pytest.raises(TypeError):
        stream.set_policy("per_task")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_per_task_is_stable_across_awaits_and_distinct_between_live_tasks() -> None:
    stream.set_policy(StreamPolicy.PER_TASK)
    seen: dict[int, list[StreamId]] = {}

    async def task(n: int) -> None:
        seen[n] = [stream.current()]
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
            seen[n].append(stream.current())

    async with anyio.create_task_group() as tg:
        for n in range(5):
            tg.start_soon(task, n)
    for ids in seen.values():
        assert len(set(ids)) == 1
    assert len({ids[0] for ids in seen.values()}) == 5


@pytest.mark.anyio
async def test_per_task_ids_are_not_reused_after_a_task_ends() -> None:
    stream.set_policy(StreamPolicy.PER_TASK)
    seen: list[StreamId] = []

    async def task() -> None:
        seen.append(stream.current())

    for _ in range(50):
        async with anyio.create_task_group() as tg:
            tg.start_soon(task)
    assert len(set(seen)) == 50


@pytest.mark.anyio
async def test_enter_pins_current_nests_and_restores() -> None:
    stream.set_policy(StreamPolicy.PER_TASK)
    base = stream.current()
    a, b = stream.new(), stream.new()
    with stream.enter(a):
        assert stream.current() == a
        await anyio.lowlevel.checkpoint()
        assert stream.current() == a
        with stream.enter(b):
            assert stream.current() == b
        assert stream.current() == a
    assert stream.current() == base


@pytest.mark.anyio
async def test_enter_in_one_task_does_not_leak_into_a_sibling() -> None:
    stream.set_policy(StreamPolicy.SINGLE)
    pinned = stream.new()
    sibling_saw: list[StreamId] = []

    async def pinned_task(ready: anyio.Event) -> None:
        with stream.enter(pinned):
            ready.set()
            await anyio.sleep_forever()

    async def sibling() -> None:
        sibling_saw.append(stream.current())

    async with anyio.create_task_group() as tg:
        ready = anyio.Event()
        tg.start_soon(pinned_task, ready)
        await ready.wait()
        tg.start_soon(sibling)
        await wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert sibling_saw == [StreamId(0)]


# --- the configured policy --------------------------------------------------------


@pytest.fixture
def per_task_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory holds a warmenv.toml asking for per-task streams; no code chose."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "warmenv.toml").write_text('stream_policy = "per_task"\n')
    monkeypatch.chdir(project)
    monkeypatch.setattr(stream, "_policy", StreamPolicy.PER_THREAD)
    monkeypatch.setattr(stream, "_chosen", False)
    return project


@pytest.mark.anyio
async def test_open_environment_applies_the_configured_stream_policy(
    per_task_project: Path, root: Path
) -> None:
    async with open_environment("app", root=root):
        assert stream.policy() is StreamPolicy.PER_TASK
        seen: list[StreamId] = []

        async def task() -> None:
            seen.append(stream.current())

        async with anyio.create_task_group() as tg:
            tg.start_soon(task)
            tg.start_soon(task)
    assert len(set(seen)) == 2  # one stream per task, not one for the thread


@pytest.mark.anyio
async def test_open_environment_with_its_defaults_applies_the_configured_policy_too(
    per_task_project: Path,
) -> None:
    async with open_environment():
        assert stream.policy() is StreamPolicy.PER_TASK


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["set_policy", "apply_config"])
async def test_a_policy_chosen_in_code_wins_over_the_configuration(
    per_task_project: Path, root: Path, how: str
) -> None:
    if how == "set_policy":
        stream.set_policy(StreamPolicy.SINGLE)
    else:
        (per_task_project / "elsewhere").mkdir()
        (per_task_project / "elsewhere" / "warmenv.toml").write_text('stream_policy = "single"\n')
        stream.apply_config(load_config(per_task_project / "elsewhere"))
    async with open_environment("app", root=root):
        assert stream.policy() is StreamPolicy.SINGLE


def test_apply_config_sets_the_policy_the_configuration_names(per_task_project: Path) -> None:
    stream.apply_config(load_config())
    assert stream.policy() is StreamPolicy.PER_TASK
    assert stream.policy_chosen()


@pytest.mark.anyio
async def test_open_environment_refuses_an_invalid_configured_stream_policy(
    per_task_project: Path, root: Path
) -> None:
    (per_task_project / "warmenv.toml").write_text('stream_policy = "per_core"\n')
    with pytest.raises(ConfigError, match=r"warmenv\.toml: key 'stream_policy'"):
        async with open_environment("app", root=root):
            pass  # pragma: no cover - the open fails


def test_apply_config_as_no_choice_leaves_a_chosen_policy_and_counts_as_none(
    per_task_project: Path,
) -> None:
    stream.apply_config(load_config(), chosen=False)
    assert stream.policy() is StreamPolicy.PER_TASK
    assert not stream.policy_chosen()
    stream.set_policy(StreamPolicy.SINGLE)
    stream.apply_config(load_config(), chosen=False)
    assert stream.policy() is StreamPolicy.SINGLE
