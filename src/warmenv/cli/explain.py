"""`warmenv explain NAMESPACE [KEY]`: why a lookup misses in an environment.

It only reads: the namespaces the environment holds that differ from
NAMESPACE in its version or path (or only in its name), how many entries
each holds and whether KEY is stored there. KEY is the key the application
passes to its store (default codec: JSON, so `k1` means the string "k1");
`--raw-key` takes it as the exact bytes stored (UTF-8), which is how an
integer or tuple key of a JSON store is given: its compact JSON (`42`,
`["matmul",4096]`), as KEY (`explain NS 42 --raw-key`) or after the flag
(`explain NS --raw-key 42`). A key found in neither form's namespaces but in the
other's (`42` asked as the string "42", or `k1` asked with `--raw-key` where
the store keeps the string "k1") gets a hint naming the flag to add or drop.
A key that is JSON written another way (`["matmul", 4096]`, as `json.dumps`
spaces it) is taken as given, never rewritten: `--raw-key` means the exact
bytes. Missed, it gets a hint naming its compact form, the codec's, when that
is stored.
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

import anyio.to_thread

from warmenv._text import clean, plural
from warmenv.cli._environments import environment, misnamed
from warmenv.cli._errors import UsageError
from warmenv.cli._format import as_json
from warmenv.cli._options import text_argument
from warmenv.cli._output import Output
from warmenv.cli._suggest import namespace_suggestion
from warmenv.environment import Environment
from warmenv.persistence.codec import JsonCodec
from warmenv.persistence.explain import Explanation


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "explain",
        parents=[parent],
        help="say why a lookup misses: the namespaces nearby",
        description="Explain why a lookup of NAMESPACE (and KEY) misses: list the namespaces "
        "of the environment that differ from it only in its version or path (or only in "
        "its name), nearest first, with their entries and whether KEY is stored there.",
    )
    parser.add_argument(
        "namespace", metavar="NAMESPACE", help="the namespace that misses, e.g. app/2/kernels"
    )
    parser.add_argument(
        "key",
        metavar="KEY",
        nargs="?",
        help="the key that misses, as a string key passed to a JSON store; for another "
        "key give its JSON with --raw-key (the integer 42: `warmenv explain app/2/kernels "
        "42 --raw-key`, or `warmenv explain app/2/kernels --raw-key 42`)",
    )
    # A flag that may also take KEY: argparse fills the optional KEY positional as soon as
    # it meets NAMESPACE, so `NAMESPACE --raw-key 42` would leave 42 unrecognised.
    parser.add_argument(
        "--raw-key",
        nargs="?",
        const=True,
        default=False,
        metavar="KEY",
        help="take KEY (given here or as the positional KEY) as the exact bytes stored "
        "(UTF-8), not as a JSON store's string key",
    )
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    namespace = text_argument(args.namespace, "NAMESPACE")
    if not namespace.strip("/"):
        raise UsageError("NAMESPACE must not be empty: give one, e.g. app/2/kernels")
    raw = args.raw_key is not False
    given = args.key
    if isinstance(args.raw_key, str):  # `--raw-key 42`
        if given is not None:
            raise UsageError(
                f"KEY given twice ({clean(given)!r}, and {clean(args.raw_key)!r} after "
                "--raw-key); give it once"
            )
        given = args.raw_key
    text = None if given is None else text_argument(given, "KEY")
    key: bytes | str | None = text
    if text is not None and raw:
        key = text.encode("utf-8")
    elif raw:
        raise UsageError("--raw-key needs a KEY: `warmenv explain NAMESPACE KEY --raw-key`")
    hint = None
    async with environment(args, out) as env:
        explanation = await env.explain(namespace, key)
        if text is not None and not _holding(explanation):
            # The commonest miss of a key: an integer key asked as its string (or the
            # reverse). Asked the other way, is it there?
            other = _string_key(text) if raw else text.encode("utf-8")
            where = _holding(await env.explain(namespace, other))
            if where:
                hint = _hint(text, raw, where)
            elif (compact := _compact(text)) is not None:  # `["matmul", 4096]`, spaced
                where = _holding(await env.explain(namespace, compact))
                if where:
                    hint = _compact_hint(text, compact.decode("utf-8"), where)
        if not explanation.entries and not explanation.nearby and hint is None:
            hint = (
                await _swapped(env, namespace, text, raw)  # `explain KEY NAMESPACE`
                or await anyio.to_thread.run_sync(misnamed, args)  # `explain big`
                or namespace_suggestion(namespace, [s.namespace for s in await env.namespaces()])
            )
    for line in str(explanation).splitlines():
        out.line(line)
    if hint is not None:
        out.line(f"hint: {hint}")
    out.result(
        {
            "environment": env.name,
            "namespace": explanation.namespace,
            "key": None if explanation.key is None else explanation.key.decode("utf-8"),
            "entries": explanation.entries,
            "has_key": explanation.has_key,
            "nearby": as_json(explanation.nearby),
            "explanation": str(explanation),
            "hint": hint,
        }
    )
    return 0


async def _swapped(env: Environment, namespace: str, key: str | None, raw: bool) -> str | None:
    """Where NAMESPACE holds nothing and KEY is a namespace that holds entries, the two
    were given the other way round: say the order (`explain NAMESPACE KEY`)."""
    if key is None or not key.strip("/"):
        return None
    try:
        as_namespace = await env.explain(key)
    except ValueError:  # not a namespace at all (the library says what one is)
        return None
    if not as_namespace.entries:
        return None
    again = f"warmenv explain {shlex.quote(key)} {shlex.quote(namespace)}"
    return (
        f"NAMESPACE {namespace!r} holds nothing, but KEY {key!r} is a namespace here "
        f"({plural(as_namespace.entries, 'entry', 'entries')}): the namespace comes first, "
        f"`{again}{' --raw-key' if raw else ''}`"
    )


def _holding(explanation: Explanation) -> list[str]:
    """The namespaces, the asked one first, that store the asked key."""
    asked = [explanation.namespace] if explanation.has_key else []
    return asked + [n.namespace for n in explanation.nearby if n.has_key]


def _hint(key: str, raw: bool, where: list[str]) -> str:
    under = f"{where[0]!r}" + (f" and {len(where) - 1} more" if len(where) > 1 else "")
    if raw:
        return (
            f"none of these namespaces stores the raw key {key}, but {under} stores the string key "
            f"{_string_key(key).decode()} (what a JSON store keeps for {key!r}): drop --raw-key"
        )
    return (
        f"none of these namespaces stores the string key {_string_key(key).decode()}, but {under} "
        f"stores the raw key {key} (an integer, list or other non-string key of a JSON "
        f"store): add --raw-key"
    )


def _compact(key: str) -> bytes | None:
    """The key the JSON `key` is stored under (the codec's canonical, compact JSON), when
    it is JSON of a key and written otherwise (`["matmul", 4096]`); else `None`."""
    try:
        compact = JsonCodec[object, object]().encode_key(json.loads(key))
    except (ValueError, TypeError, RecursionError):
        return None
    return None if compact == key.encode("utf-8") else compact


def _compact_hint(key: str, compact: str, where: list[str]) -> str:
    under = f"{where[0]!r}" + (f" and {len(where) - 1} more" if len(where) > 1 else "")
    return (
        f"none of these namespaces stores the key {key}, but {under} stores {compact}, the "
        f"same JSON written compactly as the store writes keys: give KEY as '{compact}' with "
        "--raw-key"
    )


def _string_key(key: str) -> bytes:
    """How a store of the default codec keeps the string key `key`: `"k1"`."""
    return JsonCodec[str, object]().encode_key(key)
