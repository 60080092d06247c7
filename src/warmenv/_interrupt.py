"""Ctrl-C while the `warmenv` command is still loading: one line and status 130.

The command (`warmenv`, `python -m warmenv`) imports the library, anyio and
rich before `warmenv.cli.main` runs and can turn a signal into its one line;
a Ctrl-C in that time (a few hundred milliseconds, more on a cold disk) raised
`KeyboardInterrupt` out of whichever import was running, as a traceback. This
module is the first of warmenv's to run: when, and only when, this process is
the command, it answers SIGINT by saying so in the command's words and exiting
130 at once. Nothing has been done yet, so there is nothing to clean up, and
nothing is said about the work. `release`, called as `main` starts, hands
SIGINT back to Python's handler, which `main` turns into its line as for any
stop. A program that merely imports warmenv keeps its own Ctrl-C; a SIGINT
the shell ignores (a background job) stays ignored.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType  # already loaded by the interpreter: this module stays cheap

__all__ = ["release"]

_COMMAND_MODULES = ("warmenv", "warmenv.cli")
_SCRIPT_NAMES = ("warmenv", "warmenv.exe", "warmenv-script.py")
# The interpreter's options that take their value as the next argument.
_WITH_VALUE = ("-X", "-W", "-Q")


def _guard() -> None:
    """Answer SIGINT with the command's one line and 130, if this process is the command."""
    if threading.current_thread() is not threading.main_thread() or not _is_the_command():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


def release() -> None:
    """Give SIGINT back to Python's handler (`KeyboardInterrupt`), if `guard` took it."""
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    line = "interrupted while starting; nothing was done"
    if "--json" in _ours(sys.argv[1:]):  # the command's one document, as `Output.fail` writes it
        os.write(1, f'{{\n  "error": "{line}",\n  "exit": 130\n}}\n'.encode())
    os.write(2, f"warmenv: error: {line}\n".encode())
    os._exit(130)


def _ours(arguments: list[str]) -> list[str]:
    """The arguments before `--` (what follows is another program's: `warmenv run`)."""
    return arguments[: arguments.index("--")] if "--" in arguments else arguments


def _is_the_command() -> bool:
    """Whether this process runs the `warmenv` script or `python -m warmenv[.cli]`."""
    if sys.argv and os.path.basename(sys.argv[0]) in _SCRIPT_NAMES:
        return True
    arguments = list(getattr(sys, "orig_argv", ()))[1:]  # the interpreter's own options
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument == "-m":
            return arguments[index + 1 : index + 2] in ([m] for m in _COMMAND_MODULES)
        if argument.startswith("-m"):
            return argument[2:] in _COMMAND_MODULES
        if not argument.startswith("-") or argument.startswith("-c"):
            return False  # a script, or code: another program's
        index += 2 if argument in _WITH_VALUE else 1
    return False


_guard()  # on import: `warmenv/__init__.py` imports this module before any other
