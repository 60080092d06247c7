"""What an import tells the stores of its environment: each batch it commits.

A store computing a key while an import runs takes the imported value if
the import lands the key first (`warmenv.persistence._flight.unless_imported`);
the import announces its batches here, and the namespaces stores were opened
for tell it what to copy first. Its own module, below the storage contract
that hands it out (`Storage.arrivals`), and importing only anyio.
"""

from __future__ import annotations

from typing import final

import anyio

__all__ = ["Arrivals"]


@final
class Arrivals:
    """An environment's imports, announced batch by batch to the runs they may answer.

    A `get_or_compute` run that starts while a bundle is imported computes
    its key at once (the import may not reach it for minutes), but the
    import may land that key before the computation ends: then the run's
    askers take the imported value and the computation is cancelled
    (`Store._fill`). Imports bulk-copy in SQL and see no keys, so each
    committed batch is announced (`landed`) and a computing run reads its
    key again after each one, whether it started before or during the
    import (one may begin while it computes). Nothing is read while no
    import runs. One event loop's: imports and runs are its tasks.
    """

    __slots__ = ("_batches", "_event", "wanted")

    def __init__(self) -> None:
        self._batches = 0
        self._event: anyio.Event | None = None
        self.wanted: dict[str, None] = {}
        """The namespaces this process opened stores of, in order: an import copies them first."""

    def want(self, namespace: str) -> None:
        """A store of `namespace` is open: the application may ask for its keys."""
        self.wanted.setdefault(namespace)

    @property
    def batches(self) -> int:
        """How many batches have landed so far (a count to pass to `after`)."""
        return self._batches

    def end(self) -> None:
        """An import ends (however it ended); the runs waiting read once more.

        Whether an import is running is not kept: a run watches whatever the
        count of batches says, and one that began before an import is watched
        all the same (no store needs to ask).
        """
        self.landed()

    def landed(self) -> None:
        """A batch of an import has committed."""
        self._batches += 1
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def after(self, seen: int) -> int:
        """Wait until a batch has landed since `batches` read `seen`; the count then."""
        while self._batches == seen:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        return self._batches
