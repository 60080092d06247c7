"""A child process for the kill tests: one write operation, reporting as it goes.

    python workload.py insert_many ROOT BATCHES BATCH_SIZE BACKEND
    python workload.py import ROOT BUNDLE BATCH_SIZE BACKEND
    python workload.py export ROOT OUT FORMAT BACKEND

It prints "started" once the operation is under way, then one line per batch,
so the parent can kill it at a moment of its choosing mid-operation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from warmenv import Namespace, open_environment
from warmenv.bundle import Progress, exporting, importing

NS = Namespace("reliability", "batches", version="1")
ENV = "target"


def batch_items(batch: int, size: int) -> list[tuple[bytes, bytes]]:
    return [(b"b%05d-%05d" % (batch, i), b"v" * 512) for i in range(size)]


async def insert_many(root: Path, batches: int, size: int) -> None:
    async with open_environment(ENV, root=root) as env:
        storage = env.storage(NS)
        print("started", flush=True)
        for batch in range(batches):
            summary = await storage.insert_many(batch_items(batch, size))
            assert summary.failed == 0, summary
            print("batch", batch, flush=True)


async def import_(root: Path, bundle: Path, size: int) -> None:
    async with open_environment(ENV, root=root) as env:
        async with importing(bundle, env, batch_size=size) as progress:
            async for event in progress:
                if isinstance(event, Progress):
                    print("started", event.entries_done, flush=True)


async def export(root: Path, out: Path, fmt: str) -> None:
    async with exporting(
        root / f"{ENV}.db", out, name="killed", version="1", format=fmt
    ) as progress:
        async for event in progress:
            if isinstance(event, Progress):
                print("started", event.entries_done, flush=True)


def main() -> None:
    if soak_main(sys.argv[1:]):
        return
    operation, root, *rest = sys.argv[1:]
    backend = rest.pop()
    if operation == "insert_many":
        anyio.run(insert_many, Path(root), int(rest[0]), int(rest[1]), backend=backend)
    elif operation == "import":
        anyio.run(import_, Path(root), Path(rest[0]), int(rest[1]), backend=backend)
    elif operation == "export":
        anyio.run(export, Path(root), Path(rest[0]), rest[1], backend=backend)
    else:
        raise SystemExit(f"unknown operation {operation!r}")
    print("done", flush=True)


async def soak(root: Path, seconds: float, me: int, bundle: Path) -> None:
    """Reads, inserts and imports on one environment until the time is up."""
    import json
    import random
    import time

    from warmenv import Conflict, Failed, Stored
    from warmenv.bundle import import_bundle

    rng = random.Random(me)
    own: list[str] = []
    shared: dict[str, str] = {}
    errors: list[str] = []
    counts = {"reads": 0, "inserts": 0, "imports": 0}
    deadline = time.monotonic() + seconds
    async with open_environment(ENV, root=root) as env:
        storage = env.storage(NS)
        n = 0
        while time.monotonic() < deadline:
            action = rng.random()
            try:
                if action < 0.4:
                    await storage.get(b"shared-%04d" % rng.randrange(200))
                    counts["reads"] += 1
                elif action < 0.9:
                    key = b"own-%d-%06d" % (me, n)
                    n += 1
                    result = await storage.insert(key, b"x" * 64)
                    if isinstance(result, Stored):
                        own.append(key.decode())
                    else:
                        errors.append(f"own insert: {result!r}")
                    skey = b"shared-%04d" % rng.randrange(200)
                    result = await storage.insert(skey, b"from-%d" % me)
                    if isinstance(result, Stored):
                        shared[skey.decode()] = f"from-{me}"
                    elif isinstance(result, Conflict):
                        shared[skey.decode()] = result.existing.decode()
                    elif isinstance(result, Failed):
                        errors.append(f"shared insert: {result.reason}")
                    counts["inserts"] += 2
                else:
                    report = await import_bundle(bundle, env)
                    if report.failed:
                        errors.append(f"import failed {report.failed}")
                    counts["imports"] += 1
            except Exception as exc:  # the soak reports anything that escapes
                errors.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps({"own": own, "shared": shared, "errors": errors, "counts": counts}))


async def soak_export(root: Path, seconds: float, out: Path) -> None:
    """Exports the environment over and over, checking every bundle it writes."""
    import json
    import time

    from warmenv.bundle import SqliteBundle, export_bundle, open_bundle

    exports, errors = 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            report = await export_bundle(root / f"{ENV}.db", out, name="soak", version="1")
            async with open_bundle(out) as bundle:
                entries = sum(s.entries for s in await bundle.namespaces())
                if isinstance(bundle, SqliteBundle):
                    digest = await bundle.compute_digest()
                    if digest != bundle.manifest.digest:
                        errors.append("digest mismatch")
            if entries != report.entries:
                errors.append(f"bundle holds {entries}, report says {report.entries}")
            exports += 1
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps({"exports": exports, "errors": errors}))


def soak_main(argv: list[str]) -> bool:
    operation = argv[0]
    if operation == "soak":
        _, root, seconds, me, bundle, backend = argv
        anyio.run(soak, Path(root), float(seconds), int(me), Path(bundle), backend=backend)
        return True
    if operation == "soak_export":
        _, root, seconds, out, backend = argv
        anyio.run(soak_export, Path(root), float(seconds), Path(out), backend=backend)
        return True
    return False


if __name__ == "__main__":
    main()
