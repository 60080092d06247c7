"""The long fuzz run of the bundle readers and the manifest parser (`nox -s fuzz`).

    python benchmarks/fuzz_bundles.py [--minutes 10] [--out DIR] [--hang-seconds 30]

The inputs and the property are tests/fuzz.py's (the suite runs a short form
of the same). A supervisor runs the fuzzing in a worker process, so that a
crash (a signal, SIGBUS from a mapping) or a hang (an input running longer
than --hang-seconds) is caught too: the worker writes each input to DIR before
running it, and when the worker dies the supervisor records that input as a
finding and starts a new worker for the time that is left. A Python exception
other than BundleError/OSError is shrunk by hypothesis to a small input and
recorded (input, exception, where it was raised). Rounds alternate between
asyncio, asyncio with uvloop and trio.

Prints a summary (inputs tried, outcomes, findings) and writes it to
DIR/summary.json; exits 1 if there is any finding.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

BACKENDS: list[tuple[str, dict[str, Any]]] = [
    ("asyncio", {}),
    ("asyncio", {"use_uvloop": True}),
    ("trio", {}),
]
BUNDLES_PER_ROUND = 400
MANIFESTS_PER_ROUND = 200


def _long_run() -> Any:
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )


# --- the worker ------------------------------------------------------------------------------


class Worker:
    def __init__(self, out: Path, until: float, hang_seconds: float) -> None:
        self.out = out
        self.until = until
        self.hang_seconds = hang_seconds
        self.counts: collections.Counter[str] = collections.Counter()
        self.last_failure: dict[str, Any] | None = None
        self.slowest = (0.0, "")
        self.progress = out / f"progress-{os.getpid()}.json"
        self.saved_at = 0.0
        self.long_run = _long_run()
        # Findings already recorded (by this worker or an earlier one): met again,
        # they are counted but not raised, so one frequent defect cannot end every
        # round early and hide the rest.
        self.known = {_signature(json.loads(p.read_text())) for p in out.glob("findings/*.json")}

    def save(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.saved_at < 1:
            return
        self.saved_at = now
        staged = self.progress.with_suffix(".tmp")
        staged.write_text(
            json.dumps({"counts": self.counts, "slowest": self.slowest}, sort_keys=True)
        )
        staged.replace(self.progress)

    def before(self, target: str, description: str, data: bytes | str) -> None:
        """Leave the input where the supervisor finds it if this process dies on it."""
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        (self.out / "current.bin").write_bytes(raw)
        (self.out / "current.txt").write_text(f"{target}: {description}\n")
        faulthandler.dump_traceback_later(self.hang_seconds, exit=True)

    def after(self, target: str, started: float, description: str) -> None:
        faulthandler.cancel_dump_traceback_later()
        elapsed = time.perf_counter() - started
        if elapsed > self.slowest[0]:
            self.slowest = (elapsed, f"{target}: {description}")
        self.counts[f"inputs {target}"] += 1
        self.save()

    def failed(self, target: str, description: str, data: bytes | str, exc: BaseException) -> bool:
        """Note a failure; False if it is a finding already recorded (then only counted)."""
        if hasattr(exc, "__notes__"):
            exc.__notes__ = [n for n in exc.__notes__ if not n.startswith("Failing test case")]
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in frames if "/warmenv/" in f.filename] or frames
        where = f"{ours[-1].filename}:{ours[-1].lineno} in {ours[-1].name}" if ours else "?"
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        failure = {
            "target": target,
            "input": description,
            "data": raw.hex(),
            "exception": type(exc).__name__,
            "message": str(exc)[:2000],
            "notes": list(getattr(exc, "__notes__", [])),  # hypothesis adds to it later
            "where": where,
            "traceback": "".join(traceback.format_exception(exc))[-6000:],
        }
        signature = _signature(failure)
        if signature in self.known:
            self.counts[f"known finding met again: {' '.join(signature)}"] += 1
            self.after(target, time.perf_counter(), description)
            return False
        self.last_failure = failure  # hypothesis replays the smallest failing input last
        return True

    def record_finding(self) -> None:
        finding = self.last_failure
        if finding is None:
            return
        findings = self.out / "findings"
        findings.mkdir(exist_ok=True)
        name = f"{os.getpid()}-{time.time_ns()}"
        (findings / f"{name}.bin").write_bytes(bytes.fromhex(finding["data"]))
        finding = {**finding, "file": str(findings / f"{name}.bin")}
        del finding["data"]
        (findings / f"{name}.json").write_text(json.dumps(finding, indent=2))
        self.known.add(_signature(finding))
        self.last_failure = None

    def run(self) -> None:

        from fuzz import seed_bundles

        seed_bundles()
        workdir = Path(tempfile.mkdtemp(prefix="warmenv-fuzz-"))
        try:
            self._rounds(workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        self.save(force=True)

    def _rounds(self, workdir: Path) -> None:
        import anyio.from_thread

        round_number = 0
        while time.time() < self.until:
            backend, options = BACKENDS[round_number % len(BACKENDS)]
            round_number += 1
            with anyio.from_thread.start_blocking_portal(backend, options) as portal:
                label = backend + ("+uvloop" if options else "")
                self._round("bundle", self._bundles(portal, workdir, label))
            self._round("manifest", self._manifests())

    def _bundles(self, portal: Any, workdir: Path, label: str) -> Any:
        from hypothesis import given, settings

        from fuzz import Case, bundle_cases, exercise_bundle

        @settings(self.long_run, max_examples=BUNDLES_PER_ROUND)
        @given(case=bundle_cases())
        def bundles(case: Case) -> None:
            description = f"[{label}] {case.describe()}"
            self.before("bundle", description, case.data)
            started = time.perf_counter()
            try:
                outcomes = portal.call(exercise_bundle, case, workdir)
            except BaseException as exc:
                faulthandler.cancel_dump_traceback_later()
                if self.failed("bundle", description, case.data, exc):
                    raise
                return
            self.after("bundle", started, description)
            self.counts[f"{case.kind} inputs"] += 1
            for stage, outcome in outcomes.items():
                self.counts[f"{case.kind} {stage}: {outcome}"] += 1

        return bundles

    def _manifests(self) -> Any:
        from hypothesis import given, settings

        from fuzz import exercise_manifest, manifest_inputs

        @settings(self.long_run, max_examples=MANIFESTS_PER_ROUND)
        @given(data=manifest_inputs)
        def manifests(data: bytes | str) -> None:
            description = f"{data[:120]!r} ({len(data)} long)"
            self.before("manifest", description, data)
            started = time.perf_counter()
            try:
                outcome = exercise_manifest(data)
            except BaseException as exc:
                faulthandler.cancel_dump_traceback_later()
                if self.failed("manifest", description, data, exc):
                    raise
                return
            self.after("manifest", started, description)
            self.counts[f"manifest: {outcome}"] += 1

        return manifests

    def _round(self, target: str, test: Any) -> None:
        started = time.perf_counter()
        try:
            test()
        except Exception as exc:
            if self.last_failure is None:  # hypothesis itself gave up: the harness is wrong
                self.counts[f"harness error: {type(exc).__name__}"] += 1
                traceback.print_exc()
            self.record_finding()
        self.counts[f"seconds {target}"] += round(time.perf_counter() - started)
        self.save(force=True)


def _signature(finding: dict[str, Any]) -> tuple[str, str, str]:
    """What tells two findings apart: the exception, where it was raised, and the stage."""
    stage = next((n for n in finding.get("notes", []) if n.startswith("fuzz stage")), "")
    return (finding["exception"], finding["where"], stage)


# --- the supervisor ------------------------------------------------------------------------------


def supervise(minutes: float, out: Path, hang_seconds: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("progress-*.json"), *out.glob("findings/*"), *out.glob("*.log")]:
        stale.unlink()
    started = time.time()
    until = started + minutes * 60
    crashes: list[dict[str, Any]] = []
    workers = 0
    while time.time() < until - 1:
        workers += 1
        log = out / f"worker-{workers}.log"
        with open(log, "w") as stderr:
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    "--until",
                    str(until),
                    "--out",
                    str(out),
                    "--hang-seconds",
                    str(hang_seconds),
                ],
                stderr=stderr,
                check=False,
            )
        if done.returncode != 0:
            crashes.append(_crash(out, done.returncode, log, hang_seconds))
    return report(out, time.time() - started, crashes, workers)


def _crash(out: Path, returncode: int, log: Path, hang_seconds: float) -> dict[str, Any]:
    """The input a worker died on (it wrote it down before running it)."""
    findings = out / "findings"
    findings.mkdir(exist_ok=True)
    name = f"crash-{time.time_ns()}"
    current = out / "current.bin"
    kept = findings / f"{name}.bin"
    if current.exists():
        current.replace(kept)
    text = log.read_text()
    hang = "Timeout (" in text
    how = (
        f"hung for over {hang_seconds:.0f} s"
        if hang
        else f"killed by {signal.Signals(-returncode).name}"
        if returncode < 0
        else f"exited {returncode}"
    )
    current_txt = out / "current.txt"
    crash = {
        "target": current_txt.read_text().split(":")[0] if current_txt.exists() else "?",
        "input": current_txt.read_text().strip() if current_txt.exists() else "?",
        "exception": "hang" if hang else "crash",
        "message": how,
        "where": text.strip().splitlines()[-1] if text.strip() else "?",
        "traceback": text[-6000:],
        "file": str(kept),
    }
    (findings / f"{name}.json").write_text(json.dumps(crash, indent=2))
    return crash


def report(out: Path, seconds: float, crashes: list[dict[str, Any]], workers: int) -> int:
    counts: collections.Counter[str] = collections.Counter()
    slowest = (0.0, "")
    for progress in out.glob("progress-*.json"):
        seen = json.loads(progress.read_text())
        counts.update(seen["counts"])
        slowest = max(slowest, tuple(seen["slowest"]))
    findings = [json.loads(p.read_text()) for p in sorted(out.glob("findings/*.json"))]
    distinct: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for finding in findings:
        distinct.setdefault(_signature(finding), []).append(finding)
    inputs = counts["inputs bundle"] + counts["inputs manifest"]
    lines = [
        f"fuzz run: {seconds / 60:.1f} min, {inputs:,} inputs "
        f"({counts['inputs bundle']:,} bundles, {counts['inputs manifest']:,} manifests), "
        f"{workers} worker process(es), {len(findings)} finding(s), {len(distinct)} distinct",
        f"slowest input: {slowest[0]:.2f} s ({slowest[1][:150]})",
        "outcomes:",
    ]
    lines += [
        f"  {name}: {n:,}" for name, n in sorted(counts.items()) if not name.startswith("inputs")
    ]
    for (exception, where, stage), group in distinct.items():
        first = group[0]
        lines += [
            f"FINDING x{len(group)}: {exception} at {where} {stage}",
            f"  message: {first['message'][:300]}",
            f"  input: {first['input'][:400]}",
            f"  bytes: {first['file']}",
        ]
    summary = {
        "seconds": round(seconds),
        "inputs": inputs,
        "counts": counts,
        "slowest": slowest,
        "findings": findings,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    print("\n".join(lines))
    print(f"summary: {out / 'summary.json'}")
    return 1 if findings else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path(".fuzz"))
    parser.add_argument("--hang-seconds", type=float, default=30.0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        # Hypothesis warns whenever it shows a large input; the finding keeps the input.
        warnings.filterwarnings("ignore", message="Generating overly large repr")
        # A runaway allocation becomes a MemoryError (a finding), not the OOM killer.
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        Worker(args.out, args.until, args.hang_seconds).run()
        return
    sys.exit(supervise(args.minutes, args.out, args.hang_seconds))


if __name__ == "__main__":
    main()
