"""What the shared tier reports: its counters, and whether a probe found Redis answering.

Values only (`warmenv.remote.tier` fills them), for `statistics()`, `ping()`
and what `warmenv stats` and the command line's probe print.
"""

from __future__ import annotations

import attrs

__all__ = ["Ping", "RemoteStatistics"]


@attrs.frozen
class RemoteStatistics:
    """What the shared tier did for this process, for `statistics()` and `warmenv stats`."""

    hits: int
    """Local misses answered by Redis."""
    misses: int
    """Local misses Redis could not answer either."""
    published: int
    """Values this process was first to put in Redis."""
    already_published: int
    """Values Redis already held when this process offered one (first writer won)."""
    too_large: int
    """Values kept local because they exceed `max_value_bytes`."""
    rejected: int
    """Values under our keys that were not ours (wrong type, garbled, oversized): misses."""
    failures: int
    """Operations that failed or timed out."""
    skipped: int
    """Operations not tried because the remote was backing off after a failure."""
    outages: int
    """Times the remote went from answering to failing."""
    available: bool
    """Whether the remote answered its last operation (or has not been tried)."""
    leases: int = 0
    """Computations this process ran holding the fleet's lease on the key."""
    lease_waits: int = 0
    """Computations this process waited for because another host held the lease."""
    leases_lost: int = 0
    """Leases that expired or were taken over while this process still computed."""
    woken: int = 0
    """Waits for another host's value ended by its message rather than by polling."""
    subscribed: bool = False
    """Whether waiters are woken by messages now (else they only poll)."""
    publish_blocked: int = 0
    """Values not published because what sits under the key in Redis is no warmenv value
    (another type, or a string warmenv did not frame): it stays until it is deleted."""
    backfill_pending: int = 0
    """Values fetched from Redis not yet written to the local tier (at most `max_backfill`)."""
    backfill_waits: int = 0
    """Lookups that found the back-fill queue full and waited for a flush."""
    backfill_failed: int = 0
    """Fetched values whose local write failed (they stay in Redis)."""
    waited: float = 0.0
    """Seconds this process had a call to Redis in flight, in the server's time: calls side
    by side count once, and time our own busy loop ran late not at all (an outage costs
    about one `timeout`, and one more per retry, whatever the machine's load, however
    many calls met it)."""
    retries: int = 0
    """Calls that tried the remote again once a backoff after a failure was over: one at
    a time, the others meanwhile `skipped`."""


@attrs.frozen
class Ping:
    """Whether the remote answered a PING within the timeout: what `warmenv` says of a probe."""

    remote: str
    """The server, as `describe()` says it (the password hidden)."""
    reachable: bool
    seconds: float | None
    """The round trip, connecting included, when it answered."""
    reason: str | None
    """Why it did not answer (the password hidden), when it did not."""
    misconfigured: bool = False
    """Whether the server answered that the URL is wrong (a password, user, database or
    permission refused): a configuration error to fix, not an outage."""

    def __str__(self) -> str:
        if self.reachable:
            return f"{self.remote} answered in {1000 * (self.seconds or 0.0):.1f} ms"
        if self.misconfigured:
            return f"{self.remote} refused the remote URL's settings ({self.reason})"
        return f"{self.remote} is unavailable ({self.reason})"
