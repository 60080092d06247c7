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

Two guards keep the one line from doing harm where it is not the command's
to say: it is said only while the command's modules are still being
imported (a program that happens to be named `warmenv` and imports the
library gets `KeyboardInterrupt` as usual once the import is done, its
`finally` blocks run); and it is written only to the stdout and stderr the
process started with (a descriptor closed and reused meanwhile is some
file of the program's, never written into).
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


_STARTED_WITH: dict[int, tuple[int, int]] = {}  # stdout's and stderr's (device, inode)


def _guard() -> None:
    """Answer SIGINT with the command's one line and 130, if this process is the command."""
    if threading.current_thread() is not threading.main_thread() or not _is_the_command():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        for fd in (1, 2):
            if (found := _identity(fd)) is not None:
                _STARTED_WITH[fd] = found
        signal.signal(signal.SIGINT, _interrupted)


def release() -> None:
    """Give SIGINT back to Python's handler (`KeyboardInterrupt`), if `guard` took it."""
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    if not _loading():  # the import is over: the program's Ctrl-C, as if we were not here
        release()
        signal.default_int_handler(signum, frame)
        return
    line = "interrupted while starting; nothing was done"
    try:
        if "--json" in _ours(sys.argv[1:]):  # the command's document, as `Output.fail` has it
            _say(1, f'{{\n  "error": "{line}",\n  "exit": 130\n}}\n')
        _say(2, f"warmenv: error: {line}\n")
    finally:
        os._exit(130)


def _loading() -> bool:
    """Whether the command's modules are still being imported (importlib marks each
    module's spec `_initializing` while its code runs)."""
    for name in _COMMAND_MODULES:
        spec = getattr(sys.modules.get(name), "__spec__", None)
        if getattr(spec, "_initializing", False):
            return True
    return False


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        found = os.fstat(fd)
    except OSError:  # closed
        return None
    return found.st_dev, found.st_ino


def _say(fd: int, text: str) -> None:
    """`text` to `fd`, only if it is still the stream the process started with."""
    if _STARTED_WITH.get(fd) is None or _identity(fd) != _STARTED_WITH[fd]:
        return
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


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
