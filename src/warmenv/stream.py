"""Which logical stream the current code is on.

A stream is an ordered submission queue: work on one stream runs in order,
work on different streams may overlap. Code that batches or orders work asks
`current()` which stream it is on; the policy says whether a stream is a
thread, a task, or the whole process.

Stream ids come from a counter, never from `id()` of a thread or task: Python
reuses those numbers once their owner is gone, and two streams must never
share an id while either is in use.

The policy is process-wide. Configuration (`stream_policy` in warmenv.toml)
supplies it when `open_environment` runs, unless the program chose one
itself with `set_policy` or `apply_config`: code says what it needs, and a
file on the machine must not overrule it.
"""

from __future__ import annotations

import contextvars
import enum
import itertools
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import attrs

from warmenv._backend import native_task
from warmenv._faces import SyncOnlyBlock, sync_with_only

__all__ = [
    "StreamId",
    "StreamPolicy",
    "apply_config",
    "current",
    "enter",
    "new",
    "policy",
    "set_policy",
]


class StreamPolicy(enum.Enum):
    """What one stream corresponds to."""

    PER_THREAD = "per_thread"
    PER_TASK = "per_task"
    SINGLE = "single"


@attrs.frozen(order=True)
class StreamId:
    """The identity of a stream: hashable, ordered, wrapping an `int`."""

    value: int

    def __int__(self) -> int:
        return self.value


_ids = itertools.count(1)
_counter_lock = threading.Lock()
_policy = StreamPolicy.PER_THREAD
_chosen = False  # set_policy or apply_config was called: configuration no longer applies
_thread_streams = threading.local()
_task_streams: weakref.WeakKeyDictionary[object, StreamId] = weakref.WeakKeyDictionary()
_pinned: contextvars.ContextVar[StreamId | None] = contextvars.ContextVar(
    "warmenv_stream_pinned", default=None
)


def set_policy(policy: StreamPolicy) -> None:
    """Set the process-wide stream policy; configuration no longer changes it."""
    global _policy, _chosen
    if not isinstance(policy, StreamPolicy):
        raise TypeError(f"expected a StreamPolicy, got {policy!r}")
    _policy = policy
    _chosen = True


class _Configured(Protocol):
    """What `apply_config` reads of a `warmenv.config.Config` (stream sits below config)."""

    @property
    def stream_policy(self) -> StreamPolicy: ...


def apply_config(config: _Configured, *, chosen: bool = True) -> None:
    """Set the policy a configuration names (`load_config().stream_policy`).

    Like `set_policy`, this is a choice in code that later opens leave alone.
    With `chosen=False` (how `open_environment` applies the configuration) the
    policy is taken only while the program has chosen none, and it is no choice.
    """
    global _policy, _chosen
    if chosen or not _chosen:
        _policy = config.stream_policy
        _chosen = _chosen or chosen


def policy_chosen() -> bool:
    """Whether the program set the policy itself (so configuration is not consulted)."""
    return _chosen


def policy() -> StreamPolicy:
    """The process-wide stream policy (`PER_THREAD` unless set)."""
    return _policy


def new() -> StreamId:
    """A stream id never handed out before in this process."""
    with _counter_lock:
        return StreamId(next(_ids))


def current() -> StreamId:
    """The stream the calling code is on, under the current policy or `enter()`."""
    pinned = _pinned.get()
    if pinned is not None:
        return pinned
    if _policy is StreamPolicy.SINGLE:
        return StreamId(0)
    if _policy is StreamPolicy.PER_TASK:
        task = native_task()
        stream = _task_streams.get(task)
        if stream is None:
            stream = _task_streams[task] = new()
        return stream
    stream = getattr(_thread_streams, "stream", None)
    if stream is None:
        stream = _thread_streams.stream = new()
    return stream


def enter(stream_id: StreamId) -> SyncOnlyBlock[StreamId]:
    """Pin `current()` to `stream_id` inside the block; nests and restores on exit.

    A plain `with` block (it sets a context variable; there is nothing to await),
    also in async code: an `async with` is told so."""
    return SyncOnlyBlock(_enter(stream_id), _ENTER)


_ENTER = sync_with_only("stream.enter(...)", "warmenv.stream.enter(stream_id)")


@contextmanager
def _enter(stream_id: StreamId) -> Iterator[StreamId]:
    if not isinstance(stream_id, StreamId):
        raise TypeError(f"expected a StreamId, got {stream_id!r}")
    token = _pinned.set(stream_id)
    try:
        yield stream_id
    finally:
        _pinned.reset(token)
