"""The environment layer's primitives next to anyio's, on every backend.

Run: python benchmarks/bench_sync.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _report import Row, per_call_us, print_table
from warmenv.channel import oneshot
from warmenv.sync import OnceCell, RLock, RWLock

N = 50_000


async def bench() -> list[Row]:
    lock = anyio.Lock()
    rlock = RLock()
    rwlock = RWLock()
    cell: OnceCell[int] = OnceCell()

    async def init() -> int:
        return 1

    await cell.get_or_init(init)

    async def anyio_lock() -> None:
        async with lock:
            pass

    async def rlock_cycle() -> None:
        async with rlock:
            pass

    async def read_cycle() -> None:
        async with rwlock.read():
            pass

    async def write_cycle() -> None:
        async with rwlock.write():
            pass

    async def event_round_trip() -> None:
        event = anyio.Event()
        event.set()
        await event.wait()

    async def oneshot_round_trip() -> None:
        sender, receiver = oneshot()
        sender.send(1)
        await receiver.receive()

    async def cell_hit() -> None:
        await cell.get_or_init(init)

    async def empty() -> None:
        pass

    base_lock = await per_call_us(anyio_lock, N)
    base_event = await per_call_us(event_round_trip, N)
    return [
        Row(
            "RLock acquire+release",
            await per_call_us(rlock_cycle, N),
            "µs",
            "anyio.Lock",
            base_lock,
            "<= 2x",
        ),
        Row(
            "RWLock read acquire+release",
            await per_call_us(read_cycle, N),
            "µs",
            "anyio.Lock",
            base_lock,
        ),
        Row(
            "RWLock write acquire+release",
            await per_call_us(write_cycle, N),
            "µs",
            "anyio.Lock",
            base_lock,
        ),
        Row(
            "oneshot create+send+receive",
            await per_call_us(oneshot_round_trip, N),
            "µs",
            "anyio.Event create+set+wait",
            base_event,
            "<= 1.5x",
        ),
        Row(
            "OnceCell hit",
            await per_call_us(cell_hit, N),
            "µs",
            "an empty coroutine call",
            await per_call_us(empty, N),
            "< 1 µs",
        ),
    ]


def main() -> None:
    for backend, options in (("asyncio", {}), ("asyncio", {"use_uvloop": True}), ("trio", {})):
        label = "asyncio+uvloop" if options else backend
        rows = anyio.run(bench, backend=backend, backend_options=options)
        print_table(f"bench_sync on {label}", rows)


if __name__ == "__main__":
    main()
