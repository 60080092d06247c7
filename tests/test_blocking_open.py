"""warmenv.blocking's open form without `with` (`open`, `close`, a finaliser), issue 21."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import warmenv.blocking
from helpers import run_python
from warmenv import ClosedError, Namespace
from warmenv.blocking import BlockingEnvironment, BlockingStore
from warmenv.blocking import open_environment as open_blocking

NS = Namespace("app", "open", version="1")


def on_a_thread(fn: Callable[[], object]) -> Any:
    """`fn()` run on a plain thread of its own; its value (or what it raised)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # handed back to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return outcome[0]


def test_an_environment_opened_without_with_serves_threads_until_closed(root: Path) -> None:
    env = on_a_thread(lambda: warmenv.blocking.open("t", root=root))
    assert isinstance(env, BlockingEnvironment)
    store: BlockingStore[str, int] = env.store(NS)
    assert on_a_thread(lambda: store.get_or_compute("k", int, "7")) == 7
    assert on_a_thread(env.close) is None
    env.close()  # again: nothing to do
    with pytest.raises(ClosedError):
        store.get("missing")
    with pytest.raises(ClosedError):
        env.store(NS)
    with warmenv.blocking.open("t", root=root) as again:  # also a context manager
        assert again.store(NS).get("k") == 7
    with pytest.raises(ClosedError):
        again.statistics()


def test_entering_without_a_with_block_keeps_the_environment_open(root: Path) -> None:
    # The notebook habit: the context manager is dropped on this line.
    env = open_blocking("t", root=root).__enter__()
    gc.collect()
    env.store(NS).insert("k", 1)
    assert env.store(NS).get("k") == 1
    env.close()


def test_a_store_keeps_its_environment_open(root: Path) -> None:
    # A case of the same kind: nothing but the store refers to its environment.
    store: BlockingStore[str, int] = open_blocking("t", root=root).__enter__().store(NS)
    other: BlockingStore[str, int] = warmenv.blocking.open("t", root=root).store(NS)
    gc.collect()
    store.insert("k", 1)
    assert store.get("k") == other.get("k") == 1
    assert other.get_or_compute("j", int, "2") == 2


@pytest.mark.parametrize("left", ["open", "collected", "entered"])
def test_an_environment_never_closed_is_closed_cleanly_at_exit(root: Path, left: str) -> None:
    code = f"""
import atexit, gc, json, threading
def report():
    print(json.dumps(sorted(t.name for t in threading.enumerate()
                            if t is not threading.main_thread())))
atexit.register(report)  # before warmenv's own hook, so it runs after it
from warmenv import Namespace
import warmenv.blocking
left = {left!r}
if left == "entered":
    env = warmenv.blocking.open_environment("t", root={str(root)!r}).__enter__()
else:
    env = warmenv.blocking.open("t", root={str(root)!r})
store = env.store(Namespace("app", "open", version="1"))
store.insert("k", 1)
assert store.get("k") == 1 and store.get("missing") is None
if left == "collected":
    del env, store
    gc.collect()
"""
    completed = run_python(code)
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""
    assert json.loads(completed.stdout) == []  # no warmenv-sqlite nor loop thread left
    # Closed cleanly: its counts were written at close, its WAL checkpointed away.
    assert sorted(path.name for path in root.iterdir()) == ["t.db"]
    with open_blocking("t", root=root) as env:
        (namespace,) = env.statistics().namespaces
        assert (namespace.hits, namespace.misses) == (1, 1)


def test_open_environment_takes_opens_parameters_and_refuses_a_wrong_one_at_the_call(
    root: Path,
) -> None:
    # One definition of the parameters (open's): the with-block form is derived from it.
    with pytest.raises(TypeError, match=r"^open_environment\(\) got an unexpected keyword "):
        warmenv.blocking.open_environment("e", rooot=root)  # type: ignore[call-arg]
    with warmenv.blocking.open_environment("e", root=root, max_bytes=1 << 20) as env:
        assert env.name == "e"


def test_a_plain_with_of_the_async_open_environment_says_what_to_write(root: Path) -> None:
    with pytest.raises(TypeError) as raised:
        with warmenv.open_environment("e", root=root):  # type: ignore[attr-defined]
            pass
    assert "write `async with open_environment(...) as env:`" in str(raised.value)
    assert "warmenv.blocking.open_environment(...)" in str(raised.value)
    assert not root.exists()  # nothing was opened


@pytest.mark.anyio
async def test_an_async_with_of_a_blocking_environment_says_what_to_write(root: Path) -> None:
    with pytest.raises(TypeError, match=r"write `with warmenv\.blocking\.open_environment"):
        async with open_blocking("e", root=root):  # type: ignore[attr-defined]
            pass
    assert not root.exists()
