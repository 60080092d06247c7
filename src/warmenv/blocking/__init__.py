"""warmenv from synchronous code: scripts, notebooks, thread pools, WSGI workers.

Every blocking environment in a process is served by one event-loop thread
(started on first use, a daemon, stopped at interpreter exit), so a sync
caller pays a thread hop only when there is I/O to wait for, never an event
loop per call. The synchronous faces share the async core rather than
copying it, as httpx's `Client` and `AsyncClient` share theirs:

- `_loop`: the loop thread and the one crossing to it (a call, a call that
  hands work back to the caller's thread, an async context held open
  around the caller's block), and the one refusal of an event-loop thread;
- `_environment`: `BlockingEnvironment`, each method the async
  `Environment`'s, called across;
- `_store`: `BlockingStore`, the async `Store`'s memory and single flight,
  its hits answered on the caller's own thread (`Store.held`);
- `_bundles`: `import_bundle` and `export_bundle`, with progress callbacks
  on the caller's thread, and `warm_up` (a background import) with its handle.

Calling into this package from async code (inside a coroutine, or a
callback of a running event loop) raises `EventLoopThreadError`: blocking
there would stall that loop (or deadlock it), and the async API is the one
to use. A Jupyter cell's own code, which a coroutine of the kernel runs with
`exec`, is synchronous code and may wait (`_loop.waiting_refused`).
"""

from __future__ import annotations

from warmenv.blocking._bundles import BlockingWarmUp, export_bundle, import_bundle, warm_up
from warmenv.blocking._environment import BlockingEnvironment, open, open_environment
from warmenv.blocking._loop import EventLoopThreadError
from warmenv.blocking._store import BlockingStore

__all__ = [
    "BlockingEnvironment",
    "BlockingStore",
    "BlockingWarmUp",
    "EventLoopThreadError",
    "export_bundle",
    "import_bundle",
    "open",
    "open_environment",
    "warm_up",
]

del annotations  # the `from __future__` name: not a public one (dir(), completion)
