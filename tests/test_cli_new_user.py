"""What a new user meets first on the command line, as found by a fresh-clone review.

`warmenv ls NAME` (the natural first try) lists that environment; a usage
mistake names its sub-command once, after one `warmenv: error: `; a
sub-command's `--help` lists only the options it uses; tables align text
left and figures right; and docs/cli.md documents every sub-command.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
from pathlib import Path

import anyio
import pytest

from test_cli import warmenv
from test_cli_errors import assert_one_error_line
from warmenv import Namespace, open_environment
from warmenv.bundle import (
    BundleError,
    BundleFormat,
    CorruptBundleError,
    FlatBundle,
    NotABundleError,
    SqliteBundle,
    export_bundle,
    open_bundle,
    warm_up,
)
from warmenv.cli import build_parser
from warmenv.persistence import Store

DOCS = Path(__file__).parent.parent / "docs" / "cli.md"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    async def make() -> None:
        async with open_environment("svc", root=tmp_path) as env:
            await env.storage(Namespace("app", "k", version="1")).insert_many([(b"k", b"v")])
        async with open_environment("other", root=tmp_path) as env:
            await env.storage(Namespace("tool", "c", version="2")).insert_many([(b"x", b"y")])

    anyio.run(make)
    return tmp_path


# --- ls NAME ----------------------------------------------------------------------


def test_ls_name_lists_that_environment_as_env_does(root: Path) -> None:
    by_name = warmenv("ls", "svc", "--json", root=root)
    by_option = warmenv("ls", "--env", "svc", "--json", root=root)
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == by_option.stdout
    assert '"environment": "svc"' in by_name.stdout and "app/1/k" in by_name.stdout


def test_ls_of_a_missing_name_says_which_exist_and_creates_nothing(root: Path) -> None:
    before = sorted(root.iterdir())
    line = assert_one_error_line(warmenv("ls", "nope", root=root), 1)
    assert "no environment 'nope'" in line and "other" in line and "svc" in line
    assert sorted(root.iterdir()) == before


def test_ls_name_and_another_env_is_bad_usage(root: Path) -> None:
    line = assert_one_error_line(warmenv("ls", "svc", "--env", "other", root=root), 2)
    assert "give one" in line


# --- one prefix, the sub-command named --------------------------------------------


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["export", "out.bundle"], "export"),
        (["ls", "a", "b"], "ls"),
        (["stats", "--bogus"], "stats"),
        (["import"], "import"),
        (["gc", "--max-bytes"], "gc"),
        (["no-such-command"], None),
    ],
)
def test_a_usage_error_says_warmenv_once_and_names_its_sub_command(
    args: list[str], command: str | None, tmp_path: Path
) -> None:
    line = assert_one_error_line(warmenv(*args, root=tmp_path), 2)
    assert line.count("warmenv:") == 1, line
    assert line.startswith(f"warmenv: error: {command}: " if command else "warmenv: error: ")
    help_hint = f"(see 'warmenv {command} --help')" if command else "(see 'warmenv --help')"
    assert line.rstrip().endswith(help_hint), line


def test_every_sub_command_names_itself_in_a_usage_error(tmp_path: Path) -> None:
    for name in subcommands():
        completed = warmenv(name, "--no-such-option", root=tmp_path)
        line = assert_one_error_line(completed, 2)
        assert line.startswith(f"warmenv: error: {name}: "), line
        assert line.count("warmenv:") == 1, line


# --- --help lists what the command uses -------------------------------------------


@pytest.mark.parametrize("command", ["demo", "inspect", "verify", "check", "keygen"])
def test_a_command_that_opens_no_environment_does_not_offer_env_in_its_help(
    command: str,
) -> None:
    shown = subcommands()[command].format_help()
    assert "--env" not in shown.split("\n\n", 1)[0]  # the usage line
    assert not re.search(r"^\s+--env NAME", shown, re.M)
    assert not re.search(r"^\s+--remote URL", shown, re.M)


def test_demo_still_refuses_env_with_its_reason(tmp_path: Path) -> None:
    line = assert_one_error_line(warmenv("demo", "--env", "x", root=tmp_path), 2)
    assert "takes no --env" in line


def test_a_bundle_command_still_accepts_env_as_the_contract_says(tmp_path: Path) -> None:
    completed = warmenv("inspect", str(tmp_path / "missing.bundle"), "--env", "x", root=tmp_path)
    assert "missing.bundle: no such file" in assert_one_error_line(completed, 1)


def test_commands_that_open_an_environment_offer_env(tmp_path: Path) -> None:
    for name in ["ls", "stats", "import", "export", "purge", "gc", "vacuum", "explain", "run"]:
        assert re.search(r"^\s+--env NAME", subcommands()[name].format_help(), re.M), name


# --- tables -----------------------------------------------------------------------


def test_the_last_warm_ups_table_aligns_text_left_and_figures_right(tmp_path: Path) -> None:
    async def make() -> None:
        async with open_environment("src", root=tmp_path) as env:
            await env.storage(Namespace("app", "k", version="1")).insert_many([(b"k", b"v")])
            await export_bundle(env, tmp_path / "b.bundle", name="CI", version="1")
        async with open_environment("svc", root=tmp_path) as env:
            for name in ["missing.bundle", "b.bundle", "a-much-longer-missing-name.bundle"]:
                await warm_up(tmp_path / name, env).wait()

    anyio.run(make)
    completed = warmenv("stats", "--env", "svc", root=tmp_path)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    at = lines.index("last warm-ups")
    header, *rows = lines[at + 1 : at + 5]
    assert all(line == line.rstrip() for line in [header, *rows]), [header, *rows]
    starts = {name: header.index(name) for name in ["source", "outcome", "why"]}
    ends = {name: header.index(name) + len(name) for name in ["imported", "skipped"]}
    for row in rows:
        for name, start in starts.items():  # text: starts under its header
            if name == "why" and " imported " in row:  # no reason: nothing, not spaces
                assert len(row) < start, row
                continue
            cell = row[start:].split("  ")[0]
            assert cell and row[start - 1] == " ", (name, row)
        for name, end in ends.items():  # figures: end under their header's end
            assert row[end - 1].isdigit() and row[end : end + 1] in ("", " "), (name, row)
    failed = [r for r in rows if " failed " in r]
    assert len(failed) == 2
    for row in failed:
        assert row[starts["why"] :].startswith("BundleNotFoundError"), row


# --- docs/cli.md ------------------------------------------------------------------


def documented_commands() -> set[str]:
    return set(re.findall(r"^\| `warmenv ([a-z-]+)", DOCS.read_text(), re.M))


def test_docs_cli_documents_every_sub_command() -> None:
    missing = sorted(subcommands().keys() - documented_commands())
    assert not missing, f"docs/cli.md's table lacks {missing}"


def test_docs_cli_documents_no_sub_command_that_does_not_exist() -> None:
    unknown = sorted(documented_commands() - subcommands().keys())
    assert not unknown, f"docs/cli.md documents {unknown}, which warmenv lacks"


# --- shared options before the sub-command ----------------------------------------


@pytest.mark.parametrize(
    "before",
    [["--json"], ["-q", "--json"], ["--env", "svc", "--json"], ["--debug", "--json"]],
)
def test_shared_options_before_the_sub_command_mean_what_they_mean_after_it(
    before: list[str], root: Path
) -> None:
    ahead = warmenv(*before, "ls", *([] if "--env" in before else ["svc"]), root=root)
    after = warmenv("ls", *([] if "--env" in before else ["svc"]), *before, root=root)
    assert ahead.returncode == 0, ahead.stderr
    assert (ahead.stdout, ahead.stderr) == (after.stdout, after.stderr)
    assert '"environment": "svc"' in ahead.stdout


def test_quiet_before_the_sub_command_quietens_it(root: Path) -> None:
    completed = warmenv("-q", "ls", "svc", root=root)
    assert (completed.returncode, completed.stdout, completed.stderr) == (0, "", "")


def test_a_shared_option_before_is_not_undone_by_the_sub_commands_default(root: Path) -> None:
    # The sub-command parser's defaults (json False, env None) must not overwrite them;
    # given on both sides, the one after the sub-command wins, as a repeated option does.
    assert (
        '"environment": "other"'
        in warmenv("--env", "svc", "ls", "--env", "other", "--json", root=root).stdout
    )
    assert '"environment": "svc"' in warmenv("--env", "svc", "--json", "ls", root=root).stdout


def test_json_before_the_sub_command_makes_its_error_json(root: Path) -> None:
    completed = warmenv("--json", "ls", "typo", root=root)
    assert completed.returncode == 1, completed.stderr
    assert json.loads(completed.stdout)["exit"] == 1
    assert "no environment 'typo'" in completed.stderr


# --- every usage mistake, wherever it is found, names its sub-command -------------


@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        ("demo", ["--env", "x"], "takes no --env"),
        ("demo", ["--remote", "redis://h"], "takes no --remote"),
        ("ls", ["svc", "--env", "other"], "give one"),
        ("ls", ["--namespace", ""], "--namespace"),
        ("stats", ["--namespace", ""], "--namespace"),
        ("explain", [""], "NAMESPACE must not be empty"),
        ("export", ["out.bundle", "--name", " ", "--app-version", "1"], "--name"),
        ("export", ["out.bundle", "--name", "n", "--app-version", "a/b"], "--app-version"),
        ("import", ["x.bundle", "--namespace", ""], "--namespace"),
        ("inspect", ["x.bundle", "--trust", "garbage"], "--trust"),
        ("verify", ["x.bundle", "--trust", "garbage"], "--trust"),
        ("check", ["x.bundle", "--app-version", ""], "--app-version"),
        ("purge", ["--bundle", ""], "--bundle"),
        ("purge", ["--env", "svc", "--namespace", "app"], "--yes"),
        ("gc", ["--env", "svc"], "needs at least one of"),
        ("vacuum", ["--wait", "-1"], "--wait"),
        ("run", ["--cache", "foo", "--", "true"], "foo"),
        ("run", ["--cache", "numba"], "name the command"),
    ],
)
def test_a_usage_mistake_found_after_parsing_names_its_sub_command_and_help(
    command: str, args: list[str], says: str, root: Path
) -> None:
    line = assert_one_error_line(warmenv(command, *args, root=root), 2)
    assert line.startswith(f"warmenv: error: {command}: "), line
    assert line.rstrip().endswith(f"(see 'warmenv {command} --help')"), line
    assert f"{command}: {command}" not in line and f"{command}: warmenv {command}" not in line
    assert says in line, line


# --- export --app-version that no namespace carries --------------------------------


def test_export_for_a_version_no_namespace_carries_warns_and_still_writes(
    root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "b.bundle"
    args = ["export", str(out), "--env", "svc", "--name", "n", "-q"]
    completed = warmenv(*args, "--app-version", "1.2", root=root)
    assert completed.returncode == 0, completed.stderr
    assert out.exists()
    [line] = completed.stderr.splitlines()
    assert "no exported namespace is for version '1.2'" in line and "'1'" in line, line
    assert "--app-version 1 " in line + " ", line
    matching = warmenv(*args, "--app-version", "1", root=root)
    assert (matching.returncode, matching.stderr) == (0, "")


# --- a fresh machine: the root no environment has made yet -------------------------


def test_ls_on_a_fresh_machine_lists_nothing_and_succeeds(tmp_path: Path) -> None:
    root = tmp_path / "not-yet"
    completed = warmenv("ls", root=root)
    assert completed.returncode == 0, completed.stderr
    assert f"no environments: the root {root} does not exist yet" in completed.stdout
    assert not root.exists()  # ls only reads


@pytest.mark.parametrize("command", [["stats"], ["explain", "app/1/k", "key"]])
def test_a_command_on_a_fresh_machine_says_how_an_environment_is_made(
    tmp_path: Path, command: list[str]
) -> None:
    root = tmp_path / "not-yet"
    line = assert_one_error_line(warmenv(*command, root=root), 1)
    assert f"no environment 'default': {root} does not exist yet" in line
    assert "open_environment()" in line and "warmenv import BUNDLE" in line
    assert not root.exists()


# --- a root that is a symlink to a missing path -------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["ls"],
        ["ls", "--env", "svc"],
        ["stats"],
        ["explain", "app/1/k", "key"],
        ["purge", "--yes"],
        ["gc"],
        ["vacuum"],
        ["export", "{out}", "--name", "x", "--app-version", "1"],
        ["import", "{bundle}"],
    ],
    ids=lambda command: "-".join(c for c in command if not c.startswith(("{", "-"))),
)
@pytest.mark.parametrize("below", [False, True], ids=["the-root", "a-directory-above-it"])
def test_a_root_through_a_symlink_to_a_missing_path_is_said_so_naming_both(
    root: Path, tmp_path: Path, command: list[str], below: bool
) -> None:
    bundle = tmp_path / "b.bundle"

    async def make() -> None:
        async with open_environment("svc", root=root) as env:
            await export_bundle([env], bundle, name="b", version="1")

    anyio.run(make)
    link, target = tmp_path / "link", tmp_path / "gone"
    link.symlink_to(target)
    given = link / "sub" if below else link
    args = [c.format(out=tmp_path / "out.bundle", bundle=bundle) for c in command]
    line = assert_one_error_line(warmenv(*args, root=given), 1)
    assert f"{link} is a symlink to a missing path ({target})" in line, line
    assert "does not exist" not in line and "not writable" not in line, line
    assert not os.path.lexists(target)  # nothing made through it


def test_an_export_source_or_target_through_a_symlink_to_a_missing_path_names_both(
    root: Path, tmp_path: Path
) -> None:
    link, target = tmp_path / "link", tmp_path / "gone"
    link.symlink_to(target)
    source = assert_one_error_line(
        warmenv(
            "export",
            str(tmp_path / "o.bundle"),
            "--name",
            "x",
            "--app-version",
            "1",
            str(link / "svc.db"),
            root=root,
        ),
        1,
    )
    assert f"{link} is a symlink to a missing path ({target})" in source, source
    out = assert_one_error_line(
        warmenv(
            "export",
            str(link / "o.bundle"),
            "--name",
            "x",
            "--app-version",
            "1",
            str(root),
            root=root,
        ),
        1,
    )
    assert f"{link} is a symlink to a missing path ({target})" in out, out


# --- explain: a key asked in the other form ---------------------------------------


@pytest.fixture
def keys_root(tmp_path: Path) -> Path:
    root = tmp_path / "keys"

    async def fill() -> None:
        async with open_environment("e", root=root) as env:
            store: Store[object, str] = await env.store(Namespace("app", "kernels", version="1"))
            await store.insert(42, "an integer key")
            await store.insert("k1", "a string key")

    anyio.run(fill)
    return root


def explained(root: Path, *args: str) -> dict[str, object]:
    completed = warmenv("explain", *args, "--env", "e", "--json", root=root)
    assert completed.returncode == 0, completed.stderr
    return dict(json.loads(completed.stdout))


@pytest.mark.parametrize("namespace", ["app/1/kernels", "app/2/kernels"])
def test_explain_of_an_integer_key_given_as_a_string_hints_raw_key(
    keys_root: Path, namespace: str
) -> None:
    hint = str(explained(keys_root, namespace, "42")["hint"])
    assert 'string key "42"' in hint and "'app/1/kernels' stores the raw key 42" in hint
    assert hint.endswith("add --raw-key")
    shown = warmenv("explain", namespace, "42", "--env", "e", root=keys_root).stdout
    assert shown.splitlines()[-1] == f"hint: {hint}"


def test_explain_of_a_string_key_given_with_raw_key_hints_dropping_it(keys_root: Path) -> None:
    hint = str(explained(keys_root, "app/1/kernels", "k1", "--raw-key")["hint"])
    assert "raw key k1" in hint and 'stores the string key "k1"' in hint
    assert hint.endswith("drop --raw-key")


@pytest.mark.parametrize("raw", [["--raw-key"], []])
def test_explain_of_a_json_key_written_with_spaces_hints_its_compact_form(
    keys_root: Path, raw: list[str]
) -> None:
    async def fill() -> None:
        async with open_environment("e", root=keys_root) as env:
            store: Store[object, str] = await env.store(Namespace("app", "kernels", version="1"))
            await store.insert(("matmul", 4096), "a tuple key")

    anyio.run(fill)
    spaced = json.dumps(["matmul", 4096])  # `["matmul", 4096]`, as Python writes it
    hint = str(explained(keys_root, "app/1/kernels", spaced, *raw)["hint"])
    assert "'app/1/kernels' stores [\"matmul\",4096]" in hint, hint
    assert hint.endswith("""give KEY as '["matmul",4096]' with --raw-key"""), hint


@pytest.mark.parametrize(
    "args", [["42", "--raw-key"], ["k1"], ["nowhere"], ["nowhere", "--raw-key"], []]
)
def test_explain_gives_no_hint_when_the_key_is_found_or_found_in_no_form(
    keys_root: Path, args: list[str]
) -> None:
    assert explained(keys_root, "app/1/kernels", *args)["hint"] is None


# --- a file that is not a (whole) bundle --------------------------------------------


def bad_bundles(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Files a new user gives as a bundle, each with what its one line must say."""

    async def make() -> dict[str, bytes]:
        async with open_environment("src", root=tmp_path / "src") as env:
            entries = [(b"k%04d" % i, b"v" * 500) for i in range(400)]
            await env.storage(Namespace("app", "k", version="1")).insert_many(entries)
            made = {}
            for format in BundleFormat:
                out = tmp_path / f"whole.{format.value}"
                await export_bundle(env, out, name="n", version="1", format=format)
                made[format.value] = out.read_bytes()
            return made

    whole = anyio.run(make)
    sqlite, flat = whole["sqlite"], whole["flat"]
    cases = {
        "empty": (b"", "is empty (0 bytes), not a warmenv bundle; export it"),
        "gzip": (gzip.compress(sqlite), "is a gzip file, not a warmenv bundle; decompress it"),
        "page": (b"<!DOCTYPE html><title>404</title>", "is an HTML or XML page"),
        "sqlite-magic": (sqlite[:10], "is a SQLite file cut short at byte 10 ("),
        "sqlite-header": (sqlite[:60], "is a SQLite file cut short at byte 60 ("),
        "sqlite-half": (
            sqlite[: len(sqlite) // 2],
            f"is a SQLite file cut short at byte {len(sqlite) // 2:,} "
            f"(the file needs {len(sqlite):,} bytes)",
        ),
        "flat-header": (flat[:40], "is a flat warmenv bundle cut short at byte 40 ("),
        "flat-index": (flat[:1000], "is a flat warmenv bundle cut short at byte 1,000 ("),
        "flat-data": (
            flat[:-100],
            f"is a flat warmenv bundle cut short at byte {len(flat) - 100:,} "
            f"(its entries reach byte {len(flat):,})",
        ),
    }
    made = {}
    for name, (data, says) in cases.items():
        path = tmp_path / f"{name}.bundle"
        path.write_bytes(data)
        made[name] = (path, says)
    return made


def test_import_and_check_say_in_one_line_what_a_file_that_is_no_whole_bundle_is(
    tmp_path: Path,
) -> None:
    for name, (path, says) in bad_bundles(tmp_path).items():
        lines = {
            command: assert_one_error_line(warmenv(command, str(path), root=tmp_path / "r"), 1)
            for command in ["import", "check", "inspect", "verify"]
        }
        assert len(set(lines.values())) == 1, (name, lines)  # every command says the same
        line = lines["import"]
        assert line.startswith(f"warmenv: error: {path} {says}"), (name, line)
        assert "corrupt" not in line and "malformed" not in line, (name, line)
        assert re.search(r"; (export|copy|decompress|check)", line), (name, line)  # the fix


@pytest.mark.anyio
async def test_open_bundle_and_each_format_s_opener_name_what_the_file_is(
    tmp_path: Path,
) -> None:
    cases = await anyio.to_thread.run_sync(bad_bundles, tmp_path)
    for name, (path, says) in cases.items():
        with pytest.raises(BundleError) as raised:
            async with open_bundle(path):
                pass
        assert str(raised.value).startswith(f"{path} {says}"), (name, raised.value)
        cut = "cut short" in says and name != "sqlite-magic"  # a magic cut short: unknown
        assert isinstance(raised.value, CorruptBundleError if cut else NotABundleError), name
        own = SqliteBundle if name.startswith("sqlite") else FlatBundle
        if name.startswith(("sqlite", "flat")):  # the format's own opener says the same
            with pytest.raises(BundleError, match="^" + re.escape(f"{path} {says}")):
                async with own.open(path):
                    pass


@pytest.mark.anyio
async def test_a_format_s_opener_given_the_other_format_says_open_bundle_reads_both(
    tmp_path: Path, bundle_path: Path, bundle_format: str
) -> None:
    other = FlatBundle if bundle_format == "sqlite" else SqliteBundle
    with pytest.raises(NotABundleError, match="open_bundle opens a bundle of either format"):
        async with other.open(bundle_path):
            pass


# --- an environment's name where a namespace or a bundle goes ----------------------


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["stats"], "not a namespace: did you mean `warmenv stats --env svc`?"),
        (["explain"], "not a namespace: did you mean `warmenv explain NAMESPACE --env svc`?"),
        (["import"], "not a bundle file: to import a bundle into it, run `warmenv import BUNDLE"),
        (["check"], "not a bundle file: make a bundle of it first with `warmenv export OUT"),
        (["inspect"], "not a bundle file: make a bundle of it first"),
        (["verify"], "not a bundle file: make a bundle of it first"),
    ],
)
def test_an_environment_s_name_given_as_the_argument_hints_env(
    root: Path, command: list[str], says: str
) -> None:
    line = assert_one_error_line(warmenv(*command, "svc", root=root), 1)
    assert f"'svc' is an environment in {root}, {says}" in line, line
    assert "'nope' is an environment" not in warmenv(*command, "nope", root=root).stderr


def test_export_of_an_environment_s_name_as_its_source_hints_env(
    root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.bundle"
    line = assert_one_error_line(
        warmenv("export", str(out), "svc", "--name", "x", "--app-version", "1", root=root), 1
    )
    assert line.startswith("warmenv: error: svc does not exist; give an environment's .db"), line
    says = f"did you mean `warmenv export {out} --env svc`?"
    assert line.rstrip().endswith(f"'svc' is an environment in {root}: {says}"), line
    assert "name an environment" not in line and "not a file or root" not in line, line
    assert not out.exists()


def test_stats_and_explain_of_an_environment_s_name_hint_env_beside_a_default_one(
    root: Path,
) -> None:
    async def make_default() -> None:
        async with open_environment("default", root=root) as env:
            await env.storage(Namespace("app", "k", version="1")).insert_many([(b"k", b"v")])

    anyio.run(make_default)
    line = assert_one_error_line(warmenv("stats", "svc", root=root), 1)
    assert line.startswith("warmenv: error: no namespace matches 'svc'"), line
    assert line.rstrip().endswith("did you mean `warmenv stats --env svc`?"), line
    explained = warmenv("explain", "svc", "--json", root=root)
    assert explained.returncode == 0, explained.stderr
    assert "`warmenv explain NAMESPACE --env svc`" in json.loads(explained.stdout)["hint"]


# --- export: OUT and SOURCE in the wrong places -----------------------------------

EXPORT = ("--name", "x", "--app-version", "1")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The working directory of a command that might write a file named as typed."""
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


@pytest.fixture
def svc_bundle(root: Path, work: Path) -> Path:
    made = warmenv("export", "svc.bundle", "--env", "svc", *EXPORT, root=root, cwd=work)
    assert made.returncode == 0, made.stderr
    return work / "svc.bundle"


def test_export_with_out_and_source_swapped_is_refused_with_the_line_meant(
    root: Path, work: Path, svc_bundle: Path
) -> None:
    before = svc_bundle.read_bytes()
    swapped = warmenv("export", "svc", "svc.bundle", *EXPORT, root=root, cwd=work)
    line = assert_one_error_line(swapped, 2)
    assert f"OUT 'svc' is environment 'svc' in {root}, not a bundle file" in line, line
    assert "did you mean `warmenv export svc.bundle --env svc`?" in line, line
    assert sorted(p.name for p in work.iterdir()) == ["svc.bundle"]  # no file ./svc
    assert svc_bundle.read_bytes() == before


@pytest.mark.parametrize(
    ("sources", "meant"),
    [(["new.bundle"], "new.bundle"), ([], "svc.bundle")],
    ids=["a new bundle as SOURCE", "no SOURCE"],
)
def test_an_environment_s_name_as_out_is_refused_with_the_line_meant(
    root: Path, work: Path, sources: list[str], meant: str
) -> None:
    line = assert_one_error_line(
        warmenv("export", "svc", *sources, *EXPORT, root=root, cwd=work), 2
    )
    assert f"did you mean `warmenv export {meant} --env svc`?" in line, line
    assert "(to write a file named 'svc', give ./svc)" in line, line
    assert list(work.iterdir()) == []


def test_an_environment_s_name_as_out_written_as_a_path_is_a_file_of_that_name(
    root: Path, work: Path
) -> None:
    completed = warmenv("export", "./svc", "--env", "svc", *EXPORT, root=root, cwd=work)
    assert completed.returncode == 0, completed.stderr
    assert sorted(p.name for p in work.iterdir()) == ["svc"]


@pytest.mark.parametrize("bundle_format", ["sqlite", "flat"])
def test_a_bundle_is_never_an_export_source(root: Path, work: Path, bundle_format: str) -> None:
    made = warmenv(
        "export",
        "b.bundle",
        "--env",
        "svc",
        "--format",
        bundle_format,
        *EXPORT,
        root=root,
        cwd=work,
    )
    assert made.returncode == 0, made.stderr
    line = assert_one_error_line(
        warmenv("export", "o.bundle", "b.bundle", *EXPORT, root=root, cwd=work), 1
    )
    assert "b.bundle is a warmenv bundle, not an environment" in line, line
    assert "`warmenv import b.bundle --env NAME`" in line, line
    assert sorted(p.name for p in work.iterdir()) == ["b.bundle"]


def test_a_missing_source_named_like_a_bundle_hints_that_out_comes_first(
    root: Path, work: Path
) -> None:
    line = assert_one_error_line(
        warmenv("export", "elsewhere", "new.bundle", *EXPORT, root=root, cwd=work), 1
    )
    assert line.startswith("warmenv: error: new.bundle does not exist"), line
    assert "OUT, the bundle to write, comes first: did you mean `warmenv export new.bundle" in line
    assert list(work.iterdir()) == []


def test_export_without_out_names_only_out_as_required(root: Path) -> None:
    line = assert_one_error_line(warmenv("export", *EXPORT, root=root), 2)
    assert "the following arguments are required: OUT (see" in line, line
    assert "SOURCE" not in line.split("(see")[0], line


# --- export and stats --html: what is at OUT is never advised away ----------------


def test_export_onto_an_environment_says_which_and_leaves_it(root: Path) -> None:
    other = root / "other.db"
    before = other.read_bytes()
    line = assert_one_error_line(
        warmenv("export", str(other), "--env", "svc", *EXPORT, root=root), 1
    )
    assert (
        f"'{other}' is environment 'other' (a warmenv environment database), not a bundle; "
        "it was left as it is: choose another path for the bundle"
    ) in line, line
    assert "remove" not in line, line
    assert other.read_bytes() == before


def test_export_onto_a_directory_says_to_give_a_file_in_it(root: Path, work: Path) -> None:
    line = assert_one_error_line(
        warmenv("export", str(work), "--env", "svc", *EXPORT, root=root), 1
    )
    said = f"{work} is a directory: give a bundle file to write, such as {work}/NAME.bundle"
    assert said in line, line
    assert "remove" not in line, line
    assert list(work.iterdir()) == []


def test_stats_html_never_replaces_an_environment_and_replaces_its_own_page(
    root: Path, work: Path
) -> None:
    other = root / "other.db"
    before = other.read_bytes()
    line = assert_one_error_line(
        warmenv("stats", "--env", "svc", "--html", str(other), root=root), 1
    )
    assert f"'{other}' is environment 'other' (a warmenv environment database)" in line, line
    assert other.read_bytes() == before
    page = work / "stats.html"
    for _ in range(2):  # the second replaces the first page
        completed = warmenv("stats", "--env", "svc", "--html", str(page), root=root)
        assert completed.returncode == 0, completed.stderr
    assert page.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    "command",
    [
        ["export", "{dir}/x.bundle", "--env", "svc", *EXPORT],
        ["stats", "--env", "svc", "--html", "{dir}/x.html"],
        ["keygen", "{dir}/x.key"],
    ],
    ids=["export", "stats --html", "keygen"],
)
def test_a_missing_output_directory_is_said_alike_by_every_command(
    root: Path, tmp_path: Path, command: list[str]
) -> None:
    missing = tmp_path / "no-such-dir"
    args = [c.format(dir=missing) for c in command]
    line = assert_one_error_line(warmenv(*args, root=root), 1)
    assert line == f"warmenv: error: {missing} does not exist; create it first\n", line
    assert not missing.exists()
