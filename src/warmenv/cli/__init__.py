# PYTHON_ARGCOMPLETE_OK (shell completion: see `complete` below and docs/cli.md)
"""The `warmenv` command: inspect, move and manage warm environments.

Each sub-command lives in its own module, which registers it on the parser
(`register`) and runs it (`run`); `_COMMANDS` below is the one list of them.
This module parses, runs the command under the signal handling below, and
hands every way it ends to `_errors.conclude`, which turns it into one line
and an exit status: 0 done, 1 failed, 2 bad usage, 128 + the signal when
stopped (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP). No exception reaches the
user as a traceback unless `--debug` asks for it. The rooms the commands
share: `_errors`, `_options`, `_environments`, `_output` (with `_progress`,
rich's bar), `_format`.

Signals are turned into cancellation of the running command, on asyncio and
trio alike, so SIGTERM from a service manager cleans up exactly as Ctrl-C
does (an export's staging file removed, an import's batches whole). A
command that cannot stop (a thread blocked on a file that never answers) is
given a few seconds; a second signal, or the end of that grace, exits at
once. rich is imported only when installed (the `cli` extra: `pip install -e
'.[cli]'` in warmenv's clone); without it the command prints plain lines.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from warmenv import _interrupt
from warmenv._url import is_url, redact
from warmenv._version import __version__
from warmenv.cli import (
    check,
    demo,
    explain,
    export,
    gc,
    imports,
    inspect,
    keygen,
    ls,
    purge,
    run,
    stats,
    vacuum,
    verify,
)
from warmenv.cli._environments import misnamed, misplaced
from warmenv.cli._errors import Stopped, UsageError, conclude, usage_line
from warmenv.cli._options import ArgumentParser, shared_defaults, shared_options
from warmenv.cli._output import Output
from warmenv.cli._suggest import (
    Options,
    no_command,
    option_before_command,
    options_of,
    stray_version,
    unknown_option,
)

__all__ = ["main"]

# The sub-commands, in the order `--help` lists them. Adding one: its module
# (with `register` and `run`, and `UNUSED_OPTIONS` if it reads no environment), its name
# in the import above, its line here, and its section in docs/cli.md (a test compares).
_COMMANDS = (
    demo,
    ls,
    stats,
    explain,
    export,
    imports,
    inspect,
    verify,
    check,
    purge,
    gc,
    vacuum,
    run,
    keygen,
)

# How long a stopped command may take to clean up before the process exits anyway.
GRACE_SECONDS = 5.0

_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)

# WARMENV_CLI_BACKEND picks the event loop the command runs on (the tests run
# every command on each); asyncio is the default.
_BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="warmenv",
        description="Keep expensive start-up results warm, and ship them between machines.",
        # Accepted before the sub-command too (`warmenv --json ls`), as a user writes them.
        parents=[shared_options()],
    )
    parser.add_argument("--version", action="version", version=f"warmenv {__version__}")
    commands = parser.add_subparsers(
        dest="subcommand", metavar="COMMAND", required=True, help="what to do (see COMMAND --help)"
    )
    for command in _COMMANDS:
        # A command's UNUSED_OPTIONS are shared options it accepts (or refuses with its
        # reason) without using them; its --help does not list them.
        unused = getattr(command, "UNUSED_OPTIONS", ())
        command.register(commands, shared_options(hidden=unused))
        # Read by `misplaced` to know whether a stray name could be meant as --env.
        list(commands.choices.values())[-1].set_defaults(takes_env="--env" not in unused)
    # Read by the hints (`_suggest`) to tell what an argument argparse refused was meant as.
    options: dict[str, Options] = {name: options_of(p) for name, p in commands.choices.items()}
    parser.set_defaults(command_names=tuple(commands.choices), command_options=options)
    return parser


def _subject(args: argparse.Namespace) -> object:
    """What the command works on, fit to print: a URL redacted."""
    subject = getattr(args, "out", None) or getattr(args, "bundle", None)
    return redact(subject) if isinstance(subject, str) and is_url(subject) else subject


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    _interrupt.release()  # from here a Ctrl-C is this function's to say (`conclude`)
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Known before parsing, so that a usage error is JSON too when asked for; what
    # follows `--` is not ours (`warmenv run -- tool --json`).
    ours = arguments[: arguments.index("--")] if "--" in arguments else arguments
    out = Output(json="--json" in ours, quiet=bool({"--quiet", "-q"} & set(ours)))
    debug = "--debug" in ours
    args: argparse.Namespace | None = None
    with out.routing(), _signals_before_the_loop():
        try:
            args = _parse(arguments)
            out.subcommand = args.subcommand
            out.subject = _subject(args)
            out.misnamed = partial(misnamed, args)
            backend, options = _backend()
            _late_signals.clear()
            sigint = signal.getsignal(signal.SIGINT)
            try:
                status = int(
                    anyio.run(_supervised, args, out, backend=backend, backend_options=options)
                )
            finally:
                if threading.current_thread() is threading.main_thread() and sigint is not None:
                    signal.signal(signal.SIGINT, sigint)  # Ctrl-C raises again for our caller
        except SystemExit:  # --help, --version
            raise
        except BaseException as exc:  # every way out becomes one line and a status
            return conclude(out, exc, debug)
        late = list(_late_signals)
        if late and status == 0:
            # Asked to stop once the work had completed: the status says so, the
            # line says what was done.
            out.when_interrupted = out.when_completed
            return conclude(out, Stopped(late[0]), debug)
        try:
            out.finish()  # the result, once nothing can end the command another way
        except BaseException as exc:  # stdout closed (`warmenv ls --json | true`)
            return conclude(out, exc, debug)
        return status


_late_signals: list[int] = []


def _record_late_signals() -> None:
    """From now on a stop signal is only recorded (in `_late_signals`), not acted on."""
    if threading.current_thread() is threading.main_thread():
        for signum in _STOP_SIGNALS:
            signal.signal(signum, _recorder(_late_signals))


def _recorder(arrived: list[int]) -> Callable[[int, object], None]:
    def record(signum: int, frame: object) -> None:
        arrived.append(signum)

    return record


def _parse(arguments: list[str]) -> argparse.Namespace:
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions, not for a run
        complete(parser)
    arguments = _help_command(arguments)
    commands: dict[str, Options] = parser.get_default("command_options")
    shared = shared_options()
    parser.hint = partial(_meant, arguments, shared, commands)
    args, extra = parser.parse_known_args(arguments)
    if extra:
        # argparse takes OUT and SOURCE... in one go, so sources written after the
        # options (`export OUT --name N SOURCE`) come back unrecognised: they are
        # sources all the same.
        if getattr(args, "sources", None) is None or any(a.startswith("-") for a in extra):
            # Said by the sub-command's parser: its name and its --help, not warmenv's.
            options = commands[args.subcommand]
            hint = (
                option_before_command(arguments, shared, commands)
                or unknown_option(extra, options)
                or misplaced(shared_defaults(args), extra)
                or stray_version([a for a in extra if not a.startswith("-")], options)
            )
            raise UsageError(
                usage_line(
                    f"{parser.prog} {args.subcommand}",
                    f"unrecognized arguments: {' '.join(extra)}" + (f"; {hint}" if hint else ""),
                ),
                located=True,
            )
        args.sources = [*args.sources, *(Path(a) for a in extra)]
    return shared_defaults(args)


def _meant(
    arguments: list[str],
    shared: argparse.ArgumentParser,
    commands: dict[str, Options],
    message: str,
) -> str | None:
    """What the command line argparse refused with `message` was meant to say, if known."""
    return no_command(message, commands) or option_before_command(arguments, shared, commands)


# The shared options that take no value, which may come before `help`.
_FLAGS = frozenset({"--json", "--debug", "--quiet", "-q"})


def _help_command(arguments: list[str]) -> list[str]:
    """`warmenv help [COMMAND]`, as git and pip take it, is `warmenv [COMMAND] --help`."""
    rest = list(itertools.dropwhile(_FLAGS.__contains__, arguments))
    if rest[:1] != ["help"]:
        return arguments
    return [*rest[1:2], "--help"]


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request (argcomplete's protocol) and exit.

    The shell function that `register-python-argcomplete warmenv` defines
    runs `warmenv` with `_ARGCOMPLETE` and the command line in the
    environment; argcomplete writes the completions to file descriptor 8 and
    ends the process. argcomplete is imported only then, so it costs a
    normal run nothing, and without it (no `cli` extra) nothing is completed.
    """
    try:
        import argcomplete
    except ImportError:
        os._exit(1)  # the shell falls back to its default completion
    argcomplete.autocomplete(parser)


def _backend() -> tuple[str, dict[str, Any]]:
    name = os.environ.get("WARMENV_CLI_BACKEND", "asyncio")
    if name not in _BACKENDS:
        raise UsageError(  # about the environment, not the sub-command
            f"WARMENV_CLI_BACKEND={name!r} is not one of {', '.join(_BACKENDS)}; unset it",
            located=True,
        )
    if name != "asyncio":
        try:
            importlib.import_module(name)  # trio, uvloop: optional, as anyio sees them
        except ImportError:
            raise UsageError(
                f"WARMENV_CLI_BACKEND={name!r} needs {name}, which is not installed; "
                f"install it (pip install {name}) or unset the variable",
                located=True,
            ) from None
    return _BACKENDS[name]


async def _supervised(args: argparse.Namespace, out: Output) -> int:
    """Run the command; the first stop signal cancels it, as Ctrl-C would."""
    if threading.current_thread() is not threading.main_thread() or not getattr(
        args, "supervised", True
    ):
        # Signal handlers belong to the main thread; called from any other,
        # the command runs without them (stopping it is the caller's business).
        # `run` handles its own (it passes them on to its child).
        return int(await args.run(args, out))
    stopped = out.stopped
    deadline: list[threading.Timer] = []
    failure: list[BaseException] = []
    status = 1
    work = anyio.CancelScope()
    try:
        with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch, signals, work, stopped, deadline, out)
                with work:
                    try:
                        status = await args.run(args, out)
                    except anyio.get_cancelled_exc_class():
                        raise
                    except BaseException as exc:  # raised once the watcher is stopped
                        failure.append(exc)
                tg.cancel_scope.cancel()
    finally:
        # The work is over and the receiver gone. A stop signal from here on is
        # recorded for main() to judge: the loop's teardown would otherwise meet
        # it with the default action (asyncio resets the handler, and any
        # thread may take the signal) or an exception amid trio's own cleanup.
        _record_late_signals()
        for timer in deadline:  # it stopped in time: no forced exit later
            timer.cancel()
    if stopped and (work.cancelled_caught or failure):
        raise Stopped(stopped[0])
    if stopped:
        # The signal came while the last step (not interruptible: publishing
        # the bundle, committing a batch) ran, and the command completed. It
        # was asked to stop all the same: the status says so, the line says
        # what was done.
        out.when_interrupted = out.when_completed
        raise Stopped(stopped[0])
    if failure:
        raise failure[0]
    return int(status)


async def _watch(
    signals: Any,
    work: anyio.CancelScope,
    stopped: list[int],
    deadline: list[threading.Timer],
    out: Output,
) -> None:
    async for signum in signals:
        if stopped:  # a second signal: the user means now
            _exit_now(stopped[0], out, "stopped again")
        stopped.append(signum)
        work.cancel()
        timer = threading.Timer(
            GRACE_SECONDS,
            _exit_now,
            (signum, out, f"it did not stop within {GRACE_SECONDS:g}s"),
        )
        timer.daemon = True
        timer.start()
        deadline.append(timer)


def _exit_now(signum: int, out: Output, why: str) -> None:
    """End the process without waiting for anything (a thread blocked on a file, say)."""
    stop = Stopped(signum)
    out.fail(forced_line(stop, why, out.when_interrupted), stop.status)
    _flush()
    os._exit(stop.status)


def forced_line(stop: Stopped, why: str, when_interrupted: str) -> str:
    """The line of a command ended at once (a second signal, or the grace spent): what
    it left, as a stop that cleaned up says it (`conclude`). What each command says then
    holds without its clean-up too: an export's OUT is as it was (its staging file is
    removed by the next export), an import's batches and a gc or purge are whole."""
    line = f"{stop.why}; {why}, so it exits at once without cleaning up"
    return f"{line}; {when_interrupted}" if when_interrupted else line


@contextmanager
def _signals_before_the_loop() -> Iterator[None]:
    """SIGTERM and SIGHUP before (or after) the event loop runs: stop like Ctrl-C."""

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    previous = {}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    for signum in _STOP_SIGNALS:
        if signum != signal.SIGINT:  # Python's own handler raises KeyboardInterrupt
            previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def entry_point() -> None:  # pragma: no cover - the console script
    # After main() the status is chosen: a stop signal arriving while the
    # process exits must not replace it with a kill by the default action.
    for signum in _STOP_SIGNALS:
        if signum != signal.SIGINT:
            signal.signal(signum, signal.SIG_IGN)
    status = main()
    _flush()
    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() for t in threading.enumerate()):
        # A thread is still blocked (reading an abandoned prompt, or a file
        # that never answers): the interpreter would wait for it at exit, or
        # abort on the lock it holds, and the user would not want either.
        os._exit(status)
    sys.exit(status)
