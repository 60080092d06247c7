"""What a JSON dict value could be held as: each form's hit, in instructions, and its memory.

Issue 23 holds a store's blocking `dict` hit to 1.2x of `dict.get` under a
lock plus the least copy of the value's shape, and the store's memory to
1.7x of the raw values' size. Today a `dict` value is held as its JSON and
decoded on each hit (`warmenv.persistence._held`). This script measures,
for `bench_storage.py`'s `dict` value ({"block", "choice", "ms", "note",
"tiles"}, ~230 bytes of JSON), what the other held forms would cost, each
in the best case of a rebuild written for that one shape:

- `floor`: `dict.get` under a `threading.Lock` (the held dict handed out);
- `least`: the same plus `dict.copy` and the list's `list.copy` (the held
  value decoded, the floor issue 23 names);
- `decode`: today's form, the JSON bytes scanned by the C scanner;
- `tuple`: the leaves in a tuple whose first item is the shape's rebuild
  function (`{"block": v[1], ..., "tiles": [v[5], v[6], v[7]]}`: the keys
  are the function's constants, one dict display and one list display);
- `slots`: the leaves in a per-shape `__slots__` object (no pointer: its
  class is the shape), the list of small ints as a tuple shared by every
  value with the same one, the repeating string shared likewise.

Instructions by callgrind over the hit loop alone (`--dump-before` marks,
as `hit_instructions.py`), 1,000 keys, the main thread. Memory: RSS growth
of holding 100,000 such values under `str` keys in a dict, beside the raw
size (keys + JSON values), each form in a fresh process.

    python benchmarks/held_forms.py [--hits 20000]
    python benchmarks/held_forms.py --wall    # wall time over 100k keys, one process
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _report import CHILD, MEMORY_PROBE, callgrind

HERE = Path(__file__).parent
FORMS = ("least", "floor", "decode", "tuple", "slots")
KEYS = 1000


def value_of(i: int) -> dict[str, Any]:
    """bench_storage.py's `dict` value (`shaped_value("dict", i)`)."""
    return {
        "block": 128 + i % 7,
        "choice": "blocked",
        "ms": 1.5 + i,
        "note": f"{'x' * 153}-{i:06d}",
        "tiles": [16, 32, 64 + i % 3],
    }


def encoded(i: int) -> bytes:
    return json.dumps(value_of(i), sort_keys=True, separators=(",", ":")).encode()


def rebuild_tuple(v: tuple[Any, ...]) -> dict[str, Any]:
    """The `tuple` form's rebuild: what a function generated for the shape would be."""
    return {"block": v[1], "choice": v[2], "ms": v[3], "note": v[4], "tiles": [v[5], v[6], v[7]]}


class Slotted:
    """The `slots` form: one class per shape, its leaves in slots."""

    __slots__ = ("block", "choice", "ms", "note", "tiles")
    block: Any
    choice: Any
    ms: Any
    note: Any
    tiles: Any

    def rebuild(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "choice": self.choice,
            "ms": self.ms,
            "note": self.note,
            "tiles": [*self.tiles],
        }


def held_as(form: str, data: bytes, shared: dict[Any, Any]) -> Any:
    """The held form of the value `data` encodes (`shared`: repeating leaves, one object each)."""
    value = json.loads(data)
    if form in ("floor", "least"):
        return value
    if form == "decode":
        return data
    if form == "tuple":
        return (rebuild_tuple, value["block"], shared.setdefault(value["choice"], value["choice"]),
                value["ms"], value["note"], *value["tiles"])  # fmt: skip
    slotted = Slotted.__new__(Slotted)
    slotted.block = value["block"]
    slotted.choice = shared.setdefault(value["choice"], value["choice"])
    slotted.ms = value["ms"]
    slotted.note = value["note"]
    tiles = tuple(value["tiles"])
    slotted.tiles = shared.setdefault(tiles, tiles)
    return slotted


def hit_of(form: str, n: int) -> tuple[Callable[[str], Any], list[str]]:
    """A hit on `n` values held in `form`, and their keys."""
    sys.path.insert(0, str(HERE.parent / "src"))
    from warmenv.persistence.codec import scan_canonical

    shared: dict[Any, Any] = {}
    held = {f"key-{i:06d}": held_as(form, encoded(i), shared) for i in range(n)}
    lock = threading.Lock()

    def floor(key: str) -> Any:
        with lock:
            return held.get(key)

    def least(key: str) -> Any:
        with lock:
            found: Any = held.get(key)
        mine = found.copy()
        mine["tiles"] = mine["tiles"].copy()
        return mine

    def decode(key: str) -> Any:
        with lock:
            found: Any = held.get(key)
        return scan_canonical(found.decode(), 0)[0]

    def tuple_form(key: str) -> Any:
        with lock:
            found: Any = held.get(key)
        return found[0](found)

    def slots(key: str) -> Any:
        with lock:
            found: Any = held.get(key)
        return found.rebuild()

    hit = {"floor": floor, "least": least, "decode": decode, "tuple": tuple_form, "slots": slots}
    return hit[form], list(held)


def hits_child(form: str, hits: int) -> None:
    """The process callgrind runs: `hits` hits of `form`, between two marks."""
    one, keys = hit_of(form, KEYS)
    for key in keys:  # the code's paths warm
        one(key)
    time.thread_time()  # callgrind dumps here: the set-up
    for _ in range(hits // KEYS):
        for key in keys:
            one(key)
    time.thread_time()  # and here: the loop alone


_RSS_CHILD = MEMORY_PROBE + textwrap.dedent(
    """
    import gc, sys
    sys.path.insert(0, sys.argv[2])
    from held_forms import encoded, held_as

    form, n = sys.argv[1], 100_000
    rows = [(f"key-{i:06d}", encoded(i)) for i in range(n)]
    raw = sum(len(key) + len(data) for key, data in rows)
    shared = {}
    gc.collect()
    before = rss_mib()
    held = {}
    for key, data in rows:
        # A fresh key and value, as a storage scan hands them over.
        held[key.encode().decode()] = held_as(form, bytes(bytearray(data)), shared)
    gc.collect()
    print((rss_mib() - before) * 2**20 / raw)
    """
)


def rss_ratio(form: str) -> float:
    """RSS growth of holding 100k values in `form`, over their raw size."""
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, form, str(HERE)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out)


def wall(n: int = 100_000, draws: int = 10_000, chunk: int = 500, repeat: int = 5) -> None:
    """Each form's hit over `n` keys drawn uniformly, in one process, beside the least copy.

    The forms take turns chunk by chunk, each (form, chunk) keeping its best
    thread time over `repeat` passes, as `bench_storage.py` times its rows.
    """
    rng = random.Random(3)
    hits = {form: hit_of(form, n)[0] for form in FORMS}
    stream = [f"key-{rng.randrange(n):06d}" for _ in range(draws)]
    chunks = [stream[i : i + chunk] for i in range(0, draws, chunk)]
    best = {form: [float("inf")] * len(chunks) for form in FORMS}
    for one in hits.values():
        for key in stream:
            one(key)
    for _ in range(repeat):
        for i, keys in enumerate(chunks):
            for form, one in hits.items():
                start = time.thread_time()
                for key in keys:
                    one(key)
                best[form][i] = min(best[form][i], time.thread_time() - start)
    least = sum(best["least"])
    print("| held form | µs per hit | / least copy |")
    print("|---|---:|---:|")
    for form, times in best.items():
        print(f"| {form} | {sum(times) / draws * 1e6:.3f} | {sum(times) / least:.2f} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        hits_child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hits", type=int, default=20_000)
    parser.add_argument(
        "--wall", action="store_true", help="time each form over 100k keys in one process instead"
    )
    args = parser.parse_args()
    if args.wall:
        wall()
        return
    tree = HERE.parent
    counts: dict[str, float] = {}
    rss = {"floor": rss_ratio("floor")}  # the least copy holds the same decoded values
    print("| held form | instructions per hit | / least copy | RSS / raw size (100k) |")
    print("|---|---:|---:|---:|")
    for form in FORMS:
        args_ = [form, str(args.hits)]
        total = callgrind(__file__, tree, args_, loop=True).threads[0]
        counts[form] = total / (args.hits // KEYS * KEYS)
        ratio = counts[form] / counts["least"]
        memory = rss["floor"] if form in ("least", "floor") else rss_ratio(form)
        print(f"| {form} | {counts[form]:,.0f} | {ratio:.2f} | {memory:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
