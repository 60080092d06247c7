"""Import by URL next to its parts: a raw httpx download plus an import from disk, in one run.

Run: python benchmarks/bench_download.py [--mib 100] [--backend asyncio|trio]

The bundles are served over loopback by `python -m http.server` in its own
process (so the server does not share the client's interpreter). Three
figures per format, each the best of `--repeat` runs into a fresh
environment: the raw download (httpx streaming the body into a file, no
checks), the import of the same file from disk, and `import_bundle(url)`.
The target: the import by URL takes at most 1.25x the sum of the other two
(at least 0.8x their combined speed).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _report import Row, print_table
from warmenv import Namespace, open_environment
from warmenv.bundle import export_bundle, import_bundle

NS = Namespace("bench", "download", version="1")


async def make_bundles(tmp: Path, mib: int) -> dict[str, Path]:
    value_size = 4096
    count = mib * (1 << 20) // value_size
    out: dict[str, Path] = {}
    async with open_environment("source", root=tmp / "source") as env:
        storage = env.storage(NS)
        for start in range(0, count, 10_000):
            await storage.insert_many(
                (b"key-%08d" % i, os.urandom(value_size))
                for i in range(start, min(start + 10_000, count))
            )
        for fmt in ("sqlite", "flat"):
            out[fmt] = tmp / "served" / f"bench.{fmt}"
            out[fmt].parent.mkdir(exist_ok=True)
            await export_bundle(env, out[fmt], name="bench", version="1", format=fmt)
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=directory,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, port
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError("the HTTP server did not start")


async def raw_download_s(url: str, target: Path) -> float:
    start = time.perf_counter()
    async with httpx.AsyncClient() as client, client.stream("GET", url) as response:
        with target.open("wb") as file:
            async for chunk in response.aiter_raw():
                file.write(chunk)
    elapsed = time.perf_counter() - start
    target.unlink()
    return elapsed


async def import_s(source: str | Path, root: Path) -> float:
    async with open_environment("target", root=root) as env:
        start = time.perf_counter()
        report = await import_bundle(source, env)
        elapsed = time.perf_counter() - start
        assert report.imported > 0
    for path in root.iterdir():
        path.unlink()
    return elapsed


async def bench(tmp: Path, mib: int, repeat: int) -> list[Row]:
    bundles = await make_bundles(tmp, mib)
    server, port = serve(tmp / "served")
    try:
        rows: list[Row] = []
        root = tmp / "target-root"
        root.mkdir()
        for fmt, path in bundles.items():
            url = f"http://127.0.0.1:{port}/{path.name}"
            size = path.stat().st_size / (1 << 20)
            raw = min([await raw_download_s(url, tmp / "raw.download") for _ in range(repeat)])
            disk = min([await import_s(path, root) for _ in range(repeat)])
            by_url = min([await import_s(url, root) for _ in range(repeat)])
            print(
                f"{fmt}: {size:.0f} MiB; raw download {raw:.2f}s, import from disk {disk:.2f}s, "
                f"import by URL {by_url:.2f}s",
                flush=True,
            )
            rows.append(
                Row(
                    f"import a {size:.0f} MiB {fmt} bundle by URL over loopback",
                    by_url,
                    "s",
                    "raw download + import from disk",
                    raw + disk,
                    "<= 1.25x (>= 0.8x the speed)",
                )
            )
        return rows
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = anyio.run(bench, Path(tmp), args.mib, args.repeat, backend=args.backend)
    print_table("Bundles by URL", rows)


if __name__ == "__main__":
    main()
