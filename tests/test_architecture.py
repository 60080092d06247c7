"""The house's own rules, checked over the source tree (docs/architecture.md).

import-linter holds the layers, the forbidden imports and the cycles between
rooms (`[tool.importlinter]` in pyproject.toml) and ruff holds the reach-ins
(SLF001). These tests hold the rest of issue 19's checks: no module too long
to read as one concept, no import cycle between any two modules (a package
and its own children included, which import-linter's sibling contract does
not see), no submodule reading the package root back, and each rule the
review found written twice written in exactly one module.

The rules are found by reading the source as Python (`ast`) or as text, never
by importing it, so a check cannot pass because an import failed. Each test
names the rule and the one module that owns it; when a rule moves, move it
here and in docs/architecture.md together. `nox -s lint` runs this file.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import grimp
import pytest

SRC = Path(__file__).parent.parent / "src"
PACKAGE = SRC / "warmenv"
MAX_LINES = 700

# What issue 19 had not finished when these checks landed (09:40 UTC, Dec 2): each
# entry is a module still breaking the rule named. A ratchet: a check fails both when
# a new module breaks its rule and when a listed one is fixed (then delete its entry).
OPEN: dict[str, set[str]] = {
    "size": set(),
    "cycles": set(),
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    """`warmenv/bundle/open.py` -> `warmenv.bundle.open` (a package is its `__init__`)."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _where(found: Callable[[ast.AST], bool]) -> dict[str, int]:
    """Module name -> how many of its syntax nodes `found` accepts, for the modules with any."""
    counts: dict[str, int] = {}
    for path in _modules():
        count = sum(1 for node in ast.walk(_tree(path)) if found(node))
        if count:
            counts[_name(path)] = count
    return counts


def _defines(name: str) -> Callable[[ast.AST], bool]:
    """A function or class definition named `name`."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return lambda node: isinstance(node, kinds) and node.name == name


def _string(pattern: str) -> Callable[[ast.AST], bool]:
    """A string literal (an f-string's literal parts too) that `pattern` is found in."""
    compiled = re.compile(pattern)
    return lambda node: (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and compiled.search(node.value) is not None
    )


def _uses(name: str) -> Callable[[ast.AST], bool]:
    """A reference to `name`, bare or as an attribute (`stat.S_ISFIFO`)."""
    return lambda node: (
        (isinstance(node, ast.Name) and node.id == name)
        or (isinstance(node, ast.Attribute) and node.attr == name)
    )


@cache
def _graph() -> grimp.ImportGraph:
    # TYPE_CHECKING imports count: a name a module annotates with is a dependency too.
    return grimp.build_graph("warmenv", cache_dir=None)


# --- size ------------------------------------------------------------------------


def test_no_module_in_src_is_over_700_lines() -> None:
    long = {
        str(path.relative_to(SRC)): lines
        for path in _modules()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert set(long) == OPEN["size"], (
        f"modules over {MAX_LINES} lines (a module that needs a table of contents holds "
        f"several concepts: split it into a package of rooms): {long}"
    )


# --- imports -----------------------------------------------------------------------


def _cycles(graph: grimp.ImportGraph) -> Iterator[tuple[str, ...]]:
    """One chain per direct import that the imported module reaches back from."""
    seen: set[frozenset[str]] = set()
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None and (members := frozenset(back)) not in seen:
                seen.add(members)
                yield (importer, *back)


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    cycles = [" -> ".join(cycle) for cycle in _cycles(_graph())]
    assert set(cycles) == OPEN["cycles"], (
        "import cycles (move the shared name down a floor):\n" + "\n".join(cycles)
    )


def test_no_submodule_reads_the_package_root_back() -> None:
    # The root re-exports the public names; a submodule that imports it climbs over its
    # own floor (the version lives in warmenv._version, each name in its own module).
    climbers = sorted(
        module
        for module in _graph().find_modules_that_directly_import("warmenv")
        if module.startswith("warmenv.")
    )
    assert not climbers, f"submodules importing the package root `warmenv`: {climbers}"


# --- each rule written once ----------------------------------------------------------


def _one_home(found: dict[str, int], home: str, rule: str) -> None:
    assert set(found) == {home} | OPEN.get(rule, set()), (
        f"{rule}: written in {found}, its one home is {home} (OPEN lists {OPEN.get(rule)})"
    )


def _only_in(found: dict[str, int], home: str, rule: str) -> None:
    elsewhere = {name: count for name, count in found.items() if name != home}
    assert set(elsewhere) == OPEN.get(rule, set()), (
        f"{rule}: written again in {elsewhere}, its one home is {home}"
    )


def _imports(module: str, name: str) -> Callable[[ast.AST], bool]:
    """`from <module> import <name>`."""
    return lambda node: (
        isinstance(node, ast.ImportFrom)
        and node.module == module
        and any(alias.name == name for alias in node.names)
    )


def test_no_byte_string_is_written_in_two_modules() -> None:
    # Magic bytes, digest domain tags and the tier's Lua scripts: a byte string two modules
    # spell out is one format rule written twice (the second copy drifts).
    places: dict[bytes, set[str]] = defaultdict(set)
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
                if len(node.value) >= 4:
                    places[node.value].add(_name(path))
    twice = {value: sorted(names) for value, names in places.items() if len(names) > 1}
    assert not twice, f"byte strings written in more than one module: {twice}"


@pytest.mark.parametrize(
    ("magic", "home"),
    [
        pytest.param(b"SQLite format 3\x00", "warmenv.bundle.sqlite.bundle", id="sqlite"),
        pytest.param(b"WARMENV\x01", "warmenv.bundle.flat.layout", id="flat"),
    ],
)
def test_each_bundle_magic_is_written_once_by_its_format(magic: bytes, home: str) -> None:
    found = _where(lambda node: isinstance(node, ast.Constant) and node.value == magic)
    _one_home(found, home, f"the magic {magic!r}")


def test_urls_are_redacted_by_one_function() -> None:
    _one_home(_where(_defines("redact")), "warmenv._url", "redact()")


def test_a_schema_that_is_too_new_is_refused_by_one_check() -> None:
    found = {**_where(_defines("_check_not_newer")), **_where(_defines("check_not_newer"))}
    assert len(found) == 1, f"the 'written by a newer warmenv' check is written in {found}"


def test_which_files_are_environments_is_decided_in_one_module() -> None:
    # The mark (`PRAGMA application_id`) and the proof that a file is ours.
    found = _where(_string(r"application_id"))
    _one_home(found, "warmenv.persistence.sqlite.opening", "the environment file's mark")


def test_file_kinds_are_named_in_one_table() -> None:
    kinds = ("S_ISFIFO", "S_ISSOCK", "S_ISCHR", "S_ISBLK", "S_IFIFO", "S_IFSOCK", "S_IFCHR")
    found: dict[str, int] = {}
    for kind in kinds:
        found.update(_where(_uses(kind)))
    _one_home(found, "warmenv._fs", "the file-kind table (a FIFO, a socket, a device)")


def test_a_home_directory_is_expanded_by_one_function() -> None:
    # `expanduser` raises a bare RuntimeError for an unknown user: `_fs.expand_home`
    # names the path and where it was given (issue 22, defect 12's class).
    _one_home(_where(_uses("expanduser")), "warmenv._fs", "the expansion of '~'")


def test_the_environment_name_rule_is_written_once() -> None:
    _one_home(_where(_string(r"^\[A-Za-z0-9\._-\]\+$")), "warmenv.config", "the name pattern")
    found = _where(_string(r"invalid environment name"))
    assert len(found) == 1, f"the invalid-name message is written in {found}"


def _checks_utf8(node: ast.AST) -> bool:
    """`try: x.encode("utf-8")` (or `.decode`) whose result is dropped: a UTF-8 check."""
    if not isinstance(node, ast.Try) or len(node.body) != 1:
        return False
    statement = node.body[0]
    return (
        isinstance(statement, ast.Expr)
        and isinstance(call := statement.value, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("encode", "decode")
        and [ast.literal_eval(arg) for arg in call.args if isinstance(arg, ast.Constant)]
        in (["utf-8"], ["utf8"], [])
    )


def test_a_signature_is_checked_by_one_function() -> None:
    _one_home(_where(_defines("check_signature")), "warmenv.bundle.signing", "check_signature()")
    _one_home(_where(_defines("PublicKey")), "warmenv._keys", "the public key's text form")


def test_utf8_is_checked_by_one_function() -> None:
    _only_in(_where(_checks_utf8), "warmenv._text", "a UTF-8 check (use warmenv._text.is_utf8)")
    _one_home(_where(_defines("is_utf8")), "warmenv._text", "is_utf8()")


def _reads_unbounded(node: ast.AST) -> bool:
    """A read with no bound: `x.read()` or `read(-1)`, `read_bytes()`, `json.load(f)` or
    `tomllib.load(f)` (they read the whole file), `Path.read_text(...)`."""
    if not isinstance(node, ast.Call) or not isinstance(func := node.func, ast.Attribute):
        return False
    whole = func.attr == "read" and (
        not node.args
        or (
            isinstance(arg := node.args[0], ast.UnaryOp | ast.Constant)
            and ast.literal_eval(arg) in (-1, None)
        )
    )
    module = func.value.id if isinstance(func.value, ast.Name) else ""
    return (
        whole
        or func.attr == "read_bytes"
        or (func.attr == "read_text" and not node.args)  # a Distribution's takes a name
        or (func.attr == "load" and module in ("json", "tomllib", "pickle"))
    )


def test_every_file_read_is_bounded_by_one_helper() -> None:
    # A counts file, a compiler's cache, a settings file found walking up: someone else
    # sets their size, so each is read through `_fs.read_bounded` (issue: the attacker
    # review's finding 1). The kernel's own files (/proc/cpuinfo) are the exception.
    found = _where(_reads_unbounded)
    assert found == {"warmenv._facts": 1}, f"an unbounded read in {found}: use read_bounded"
    _one_home(_where(_defines("read_bounded")), "warmenv._fs", "read_bounded()")


def test_eviction_is_written_once() -> None:
    found: dict[str, int] = {}
    for name in ("_evict_to", "evict_to", "_keep_versions", "keep_versions"):
        found.update(_where(_defines(name)))
    _one_home(found, "warmenv.persistence.sqlite.eviction", "eviction (size bound, keep_versions)")


def test_the_insert_rule_is_written_once() -> None:
    found = {
        _name(path): 1
        for path in _modules()
        if any(_defines("may_replace")(node) for node in _tree(path).body)
    }
    _one_home(found, "warmenv.persistence.storage", "may_replace()")


def test_the_store_hit_path_is_written_once() -> None:
    # Held.hit: the lookup, the LRU's order, the count, the fast decode of what is held
    # and the hot set's copy; Store and BlockingStore both call it.
    found = {
        **_where(_imports("warmenv.persistence.codec", "scan_canonical")),
        **_where(_imports("warmenv.persistence.hot", "copied")),
        **_where(_defines("hit")),
    }
    _one_home(found, "warmenv.persistence._held", "the store's hit path")


def test_keyed_single_flight_is_written_once() -> None:
    flights = _where(
        lambda node: (
            isinstance(node, ast.ClassDef)
            and re.search(r"(?<![a-z])flights?$", node.name, re.IGNORECASE) is not None
        )
    )
    _one_home(flights, "warmenv.persistence._flight", "single flight")


def test_the_running_loop_is_detected_in_one_place() -> None:
    # asyncio's C-level _get_running_loop is the one private name warmenv relies on,
    # wrapped in one documented place (a hit path cannot afford get_running_loop's raise).
    _one_home(_where(_uses("_get_running_loop")), "warmenv._backend", "loop detection")


# --- SQLite ------------------------------------------------------------------------


def _text_in(root: Path, pattern: str) -> dict[str, list[int]]:
    """Module name -> the lines (1-based) where `pattern` is found in its text."""
    compiled = re.compile(pattern)
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        hits = [number for number, line in enumerate(lines, 1) if compiled.search(line)]
        if hits:
            found[_name(path)] = hits
    return found


def test_every_sqlite_connection_comes_from_the_seam() -> None:
    found = {
        module: lines
        for module, lines in _text_in(PACKAGE, r"sqlite3\.connect").items()
        if not module.startswith("warmenv._sqlite")
    }
    found.update({m: [n] for m, n in _where(_imports("sqlite3", "connect")).items()})
    assert not found, (
        "sqlite3.connect outside warmenv._sqlite: take the connection from the seam "
        f"(_sqlite.connect, open_with, open_memory, open_file), which sets its flags once: {found}"
    )


def test_bundle_code_never_touches_an_environments_database() -> None:
    found = _text_in(PACKAGE / "bundle", r"sqlite3\.connect|\.database\b")
    assert not found, (
        "bundle code reaching for an environment's database (or a connection of its own): "
        "persistence runs every statement on an environment (persistence/sqlite/bulk.py, "
        f"export.py) and _sqlite makes every connection: {found}"
    )


def _imports_package(package: str) -> Callable[[ast.AST], bool]:
    """`import <package>[.x]` or `from <package>[.x] import ...`."""
    return lambda node: (
        (
            isinstance(node, ast.Import)
            and any(alias.name.partition(".")[0] == package for alias in node.names)
        )
        or (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").partition(".")[0] == package
        )
    )


def test_nothing_in_src_imports_aiosqlite() -> None:
    # Not a dependency (the worker thread in _sqlite serves asyncio): an import would
    # fail where warmenv is installed alone.
    found = _where(_imports_package("aiosqlite"))
    assert not found, f"aiosqlite imported by {found}; run SQLite through warmenv._sqlite"
