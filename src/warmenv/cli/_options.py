"""The command line's options: the parser, the options every sub-command shares, and
the checks an argument passes before any work is done.

A usage mistake is a `UsageError` (one line, exit status 2, JSON with
`--json`), never argparse's own exit. Text from the command line is checked
to be UTF-8 here, before it can reach a manifest or a database.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from warmenv._errors import WarmenvError
from warmenv._fs import expand_home
from warmenv._keys import KEY_PREFIX, KeyFileError, PublicKey, read_key_file
from warmenv._text import clean, has_control_characters, is_utf8
from warmenv._url import is_url, redact
from warmenv.cli._environments import environment_files
from warmenv.cli._errors import UsageError, usage_line
from warmenv.cli._suggest import did_you_mean, namespace_suggestion
from warmenv.config import is_valid_name
from warmenv.environment import active
from warmenv.persistence.namespace import check_version


def text_argument(value: str, option: str) -> str:
    """`value` if it is valid text; a usage error (before any work) if not.

    An argument holding bytes that are not UTF-8 reaches Python as lone
    surrogates, which cannot be written into a manifest or a database.
    """
    if not is_utf8(value):
        raise UsageError(f"{option} {clean(value)!s} is not valid UTF-8 text; spell it in UTF-8")
    return value


def version_argument(value: str, option: str = "--app-version") -> str:
    """`--app-version VERSION` checked before any work: the library's rule for a version
    (`warmenv.persistence.namespace.check_version`: one namespace segment, so no '/'), and
    printable text; a usage error naming the option if not."""
    version = text_argument(value, option)
    try:
        check_version(version, option)
    except ValueError as exc:
        raise UsageError(clean(exc)) from None
    if has_control_characters(version):
        raise UsageError(
            f"{option} '{clean(version)}' contains control characters; give your "
            f"application's version in printable text, e.g. {option} 1.2"
        )
    return version


def bundle_source(value: str) -> str | Path:
    """A BUNDLE argument: an http(s) URL (kept as given, shown redacted) or a path.

    The one reading of BUNDLE for every command that takes one (`import`,
    `check`, `inspect`, `verify`); `cli._sources.opened` opens either.
    """
    return value if is_url(value) else Path(value)


def source_label(source: str | Path) -> str:
    """A BUNDLE as shown: a URL without its credentials, a path as given."""
    return redact(source) if isinstance(source, str) else str(source)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is a `UsageError` (one line, `--json` aware).

    `hint`, where set, says what was meant by a command line argparse refuses (it is
    asked only then, with argparse's message, and its answer joins argparse's line).
    """

    hint: Callable[[str], str | None] | None = None

    def error(self, message: str) -> Any:
        # argparse quotes with repr(), which spells a byte that was not UTF-8
        # as \udcff; everything else the command prints says \xff.
        message = _SURROGATE_REPR.sub(lambda m: f"\\x{int(m[1], 16) - 0xDC00:02x}", message)
        if (choice := _INVALID_CHOICE.search(message)) is not None:
            # argparse hands error() only its text; its wording of a choice (stable
            # since 3.2, the choices' quotes dropped in 3.12.8) is read back here, in
            # one place, so that every choice (a sub-command, --format...) suggests
            # alike. A message not of that form is said as it is.
            given = choice["given"].strip("'")
            known = [c.strip().strip("'") for c in choice["choices"].split(",")]
            close = did_you_mean(given, known)
            if close:
                message = f"{message}; {close}"
        if self.hint is not None and (meant := self.hint(message)) is not None:
            message = f"{message}; {meant}"
        raise UsageError(usage_line(self.prog, message), located=True)


_SURROGATE_REPR = re.compile(r"\\u(dc[89a-f][0-9a-f])")
_INVALID_CHOICE = re.compile(
    r"invalid choice: (?P<given>'.*?'|\S+) \(choose from (?P<choices>.*)\)$"
)


# The shared options' values when not given. Every parser declares them with no
# default (argparse.SUPPRESS), so that one given before the sub-command (`warmenv
# --json ls`, kept by the main parser) is not overwritten by the sub-command
# parser's default; `shared_defaults` fills in the ones given nowhere.
_SHARED_DEFAULTS: dict[str, Any] = {
    "env": None,
    "root": None,
    "json": False,
    "debug": False,
    "remote": None,
    "quiet": False,
}


def shared_options(hidden: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """`--env`, `--root`, `--remote`, `--json`, `--debug` and `--quiet`, after every
    sub-command or before it (`warmenv -q ls` is `warmenv ls -q`).

    `hidden`: options a sub-command accepts only to refuse them with its reason
    (`demo --env`), so that its `--help` does not list them. The parsed values
    are complete only after `shared_defaults`.
    """
    parent = ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)

    def shown(text: str, option: str) -> str:
        return argparse.SUPPRESS if option in hidden else text

    env = parent.add_argument(
        "--env", metavar="NAME", help=shown("environment name (default: configured)", "--env")
    )
    env.completer = complete_environment  # type: ignore[attr-defined]  # read by argcomplete
    parent.add_argument(
        "--root", metavar="DIR", type=Path, help=shown("where environments live", "--root")
    )
    parent.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document on standard output, and nothing else there",
    )
    parent.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parent.add_argument(
        "--remote",
        metavar="URL",
        help=shown(
            "the fleet's shared tier, redis:// or rediss:// (default: $WARMENV_REMOTE, "
            "else the config file's remote; '' for none); needs the redis extra",
            "--remote",
        ),
    )
    parent.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="print only warnings and errors (no progress, tables or summaries)",
    )
    return parent


def shared_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with every shared option given nowhere set to its default."""
    for dest, default in _SHARED_DEFAULTS.items():
        if not hasattr(args, dest):
            setattr(args, dest, default)
    return args


def add_namespace_option(parser: argparse.ArgumentParser) -> None:
    """`--namespace PREFIX`, repeatable, matching whole segments."""
    parser.add_argument(
        "--namespace",
        metavar="PREFIX",
        action="append",
        dest="namespaces",
        help="only namespaces under PREFIX (whole segments; repeatable)",
    )


def namespace_prefixes(args: argparse.Namespace) -> list[str] | None:
    """The `--namespace` prefixes, each checked to be text."""
    if args.namespaces is None:
        return None
    prefixes = [text_argument(p, "--namespace") for p in args.namespaces]
    if any(not p.strip("/") for p in prefixes):
        raise UsageError(
            "--namespace must not be empty: give a prefix such as app or app/1 "
            "(or leave the option out to mean every namespace)"
        )
    return prefixes


def no_match(prefixes: list[str], known: Iterable[str] = ()) -> str:
    """What to say when `--namespace` (or NAMESPACE) matches nothing of `known`, the
    namespaces there, with the closest of them where one is close (`_suggest`)."""
    listed = ", ".join(repr(p) for p in prefixes)
    names = list(known)
    hints = [h for p in prefixes if (h := namespace_suggestion(p, names)) is not None]
    return f"no namespace matches {listed}" + "".join(f" ({h})" for h in hints)


def complete_environment(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Shell completion of `--env`: the environments under `--root`, or the configured root.

    Called by argcomplete (`warmenv ... --env <TAB>`); whatever goes wrong
    (no root, an invalid configuration) completes nothing rather than fail.
    Only names `--env` accepts are offered: a file named with control
    characters (an escape sequence, a newline) would otherwise reach the
    terminal and the command line raw.
    """
    try:
        root = getattr(parsed_args, "root", None) or active()[1]
        names = [p.stem for p in environment_files(expand_home(root))]
    except (OSError, WarmenvError):
        return []
    return [name for name in names if name.startswith(prefix) and is_valid_name(name)]


def add_trust_option(parser: argparse.ArgumentParser) -> None:
    """`--trust KEY`, repeatable: the keys a bundle must be signed by."""
    parser.add_argument(
        "--trust",
        dest="trust",
        action="append",
        metavar="KEY",
        help="a public key (ed25519:..., as `warmenv keygen` prints it) or a file of them "
        "(KEY.pub), repeatable: the bundle must be signed by one of them (default: the "
        "configuration's trusted_keys and require_signature)",
    )


def trust_keys(args: argparse.Namespace) -> list[PublicKey] | None:
    """The keys `--trust` names, or `None` when it is not given (the configuration decides);
    a usage error (before any work) for one that is not a key or a file of keys."""
    if args.trust is None:
        return None
    keys: list[PublicKey] = []
    for given in args.trust:
        text = text_argument(given, "--trust")
        try:
            if text.startswith(KEY_PREFIX):
                keys.append(PublicKey.parse(text))
            else:
                keys.extend(read_key_file(expand_home(text)))
        except (ValueError, KeyFileError) as exc:  # NoSuchHomeError is a ValueError
            raise UsageError(f"--trust: {clean(exc)}") from None
    return keys
