"""Helpers for tests that need real OS processes, and the reliability report's rows."""

from __future__ import annotations

import atexit
import functools
import importlib.metadata
import inspect
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs


@functools.cache
def _interpreter_for(user: str | None) -> str:
    """An interpreter `user` may execute: ours, or the system one of the same version."""
    if user is None:
        return sys.executable
    try:
        probe = subprocess.run([sys.executable, "-c", "pass"], user=user, capture_output=True)
    except PermissionError:
        pass  # our interpreter lives where `user` may not go (pyenv under /root)
    else:
        if probe.returncode == 0:
            return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    if system is None:
        raise RuntimeError(
            f"no {version} that the user {user!r} may execute; install one (apt-get install "
            f"{version}) so permission tests can run"
        )
    return system


def unprivileged_user() -> str | None:
    """The user permission tests run as: `nobody` under root (where chmod does not bind)."""
    return "nobody" if os.geteuid() == 0 else None


def run_python(
    code: str, *args: str, user: str | None = None, timeout: float = 120, cwd: str = "/"
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (as `user`, in `cwd`), seeing the same packages as we do.

    A child running as another `user` cannot be trusted to read our checkout
    or our virtualenv: a clone inside a directory only its owner may enter
    (root's home, mode 0700) hides both `src/` and the nox virtualenv's
    site-packages from `nobody`. So such a child imports from a world-readable
    copy instead: `staged_path()` copies the checkout's directories on our
    `sys.path` (`src/`, `tests/`) and, from site-packages, the distributions a
    child imports (warmenv with its `cli` extra, trio and uvloop, and what they
    require) into a temporary directory once per test session, reused by every
    later child and removed when the session ends. Our own interpreter's
    standard library is never passed on: the child runs its own.
    """
    env = dict(os.environ)
    if user is None:
        path = [p for p in sys.path if p and os.path.isdir(p)]
    else:
        path = [str(p) for p in staged_path(tuple(sys.path))]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [_interpreter_for(user), "-c", code, *args],
        user=user,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def json_lines(completed: subprocess.CompletedProcess[str]) -> list[object]:
    assert completed.returncode == 0, completed.stderr
    return [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]


CLONE = Path(__file__).resolve().parent.parent
"""The clone under test; installed editable from it (`pip install -e .`), as CONTRIBUTING says."""


# --- a world-readable copy of what a child running as another user imports -------------

# The distributions (with extras) whose code children import; their
# requirements are followed, so anyio, attrs, platformdirs, sniffio, outcome,
# idna, sortedcontainers, rich and the rest come along.
CHILD_DISTRIBUTIONS = ("warmenv[cli]", "trio", "uvloop")

_staging_lock = threading.Lock()


def staged_path(search_path: tuple[str, ...]) -> list[Path]:
    """A world-readable copy of `search_path` (see `run_python`), made once per session."""
    with _staging_lock:  # tests start children from several threads at once
        return _stage(search_path)


@functools.cache
def _stage(search_path: tuple[str, ...]) -> list[Path]:
    stage = Path(tempfile.mkdtemp(prefix="warmenv-child-path-"))
    atexit.register(shutil.rmtree, stage, ignore_errors=True)
    for parent in stage.parents:
        if not os.stat(parent).st_mode & 0o001:
            raise RuntimeError(
                f"{parent} is closed to other users, so a child running as another user "
                f"cannot import from {stage}; point TMPDIR at a directory everyone may enter"
            )
    user_site = [site.USER_SITE] if site.USER_SITE else []
    site_dirs = {os.path.realpath(p) for p in [*site.getsitepackages(), *user_site]}
    interpreter = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)} | {
        os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")
    }
    staged: list[Path] = []
    for number, entry in enumerate(search_path):
        if not entry or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        target = stage / f"{number}-{os.path.basename(real)}"
        if real in site_dirs:
            _copy_distributions(Path(real), target)
        elif any(real == p or real.startswith(p + os.sep) for p in interpreter):
            continue  # the standard library, or the virtualenv's bin/
        elif stage.resolve().is_relative_to(real):
            # A search path naming the temporary directory (or above it) holds the stage
            # itself: a copy of it would copy the copy, as deep as paths go (57 GB seen).
            continue
        else:
            shutil.copytree(real, target, ignore=_not_code)
        staged.append(target)
    _open_to_everyone(stage)
    return staged


def _not_code(directory: str, names: list[str]) -> list[str]:
    """What a copy of a checkout directory leaves out: caches, dot-directories, virtualenvs."""
    return [
        name
        for name in names
        if name.startswith(".")
        or name == "__pycache__"
        or os.path.exists(os.path.join(directory, name, "pyvenv.cfg"))
    ]


def _copy_distributions(site_packages: Path, target: Path) -> None:
    target.mkdir()
    for dist in _required(CHILD_DISTRIBUTIONS):
        if Path(str(dist.locate_file(""))).resolve() != site_packages.resolve():
            continue  # installed in another site directory; copied with that one
        if dist.files is None:
            raise RuntimeError(f"{dist.metadata['Name']} lists no files; reinstall it with pip")
        tops = {f.parts[0] for f in dist.files if f.parts and f.parts[0] != ".."}
        for top in sorted(tops):
            source = site_packages / top
            if top.endswith(".pth") or top == "__pycache__" or not source.exists():
                continue  # a .pth file only works in a site directory, not on PYTHONPATH
            if source.is_dir():
                shutil.copytree(source, target / top, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target / top)


def _required(roots: Iterable[str]) -> Iterator[importlib.metadata.Distribution]:
    """The installed distributions named by `roots` and everything they require."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    pending = [Requirement(root) for root in roots]
    while pending:
        requirement = pending.pop()
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        key = f"{name}{sorted(requirement.extras)}"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # optional on this platform (uvloop on Windows)
        yield dist
        for line in dist.requires or []:
            needed = Requirement(line)
            extras = requirement.extras or {""}
            if needed.marker is None or any(needed.marker.evaluate({"extra": e}) for e in extras):
                pending.append(needed)


def _open_to_everyone(root: Path) -> None:
    """Files readable and directories enterable by any user, whatever the umask was."""
    for directory, _, files in os.walk(root):
        os.chmod(directory, os.stat(directory).st_mode | 0o555)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444)


# --- the reliability report ---------------------------------------------------------------


@attrs.define
class Trials:
    """Trials of one reliability scenario, counted as they run.

    Nothing about a row is assumed: `trials` is how many `trial()` blocks
    were entered and `failures` how many of them raised, with the first
    failure's message kept for the report.
    """

    scenario: str
    checked: str
    trials: int = 0
    failures: int = 0
    failure: str | None = None

    @contextmanager
    def trial(self) -> Iterator[None]:
        """One trial: counted on entry, counted as failed if anything escapes it."""
        self.trials += 1
        try:
            yield
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
                raise
            self._fail(exc, f"trial {self.trials}")
            raise

    def _fail(self, exc: BaseException, where: str) -> None:
        self.failures += 1
        if self.failure is None:
            text = " ".join(f"{type(exc).__name__}: {exc}".split())
            self.failure = f"{where}: {text[:300]}"
        exc.add_note(f"{_COUNTED} {self.scenario!r} ({where})")

    def row(self) -> dict[str, object]:
        return attrs.asdict(self)


_COUNTED = "[reliability] counted as a failed trial of"


@contextmanager
def reliability_row(scenario: str, checked: str) -> Iterator[Trials]:
    """Count a scenario's trials; on exit, append its row to WARMENV_RELIABILITY_REPORT.

    The row is written whether the block succeeds or fails, so a failing
    trial reaches docs/reliability.md before the test fails. A failure
    outside every trial (set-up, a final check) counts as one more failed
    trial, unless a trial of another row already counted it.
    """
    trials = Trials(scenario, checked)
    try:
        yield trials
    except BaseException as exc:
        notes = getattr(exc, "__notes__", [])
        counted = any(note.startswith(_COUNTED) for note in notes)
        if not counted and not isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
            trials.trials += 1
            trials._fail(exc, "outside the trials")
        raise
    finally:
        report = os.environ.get("WARMENV_RELIABILITY_REPORT")
        if report:
            with open(report, "a") as handle:
                handle.write(json.dumps(trials.row()) + "\n")


def backend_label(anyio_backend: object) -> str:
    """The name of a test's event loop for a report row (`asyncio+uvloop` spelled out)."""
    return anyio_backend if isinstance(anyio_backend, str) else "asyncio+uvloop"


@contextmanager
def one_trial(scenario: str, checked: str) -> Iterator[Trials]:
    """A scenario whose whole block is one trial (a test run once per backend)."""
    with reliability_row(scenario, checked) as row, row.trial():
        yield row


_Test = TypeVar("_Test", bound=Callable[..., Any])


def counted(scenario: str, checked: str) -> Callable[[_Test], _Test]:
    """A test whose whole run is one trial of `scenario`, as `one_trial` around its body:
    for a regression test that is a row of docs/reliability.md as it stands."""

    def decorate(test: _Test) -> _Test:
        if inspect.iscoroutinefunction(test):

            @functools.wraps(test)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with one_trial(scenario, checked):
                    return await test(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            with one_trial(scenario, checked):
                return test(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


def mypy_strict(snippets: dict[str, str], workdir: Path) -> dict[str, list[str]]:
    """One `mypy --strict` run over `{name: code}` snippets: its output lines, per snippet.

    Run in `workdir` with no project configuration (exactly --strict) and our
    sources on MYPYPATH, as a user's own file would be checked.
    """
    for name, code in snippets.items():
        (workdir / f"{name}.py").write_text(code)
    src = Path(__file__).parent.parent / "src"
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(workdir / ".mypy-cache")]
        + [f"{name}.py" for name in snippets],
        cwd=workdir,
        env={**os.environ, "MYPYPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.stderr == "", completed.stderr
    report: dict[str, list[str]] = {name: [] for name in snippets}
    for line in completed.stdout.splitlines():
        name = line.partition(".py:")[0]
        if name in report:
            report[name].append(line)
    return report
