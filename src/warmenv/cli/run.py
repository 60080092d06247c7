"""`warmenv run --cache TOOL ... -- COMMAND`: run a process with its compilers' caches warm.

Before COMMAND starts, each tool's cache captured under this machine's facts
is restored from the environment into the tool's cache directory
(`--cache-dir DIR/<tool>`, else the directory the tool's own variable names,
else the environment's own `<root>/<environment>.caches/<tool>`, which no
other environment's run captures); COMMAND runs with each tool pointed there and
its trap fixed (environment variables: each tool module's `settings`); when
it ends, the directories are captured back, so a CI warm-up job is
`warmenv run ... -- python warm.py && warmenv export ...` and a pod's
entrypoint `warmenv import URL && warmenv run ... -- serve`.

While COMMAND runs, warmenv is a transparent parent: the signals it
receives (SIGTERM, SIGHUP, SIGUSR1, ...) are passed on to COMMAND and its
exit status is warmenv's (128 + N if a signal N ended it). SIGINT and
SIGQUIT typed at a terminal reach COMMAND from the terminal itself (it is
in the same foreground process group), so warmenv passes those on only
when they were not (sent with `kill`). A COMMAND ended by a signal is not
captured: a compiler stopped mid-write (JAX writes its files in place) may
have left a half-written file, which must not travel to other machines.
Before and after COMMAND, a stop signal stops warmenv as for any command.

With `--json` warmenv's standard output is its JSON document alone, as for
every command, so COMMAND's standard output (and that of whatever it
starts) is sent to warmenv's standard error: a script parses the one,
the user still reads the other.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import attrs

from warmenv._fs import expand_home
from warmenv._text import plural
from warmenv.caches._children import COUNTS_VARIABLE, new_counts, read_counts
from warmenv.caches._home import tool_cache_dir
from warmenv.caches._hookdir import HookHome
from warmenv.caches._tools import Tool, available_tools, counting, tool
from warmenv.cli._environments import environment
from warmenv.cli._errors import Failure, Stopped, UsageError, describe_error
from warmenv.cli._output import Output
from warmenv.cli._suggest import did_you_mean

_FORWARDED = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH")
    if hasattr(signal, name)
)
_TYPED_AT_A_TERMINAL = frozenset(
    getattr(signal, name) for name in ("SIGINT", "SIGQUIT") if hasattr(signal, name)
)
_STDERR = 2  # the file descriptor, as a child inherits it
_STOPPING = frozenset(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "run",
        parents=[parent],
        help="run a command with its compilers' caches restored before and captured after",
        description="Restore each --cache tool's compiler cache from the environment, run "
        "COMMAND with the tool pointed at it (its cache-miss trap fixed), then capture the "
        "cache back. Signals are passed on to COMMAND; the exit status is COMMAND's. With "
        "--json, standard output holds warmenv's JSON document alone: COMMAND's standard "
        "output goes to standard error. "
        f"Tools: {', '.join(available_tools())}.",
    )
    parser.add_argument(
        "--cache",
        dest="caches",
        action="append",
        required=True,
        metavar="TOOL",
        help="a compiler whose cache to restore and capture (repeatable)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where the caches live, one directory per tool (default: the directory the "
        "tool's own variable names, else the environment's own <root>/<env>.caches/<tool>)",
    )
    parser.add_argument(
        "--no-capture",
        action="store_true",
        help="restore only; leave the environment as it was after COMMAND",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run"
    )
    parser.set_defaults(run=run, supervised=False)


@attrs.define
class _Phase:
    """What a signal does now: cancel warmenv's own work, or go to the child."""

    scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)
    child: Any = None
    stopped: list[int] = attrs.Factory(list)
    forwarded: list[int] = attrs.Factory(list)


async def run(args: argparse.Namespace, out: Output) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError(
            "name the command to run after '--', e.g. warmenv run --cache jax -- python train.py"
        )
    await anyio.to_thread.run_sync(_runnable, command[0])
    try:
        tools = [tool(name) for name in dict.fromkeys(args.caches)]
    except LookupError as error:
        unknown = next(n for n in args.caches if n not in available_tools())
        close = did_you_mean(unknown, available_tools())
        raise UsageError(f"{error}" + (f"; {close}" if close else "")) from None
    for t in tools:
        missing = t.missing()
        if missing is not None:
            raise Failure(missing)
    phase = _Phase()
    with anyio.open_signal_receiver(*_FORWARDED) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_route, signals, phase)
            status = await _restore_run_capture(args, out, tools, command, phase)
            tg.cancel_scope.cancel()
    return status


async def _restore_run_capture(
    args: argparse.Namespace, out: Output, tools: list[Tool], command: list[str], phase: _Phase
) -> int:
    document: dict[str, Any] = {"command": command, "tools": {}}
    with phase.scope:
        async with environment(args, out, create=True, write=not args.no_capture) as env:
            directories = {t.name: _cache_dir(t, env.path, args.cache_dir) for t in tools}
            for t in tools:
                report = await t.restore(env, directories[t.name])
                _said(out, f"{t.name}: {report}")
                document["tools"][t.name] = {
                    "cache_dir": str(directories[t.name]),
                    "restored": _as_json(report),
                }
    _raise_if_stopped(phase)

    variables = dict(os.environ)
    for t in tools:
        variables.update(t.settings(directories[t.name]))
    # The hooks' home is held while the command, or what it starts, may import from it.
    with tempfile.TemporaryDirectory(prefix="warmenv-run-") as scratch, HookHome() as home:
        counts = Path(scratch) / "counts.jsonl"
        new_counts(counts)
        variables[COUNTS_VARIABLE] = str(counts)
        # The hooks that count the command's hits (caches/_children.py).
        hooks = await anyio.to_thread.run_sync(counting, tools, variables, home)
        if hooks.unable is not None:
            document["uncounted"] = describe_error(hooks.unable)  # no hits or misses follow
            out.warning(f"the command's cache hits are not counted: {document['uncounted']}")
        variables.update(hooks.variables)
        returncode = await _child(command, variables, phase, json=out.json, keep=home.held)
        counted = await anyio.to_thread.run_sync(read_counts, counts)
    for t in tools:
        found = counted.get(t.name)
        if found is not None:
            document["tools"][t.name].update(hits=found.hits, misses=found.misses)
            hits = plural(found.hits, "cache hit")
            counters = f"{hits}, {plural(found.misses, 'miss', 'misses')} (its own counters)"
            _said(out, f"{t.name}: {counters}")
            for note in t.notes(variables, found.uncached):
                _said(out, f"{t.name}: {note}")
    status = returncode if returncode >= 0 else 128 - returncode
    document["exit"] = status
    if returncode < 0:
        _said(
            out,
            f"not captured: the command was ended by {signal.Signals(-returncode).name}, and a "
            "compiler stopped mid-write may have left a half-written file",
        )
    elif not args.no_capture:
        phase.scope = anyio.CancelScope()
        with phase.scope:
            async with environment(args, out, create=True, write=True) as env:
                for t in tools:
                    captured = await t.capture(env, directories[t.name])
                    _said(out, f"{t.name}: {captured}")
                    if t.name in counted:
                        found = counted[t.name]
                        await t.record_served(env, found.served, found.misses)
                    document["tools"][t.name]["captured"] = _as_json(captured)
        _raise_if_stopped(phase)
    out.result(document)
    return status


def _runnable(program: str) -> None:
    """Refuse COMMAND as a shell would, before anything is restored: a `Failure` of exit
    status 127 where it is not found (not on PATH, no such file), 126 where it is there
    but cannot be run (a directory, no execute permission)."""
    if os.sep not in program:
        if shutil.which(program) is None:
            raise Failure(f"command not found: {program!r} (not on PATH)", status=127)
        return
    if not os.path.exists(program):
        raise Failure(f"command not found: {program!r} (no such file)", status=127)
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        raise _cannot_run(program, "a directory" if os.path.isdir(program) else "not executable")


def _cannot_run(program: str, why: str | None) -> Failure:
    return Failure(f"command cannot be run: {program!r} ({why})", status=126)


async def _child(
    command: list[str],
    variables: dict[str, str],
    phase: _Phase,
    *,
    json: bool,
    keep: tuple[int, ...],
) -> int:
    """Run COMMAND to its end; its exit status (-N if signal N ended it).

    With `--json` its standard output is our standard error (file descriptor
    2, inherited by whatever it starts): our standard output is the one
    document a script parses, and the command's lines still reach the user.
    `keep`: descriptors it inherits (the hooks' lock: held while it lives).
    """
    try:
        process = await anyio.open_process(
            command,
            stdin=None,
            stdout=_STDERR if json else None,
            stderr=None,
            env=variables,
            pass_fds=keep,
        )
    except FileNotFoundError:  # gone since `_runnable` looked
        raise Failure(f"command not found: {command[0]!r}", status=127) from None
    except OSError as exc:  # permission denied, an exec format error
        raise _cannot_run(command[0], exc.strerror) from None
    phase.child = process
    try:
        with anyio.CancelScope(shield=True):  # the child decides when it ends
            returncode = await process.wait()
    finally:
        phase.child = None
    return int(returncode)


async def _route(signals: Any, phase: _Phase) -> None:
    async for signum in signals:
        child = phase.child
        if child is not None:
            if signum in _TYPED_AT_A_TERMINAL and _in_the_foreground():
                continue  # the terminal sent it to the child too
            phase.forwarded.append(signum)
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
        elif signum in _STOPPING:
            phase.stopped.append(signum)
            phase.scope.cancel()


def _in_the_foreground() -> bool:
    """Whether this process's group is its terminal's foreground group (so shares its keys)."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            continue
    return False


def _raise_if_stopped(phase: _Phase) -> None:
    if phase.stopped:
        raise Stopped(phase.stopped[0])


def _cache_dir(t: Tool, database: Path, given: Path | None) -> Path:
    """`t`'s directory: under `--cache-dir`, else the tool's own variable's, else the
    environment's own (the environment whose database file is `database`)."""
    if given is not None:
        return given / t.name
    named = os.environ.get(t.cache_dir_variable)
    if named:
        return expand_home(named)
    return tool_cache_dir(database, t.name)


def _said(out: Output, text: str) -> None:
    if not (out.json or out.quiet):
        print(f"warmenv: {text}", file=sys.stderr, flush=True)


def _as_json(report: Any) -> dict[str, Any]:
    def value(_: Any, __: Any, found: Any) -> Any:
        return str(found) if isinstance(found, Path) else found

    document: dict[str, Any] = attrs.asdict(report, recurse=True, value_serializer=value)
    return document
