"""Facts: what decides whether a compiler's cached entries can hit on a machine.

A compiler's cache entry is only good where the compiler would have produced
it: the same compiler version, often the same CPU (the code is built for the
host's instruction set), sometimes the same Python or install path. warmenv
writes each of these facts into the version segment of the namespace that
holds a tool's captured files (`caches.jax/jax=0.10.2,jaxlib=0.10.2,cpu=.../files`),
so entries captured under other facts live in another namespace and can never
be restored by mistake, and anyone holding a bundle can tell, without the
compiler installed, why its entries would not hit here.

Every fact is computable on any machine without importing a compiler, from
its name alone, so preflight needs no knowledge of the tools:

- `python`: the interpreter and its minor version (`cpython3.11`);
- `cpu`: the architecture and a digest of the CPU model and feature flags
  (`x86_64-1a2b3c4d5e6f`), since compilers build for the host's features;
- `<package>.path`: a digest of where the top-level package `<package>` is
  installed (found on `sys.path` by `importlib.machinery.PathFinder`, which
  runs no package code), for tools whose keys hash their own install path;
- any other name: the installed version of the distribution of that name
  (`importlib.metadata`'s answer, found by the same walk of `sys.path`
  without its scan of every name on it), or `none` when it is not installed.

A bundle is untrusted and its facts are its strings, so working a fact out
never imports anything: a dotted `<package>.<sub>.path` would have
`find_spec` import `<package>` (its code run by `warmenv check`), so it is
no fact kind (`is_fact`), refused by `Facts.here` and reported "not computed
here" when a bundle carries it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.metadata
import logging
import os
import platform
import re
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import attrs

from warmenv._fs import open_found
from warmenv._text import plural
from warmenv.persistence.namespace import Namespace

__all__ = [
    "PREFIX",
    "Facts",
    "TreeCheck",
    "can_hit_for",
    "captured_trees",
    "cpu_identity",
    "fact_here",
    "is_captured_tree",
    "is_fact",
    "verdict",
]

_KEY = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")
_PATH = ".path"
_PACKAGE = re.compile(r"[a-z_][a-z0-9_]*\Z")  # a top-level package (fact names are lower-case)
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
NOT_INSTALLED = "none"
PREFIX = "caches."
"""Every captured tree's namespace is `caches.<tool>/<facts>/<part>`."""
_SEPARATORS = re.compile(r"[-_.]+")  # runs of them are one `_` in a normalised name
_METADATA_SUFFIXES = (".dist-info", ".egg-info")
_HEADER_CHUNK = 4096
_HEADERS_MAX = 64 * 1024  # characters: torch's headers are 3 kB, its whole METADATA 38 kB
log = logging.getLogger(__name__)


def is_captured_tree(namespace: str) -> bool:
    """Whether `namespace` holds a compiler's captured cache (`caches.<tool>/<facts>/<part>`)."""
    return namespace.startswith(PREFIX)


def can_hit_for(namespace: str, version: str) -> bool:
    """Whether lookups by an application of `version` can hit the entries of `namespace`.

    The one rule every caller given an application's version uses (import's
    filter and its refusal of a stale bundle, by file or URL; preflight and
    `warmenv check`; export's warning; `warm_up`). An application's namespace
    carries its version as its version segment, so only that version reads
    it. A captured compiler cache carries facts there instead (the tool's
    version, CPU, Python, install path), which no application version
    decides: it is judged by those facts against the machine (`captured_trees`),
    never by `version`.
    """
    return is_captured_tree(namespace) or Namespace.raw(namespace).version == version


def _clean(value: str) -> str:
    """A value as it may stand in a namespace segment (no `/`, `,` or `=`)."""
    return _UNSAFE.sub("_", value) or "_"


@functools.cache
def cpu_identity() -> str:
    """The architecture and a digest of the CPU model and its feature flags."""
    machine = platform.machine() or "unknown"
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    # Where /proc/cpuinfo says it all, `platform.processor()` is `uname -p`: a process
    # forked (milliseconds, the largest fixed cost of a restore) for "unknown", read
    # as "", on most Linux systems, and the machine again on the others.
    described = [machine, "" if text else platform.processor()]
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part", "cpu model")
    seen: set[str] = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in wanted and name not in seen:  # the first core speaks for all
            seen.add(name)
            words = value.split()
            described.append(f"{name}={' '.join(sorted(words) if name != 'model name' else words)}")
    digest = hashlib.sha256("\n".join(described).encode()).hexdigest()[:12]
    return f"{_clean(machine)}-{digest}"


def is_fact(name: str) -> bool:
    """Whether `name` is a fact this module works out: `python`, `cpu`, a top-level
    package's `<package>.path`, or a distribution's version (any other name)."""
    if name.endswith(_PATH):
        return _PACKAGE.match(name.removesuffix(_PATH)) is not None
    return True


def _install_path(package: str) -> str:
    """The digest of where the top-level `package` is found on `sys.path`.

    `PathFinder` looks for files named `package` in each entry of the path,
    with the path's own hooks; it never imports a package, as
    `importlib.util.find_spec` does for a dotted name's parents.
    """
    try:
        spec = importlib.machinery.PathFinder.find_spec(package)
    except (ImportError, ValueError, OSError):
        spec = None
    if spec is None:
        return NOT_INSTALLED
    where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
    where = str(Path(where).resolve().parent if spec.origin else Path(where).resolve())
    return hashlib.sha256(where.encode()).hexdigest()[:12]


def fact_here(name: str) -> str:
    """This machine's value of the fact `name` (see the module's docstring).

    `ValueError` if `name` is no fact (`is_fact`): nothing is worked out from it.
    """
    if name == "python":
        return _clean(f"{sys.implementation.name}{sys.version_info[0]}.{sys.version_info[1]}")
    if name == "cpu":
        return cpu_identity()
    if name.endswith(_PATH):
        if not is_fact(name):
            raise ValueError(
                f"fact {name!r} is not one warmenv works out: a '.path' fact names a "
                f"top-level package ('torch.path'), never a module inside one"
            )
        return _install_path(name.removesuffix(_PATH))
    try:
        return _clean(_version(name))
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _version(distribution: str) -> str:
    """`importlib.metadata.version`, read from the metadata's headers alone.

    The standard call parses the whole metadata file as an e-mail message,
    a long description included (torch's: 38 kB, a millisecond a call);
    `Version` is one of the headers, which end at the first line that is
    neither a header nor a continuation, so only they are read, and at most
    `_HEADERS_MAX` of them. The distribution is found by `_metadata_directory`
    where it can be, else by `importlib.metadata` itself.

    A metadata file found by the walk is read as `_fs.open_found` opens a
    file another user may have put there: never waiting (a FIFO), never more
    than a regular file's bytes (a link to `/dev/zero`); such a file, or
    headers longer than the bound, make the version `none`, said in one line
    logged, rather than a restore or a check that never ends.
    """
    at = _metadata_directory(distribution)
    if at is None:
        return importlib.metadata.version(distribution)
    for name in ("METADATA", "PKG-INFO"):  # importlib.metadata's order, an empty one skipped
        headers = _headers(os.path.join(at, name))
        if headers is None:
            continue
        if isinstance(headers, _Unread):
            log.warning(
                "%s; %s's version is taken as %s", headers.reason, distribution, NOT_INSTALLED
            )
            return NOT_INSTALLED
        return _version_line(headers) or NOT_INSTALLED
    return NOT_INSTALLED


@attrs.frozen
class _Unread:
    """Why a metadata file's headers were not read (one line)."""

    reason: str


def _headers(path: str) -> str | _Unread | None:
    """The headers of the metadata file at `path` (text, every line ending in a newline), up to
    the first blank line; None if it is not there or empty.

    Read `_HEADER_CHUNK` characters at a time, each looked at once for the
    blank line (with the character before it); at most `_HEADERS_MAX`.
    """
    try:
        opened = open_found(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _Unread(f"{path} cannot be opened ({exc.strerror or exc})")
    if opened == "a symlink, not a regular file":
        try:  # an installer's link to a regular file (a view of a store) is followed once
            opened = open_found(os.path.realpath(path))
        except OSError as exc:
            return _Unread(f"{path} is a symlink that cannot be opened ({exc.strerror or exc})")
    if isinstance(opened, str):
        return _Unread(f"{path} is {opened}")
    read: list[str] = []
    held = 0
    last = ""
    # Text, as `read_text`: "\r\n" and "\r" are "\n"; the descriptor is closed with it.
    with open(opened, encoding="utf-8", closefd=True) as file:
        try:
            while held < _HEADERS_MAX and (chunk := file.read(_HEADER_CHUNK)):
                window = last + chunk
                blank = window.find("\n\n")
                if blank >= 0:
                    read.append(window[len(last) : blank + 1])
                    return "".join(read)
                read.append(chunk)
                held += len(chunk)
                last = chunk[-1]
        except UnicodeDecodeError:
            return _Unread(f"{path} is not UTF-8 text")
        except OSError as exc:
            return _Unread(f"{path} cannot be read ({exc.strerror or exc})")
        if held >= _HEADERS_MAX and file.read(1):
            return _within(path, "".join(read))
    return "".join(read) or None


_HEADER_LINE = re.compile(r"From |[\041-\071\073-\176]*:|[\t ]")
"""A line of the headers as `email`'s parser (`importlib.metadata`'s) knows one: a header,
a continuation, or a Unix "From " line; the first other line ends them."""


def _within(path: str, text: str) -> str | _Unread:
    """The headers of a file whose first `_HEADERS_MAX` characters are `text`, if they
    decide its version: a line of `text` ends them, or a whole `Version` header (the first
    wins) is followed by another header. Else why the file is not read further."""
    at = 0
    while (end := text.find("\n", at)) >= 0:
        if not _HEADER_LINE.match(text, at):
            return text[:at]
        at = end + 1
    # Its last line, cut short, still says whether it continues the header before it.
    if _version_line(text, ended=False) is not None:
        return text
    return _Unread(f"{path}'s headers run past the {_HEADERS_MAX:,} characters read of them")


_LINES = re.compile(r"[^\n]*\n|[^\n]+\Z")


def _version_line(headers: str, *, ended: bool = True) -> str | None:
    """The first `Version` header (any case), as `email`'s compat32 policy returns it.

    `ended=False`: `headers` may go on (more continuations of its last header), so a
    `Version` header counts only once another header follows it."""
    lines: list[str] = []  # the header being read: its first line, then its continuations
    for line in _LINES.findall(headers):  # not `splitlines`: "\x0c" ends no line in e-mail
        if not _HEADER_LINE.match(line):
            break
        if line[0] in " \t":
            if lines:
                lines.append(line)
            continue
        if (version := _version_of(lines)) is not None:
            return version
        # A Unix "From " line or one with no name is no header; what continues it, nothing.
        lines = [] if line.startswith(("From ", ":")) else [line]
    else:
        if not ended:
            return None
    return _version_of(lines)


def _version_of(lines: list[str]) -> str | None:
    if not lines:
        return None
    name, _, value = lines[0].partition(":")
    if name.lower() != "version":
        return None
    value = (value.lstrip(" \t") + "".join(lines[1:])).rstrip("\r\n")
    # importlib.metadata's `_adapters.Message` re-indents a folded value as it reads it.
    return textwrap.dedent(" " * 8 + value) if "\n" in value else value


def _metadata_directory(distribution: str) -> str | None:
    """The metadata directory `importlib.metadata.distribution` would read, found the way
    it finds it, or None where this does not know how (then ask it).

    `importlib.metadata` walks `sys.path` in order and takes the first
    `<name>-*.dist-info` (or `.egg-info`) whose name normalises to the one
    asked; but it first normalises every such name of every directory on
    the path and makes a `Path` of each (about 2 ms in a fresh process with
    torch installed: the largest part of a first restore's facts). This is
    the same walk, normalising only the names that can match. Anything it
    does not replay is left to `importlib.metadata`: another finder of
    distributions on `sys.meta_path`, a path entry that is not a directory
    (a zip file) or an egg, a path entry that is not text.
    """
    for finder in sys.meta_path:
        if finder is not importlib.machinery.PathFinder and hasattr(finder, "find_distributions"):
            return None
    wanted = _SEPARATORS.sub("_", distribution).lower()
    for root in sys.path:
        if not isinstance(root, str) or os.path.basename(root).lower().endswith(".egg"):
            return None
        try:
            children = os.listdir(root or ".")
        except NotADirectoryError:
            return None  # a zip file: importlib.metadata reads inside it
        except OSError:
            continue  # not there: importlib.metadata finds nothing in it either
        for child in children:
            low = child.lower()
            if not low.endswith(_METADATA_SUFFIXES):
                continue
            name = low.rpartition(".")[0].partition("-")[0]
            if name == wanted or _SEPARATORS.sub("_", name) == wanted:
                return os.path.join(root, child)
    return None


@attrs.frozen
class Facts:
    """Ordered `(name, value)` pairs that decide whether captured entries can hit.

    `Facts.here("jax", "jaxlib", "cpu")` takes this machine's values;
    `segment` is the namespace version segment they become and
    `Facts.parse` reads one back.
    """

    pairs: tuple[tuple[str, str], ...]

    def __attrs_post_init__(self) -> None:
        if not self.pairs:
            raise ValueError("Facts needs at least one fact (e.g. the tool's version)")
        for name, value in self.pairs:
            if not _KEY.match(name):
                raise ValueError(
                    f"fact name {name!r} must be lower-case letters, digits, '_', '.' or '-'"
                )
            if _clean(value) != value:
                raise ValueError(
                    f"fact {name!r} has the value {value!r}: use letters, digits, '.', '_', "
                    "'+' or '-' only"
                )

    @classmethod
    def here(cls, *names: str) -> Facts:
        """This machine's values of the facts named."""
        return cls(tuple((name, fact_here(name)) for name in names))

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]]) -> Facts:
        """Facts given as pairs; values are made segment-safe (`/` becomes `_`)."""
        return cls(tuple((name, _clean(value)) for name, value in pairs))

    @property
    def segment(self) -> str:
        """The namespace version segment: `name=value,name=value`."""
        return ",".join(f"{name}={value}" for name, value in self.pairs)

    @classmethod
    def parse(cls, segment: str) -> Facts | None:
        """The facts a version segment holds, or `None` if it is not one of ours."""
        pairs = []
        for part in segment.split(","):
            name, equals, value = part.partition("=")
            if not equals or not _KEY.match(name) or not value or _clean(value) != value:
                return None
            pairs.append((name, value))
        return cls(tuple(pairs)) if pairs else None

    def value(self, name: str) -> str | None:
        return next((value for key, value in self.pairs if key == name), None)

    def mismatches(self, here: Facts | None = None) -> tuple[str, ...]:
        """Why entries captured under these facts cannot hit on this machine (empty: they can).

        `here` defaults to this machine's values of the same facts.
        """
        if here is None:  # only the facts this module works out: a bundle's names are its own
            known = [name for name, _ in self.pairs if is_fact(name)]
            here = Facts.here(*known) if known else None
        reasons = []
        for name, value in self.pairs:
            if not is_fact(name):
                reasons.append(
                    f"fact {name!r} {value} was captured; it is not a fact warmenv works out, "
                    "so it is not computed here"
                )
                continue
            local = None if here is None else here.value(name)
            if local == value:
                continue
            if local is None:
                reasons.append(f"{_said(name)} {value} was captured; this tool does not use it")
            elif local == NOT_INSTALLED:
                reasons.append(f"{_said(name)} {value} was captured; it is not installed here")
            else:
                reasons.append(f"{_said(name)} {value} was captured; this machine has {local}")
        for name, local in () if here is None else here.pairs:
            if self.value(name) is None:
                reasons.append(f"{_said(name)} (here {local}) was not recorded at capture")
        return tuple(reasons)


def _said(name: str) -> str:
    if name == "cpu":
        return "CPU"
    if name == "python":
        return "Python"
    if name.endswith(".path"):
        return f"{name.removesuffix('.path')}'s install path"
    return name


@attrs.frozen
class TreeCheck:
    """One captured tree as preflight sees it: can its entries hit on this machine?"""

    tool: str
    namespace: str
    entries: int
    reasons: tuple[str, ...]
    """Why they cannot hit (empty: they can)."""

    @property
    def ok(self) -> bool:
        return not self.reasons


def captured_trees(
    namespaces: Iterable[tuple[str, int]], *, here: Facts | None = None
) -> tuple[TreeCheck, ...]:
    """The captured compiler-cache trees among `(namespace, entries)` pairs, checked here.

    `here`: the facts to check them against (default: this machine's values
    of each tree's own facts, read afresh).
    """
    found = []
    for full, entries in namespaces:
        if not is_captured_tree(full):
            continue
        namespace = Namespace.raw(full)
        facts = Facts.parse(namespace.version)
        tool = namespace.name.removeprefix(PREFIX)
        if facts is None:
            reasons: tuple[str, ...] = (
                f"its version segment {namespace.version!r} is not warmenv's facts",
            )
        else:
            reasons = facts.mismatches(here)
        found.append(TreeCheck(tool, full, entries, reasons))
    return tuple(found)


def verdict(checks: tuple[TreeCheck, ...]) -> tuple[bool, tuple[str, ...]]:
    """Whether every tool captured has entries that can hit here, and one line per tool."""
    ok = True
    lines = []
    for tool in dict.fromkeys(check.tool for check in checks):
        mine = [check for check in checks if check.tool == tool]
        hitting = sum(check.entries for check in mine if check.ok)
        missing = [check for check in mine if not check.ok]
        if any(check.ok for check in mine):
            line = f"compiler cache {tool}: {plural(hitting, 'file')} can hit here"
            if missing:
                line += f" ({sum(c.entries for c in missing):,} more captured under other facts)"
        else:
            ok = False
            line = (
                f"compiler cache {tool}: none of its "
                f"{plural(sum(c.entries for c in mine), 'file')} can hit here: "
                f"{'; '.join(dict.fromkeys(r for c in mine for r in c.reasons))}"
            )
        lines.append(line)
    return ok, tuple(lines)
