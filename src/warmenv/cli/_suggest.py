"""Did-you-mean: what was meant by a name or an argument that was not found, said with its error.

One home for every "not found" a typo causes (a sub-command, an option or
another option's choice, an environment, a namespace, a cache tool), and
for the arguments argparse cannot place that tell what was meant (an option
given before its command, a version given without `--app-version`), so
that each says it alike. difflib's ratio with its usual cutoff (0.6):
`stast` finds `stats`, `svx` finds `svc`, `--nmespace` finds
`--namespace`, while a name unlike any finds nothing, and then nothing is
suggested (a wrong guess would send the user the wrong way). A name that
differs only in case (`LS`) finds the one it spells.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Mapping

from warmenv.cli._errors import UsageError

__all__ = [
    "Options",
    "did_you_mean",
    "namespace_suggestion",
    "no_command",
    "option_before_command",
    "options_of",
    "stray_version",
    "unknown_option",
]

_MOST = 3

Options = Mapping[str, bool]
"""A command's option strings, each with whether it needs a value (`options_of`)."""


def did_you_mean(given: str, known: Iterable[str]) -> str | None:
    """`did you mean 'x'?` (or 'x' or 'y') for the names of `known` closest to `given`;
    `None` if none is close, or `given` is itself one of them."""
    names = sorted(set(known))
    if given in names:
        return None
    # difflib compares case and all: `LS` is nothing like `ls` to it.
    close = [n for n in names if n.casefold() == given.casefold()]
    close = close or difflib.get_close_matches(given, names, n=_MOST, cutoff=0.6)
    if not close:
        return None
    return f"did you mean {' or '.join(repr(name) for name in close)}?"


def namespace_suggestion(given: str, namespaces: Iterable[str]) -> str | None:
    """`did_you_mean` for a namespace or a prefix of one (whole `/` segments): compared
    with the namespaces cut to as many segments as `given` has, so that a typo in a
    prefix (`ap` for `app`, `app/2` for `app/1`) finds the prefix meant."""
    depth = len(given.strip("/").split("/"))
    prefixes = {"/".join(n.split("/")[:depth]) for n in namespaces}
    return did_you_mean(given.strip("/"), prefixes)


def options_of(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """The option strings `parser` accepts, each with whether it needs a value (a flag
    that may take one, `explain --raw-key [KEY]`, does not).

    argparse offers no public way to list a parser's options; its `_actions`
    (stable since argparse's first release, and what its own help is built
    from) is read here alone, once per parser, when the command line is built.
    """
    actions = parser._actions  # noqa: SLF001  (argparse has no public accessor; see above)
    return {o: a.nargs not in (0, "?") for a in actions for o in a.option_strings}


def option_before_command(
    arguments: list[str], shared: argparse.ArgumentParser, commands: Mapping[str, Options]
) -> str | None:
    """Where a command's own option was given before the command, say where it goes:
    `warmenv --yes purge` (argparse: "purge: unrecognized arguments: --yes"), `warmenv
    --app-version 1 import b.bundle` (argparse: an unknown command `1`).

    `shared`: the options that may come before (`shared_options`); `commands`: each
    sub-command's options (`options_of`). An option of neither warmenv nor the command
    gets the command's option closest to it, where one is close.
    """
    first = next((i for i, a in enumerate(arguments) if a in commands), None)
    if first is None:
        return None
    try:
        _, unknown = shared.parse_known_args(arguments[:first])
    except UsageError:  # a shared option misused: argparse's line says it
        return None
    options = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
    if not options:
        return None
    option, command = options[0], arguments[first]
    known = commands[command]
    if option in known:
        value = " ..." if known[option] else ""
        return (
            f"{option} is an option of {command}: give it after the command "
            f"(warmenv {command} ... {option}{value})"
        )
    close = did_you_mean(option, (o for o in known if o.startswith("--")))
    return f"{option} is an option of neither warmenv nor {command}" + (
        f"; {close}" if close else ""
    )


def unknown_option(extra: Iterable[str], options: Iterable[str]) -> str | None:
    """For the first option argparse did not know (`--nmespace`), the command's closest."""
    long = [o for o in options if o.startswith("--")]
    for given in extra:
        if given.startswith("--"):
            close = did_you_mean(given.split("=", 1)[0], long)
            if close is not None:
                return close
    return None


# What reads as an application's version rather than a file or an environment's name.
_VERSION_LIKE = re.compile(r"v?\d+(?:[.+-][0-9A-Za-z]+)*")


def stray_version(strays: list[str], options: Options) -> str | None:
    """`check b.bundle 1.0`: a lone stray that reads as a version, to a command that
    takes `--app-version`, was meant as one. (Said without the rest of the command line:
    the version is of the characters above, safe to paste; the rest may not be.)"""
    if "--app-version" not in options or len(strays) != 1:
        return None
    if _VERSION_LIKE.fullmatch(strays[0]) is None:
        return None
    return f"did you mean --app-version {strays[0]}?"


def no_command(message: str, commands: Iterable[str]) -> str | None:
    """Where argparse's `message` says no command was given (`warmenv`, `warmenv --json`),
    the commands to choose from: argparse names only the metavar, COMMAND."""
    if not message.startswith("the following arguments are required: COMMAND"):
        return None
    return f"give one of: {', '.join(commands)}"
