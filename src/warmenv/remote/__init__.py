"""The shared tier: a fleet's warm state in Redis, behind the `Storage` protocol.

Rooms, each importing only those before it: `settings` (the remote URL,
its bounds and its TLS context, checked when made), `report` (the tier's
statistics and a probe's outcome, values), `lag` (deadlines in the server's
time, not our busy loop's), `reader` (what a server may make us hold: every
reply and message bounded), `wire` (the frame around
a published value and the Lua scripts, what is said to Redis), `tier` (one
environment's connection: bounded calls and backoff, leases, the
subscription that wakes waiters) and `storage` (`RemoteStorage`, a local
storage with the tier behind it: the two-tier insert and lookup rules).
"""

from __future__ import annotations

from warmenv._errors import RemoteError
from warmenv.remote.report import Ping, RemoteStatistics
from warmenv.remote.settings import RemoteSettings, remote_settings
from warmenv.remote.storage import RemoteStorage
from warmenv.remote.tier import RemoteTier
from warmenv.remote.wire import RemoteValue

__all__ = [
    "Ping",
    "RemoteError",
    "RemoteSettings",
    "RemoteStatistics",
    "RemoteStorage",
    "RemoteTier",
    "RemoteValue",
    "remote_settings",
]

del annotations  # the `from __future__` name: not a public one (dir(), completion)
