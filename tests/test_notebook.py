"""warmenv.blocking from a real Jupyter kernel (ipykernel, driven by jupyter_client), issue 21.

A cell's code runs on the kernel's event-loop thread, inside the kernel's
task, yet it is the user's synchronous code: warmenv.blocking serves it
(its work runs on its own loop thread), and refuses what a cell runs inside
a coroutine, as anywhere else.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

import warmenv.blocking
from warmenv import Namespace
from warmenv.blocking import EventLoopThreadError
from warmenv.blocking import open_environment as open_blocking

NS = Namespace("app", "notebook", version="1")


class Kernel:
    """One ipykernel process of our interpreter, and a way to run a cell in it."""

    def __init__(self, client: BlockingKernelClient) -> None:
        self.client = client

    def run(self, code: str) -> tuple[str, str | None]:
        """Run `code` as a cell: what it printed, and the name and text of its error if any."""
        msg_id = self.client.execute(code, store_history=False)
        printed: list[str] = []
        error: str | None = None
        while True:
            message: dict[str, Any] = self.client.get_iopub_msg(timeout=60)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                printed.append(content["text"])
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(printed), error


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    # ipykernel's own kernel, which jupyter_client runs with our interpreter,
    # seeing the same packages as we do (the checkout's src/, tests/).
    manager = KernelManager(kernel_name="python3")
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    manager.start_kernel(cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": path})
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield Kernel(client)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_notebook_opens_computes_and_closes_across_cells(kernel: Kernel, root: Path) -> None:
    opened = f"""
import threading
import warmenv.blocking
from warmenv import Namespace
env = warmenv.blocking.open("nb", root={str(root)!r})
store = env.store(Namespace("app", "notebook", version="1"))
calls = []
def tune(shape):
    calls.append(threading.current_thread().name)
    return {{"block": len(shape)}}
"""
    assert kernel.run(opened) == ("", None)
    assert kernel.run("import sys; print(sys.executable)") == (sys.executable + "\n", None)
    computed = kernel.run(
        'print(store.get_or_compute("k", tune, "abcd"), store.get_or_compute("k", tune, "x"),'
        " store.get('k'), calls)"
    )
    # Computed once, on the cell's own thread; then hits.
    assert computed == ("{'block': 4} {'block': 4} {'block': 4} ['MainThread']\n", None)
    # A cell's `with` block works as well.
    in_a_block = f"""
with warmenv.blocking.open_environment("nb", root={str(root)!r}) as other:
    print(other.store(Namespace("app", "notebook", version="1")).get("k"))
"""
    assert kernel.run(in_a_block) == ("{'block': 4}\n", None)
    closed = kernel.run(
        "env.close()\n"
        "print(sorted(t.name for t in threading.enumerate() if t.name.startswith('warmenv-')))"
    )
    assert closed == ("['warmenv-blocking-loop']\n", None)  # no warmenv-sqlite thread left
    with open_blocking("nb", root=root) as env:
        assert env.store(Namespace("app", "notebook", version="1")).get("k") == {"block": 4}


def test_a_cell_inside_a_coroutine_is_refused_as_async_code_is(kernel: Kernel, root: Path) -> None:
    opened = f"""
import warmenv.blocking
from warmenv import Namespace
env = warmenv.blocking.open("nb", root={str(root)!r})
store = env.store(Namespace("app", "notebook", version="1"))
store.insert("k", 1)
async def inside():
    return store.get("k")
def helper():
    return store.get("k")
async def through_a_helper():
    return helper()
"""
    assert kernel.run(opened) == ("", None)
    assert kernel.run("print(helper())") == ("1\n", None)  # a cell's sync code, through a def
    # A statement of a cell that awaits elsewhere is still sync code: IPython
    # runs each statement by itself, and only those with an `await` as async.
    both = "import asyncio\nx = store.get('k')\nawait asyncio.sleep(0)\nprint(x)"
    assert kernel.run(both) == ("1\n", None)
    for cell in [
        "await inside()",  # a coroutine awaited by the cell
        "await through_a_helper()",  # sync code called from a coroutine
        "print(await asyncio.gather(inside()))",  # a task of the kernel's loop
    ]:
        _, error = kernel.run(cell)
        assert error is not None and error.startswith("EventLoopThreadError:"), cell
        assert "use the async API" in error
    assert kernel.run("env.close()") == ("", None)


@pytest.mark.anyio
async def test_only_module_code_a_coroutine_runs_may_wait_on_a_loop_thread(root: Path) -> None:
    # The rule a kernel relies on, on either backend: code a coroutine runs with
    # `exec` (a REPL's, a cell's) may wait; what the coroutine calls may not.
    env = await anyio.to_thread.run_sync(lambda: warmenv.blocking.open("t", root=root))
    store = await anyio.to_thread.run_sync(env.store, NS)
    await anyio.to_thread.run_sync(store.insert, "k", 1)
    cell: dict[str, Any] = {"store": store}
    exec(compile("value = store.get('k')", "<cell>", "exec"), cell)
    assert cell["value"] == 1
    with pytest.raises(EventLoopThreadError, match="use the async API"):
        store.get("k")
    # A sync function the coroutine calls is its own code too.
    with pytest.raises(EventLoopThreadError, match="use the async API"):
        (lambda: store.get("k"))()
    await anyio.to_thread.run_sync(env.close)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_callback_of_an_event_loop_is_refused(root: Path) -> None:
    env = await anyio.to_thread.run_sync(lambda: warmenv.blocking.open("t", root=root))
    outcome: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def callback() -> None:
        try:
            env.statistics()
        except EventLoopThreadError as exc:
            outcome.set_result(exc)
        else:
            outcome.set_result(None)  # pragma: no cover

    asyncio.get_running_loop().call_soon(callback)
    assert isinstance(await outcome, EventLoopThreadError)
    await anyio.to_thread.run_sync(env.close)
