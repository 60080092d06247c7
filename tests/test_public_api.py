"""Every name the API contract (API.md) promises is importable from where it says.

The table below is the contract's list, module by module; a name moved or
dropped from a module's `__all__` breaks users' imports, so it fails here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import warmenv
from helpers import json_lines, run_python

# Module -> the public names API.md places there (0.1 and the 0.2 additions built so far).
CONTRACT: dict[str, list[str]] = {
    "warmenv.sync": [
        "Lock",
        "Semaphore",
        "Event",
        "Condition",
        "CapacityLimiter",
        "RLock",
        "RWLock",
        "OnceCell",
    ],
    "warmenv.channel": [
        "bounded",
        "unbounded",
        "oneshot",
        "OneshotSender",
        "OneshotReceiver",
        "ChannelClosed",
    ],
    "warmenv.future": [
        "Future",
        "TaskHandle",
        "create_task_group",
        "gather",
        "block_on",
        "spawn_detached",
    ],
    "warmenv.stream": [
        "StreamPolicy",
        "set_policy",
        "policy",
        "StreamId",
        "current",
        "new",
        "enter",
        "apply_config",
    ],
    "warmenv.config": ["Config", "load_config", "ConfigError"],
    "warmenv.persistence": [
        "Namespace",
        "Origin",
        "Insertion",
        "Stored",
        "Conflict",
        "Failed",
        "InsertSummary",
        "NamespaceSummary",
        "Storage",
        "MemoryStorage",
        "Store",
        "CacheMode",
        "JsonCodec",
        "BytesCodec",
        "MISSING",
        "Missing",
    ],
    "warmenv.environment": ["open_environment", "Environment", "activate", "set_root", "active"],
    "warmenv.bundle": [
        "BundleManifest",
        "EnvironmentInfo",
        "BundleFormat",
        "Bundle",
        "SqliteBundle",
        "FlatBundle",
        "open_bundle",
        "BundleError",
        "BundleNotFoundError",
        "NotABundleError",
        "InvalidManifestError",
        "UnsupportedSchemaError",
        "CorruptBundleError",
        "BundleTooLargeError",
        "import_bundle",
        "importing",
        "ImportReport",
        "export_bundle",
        "exporting",
        "ExportReport",
        "preflight",
        "Preflight",
        "Started",
        "Progress",
        "Finished",
        "warm_up",
        "WarmUp",
        "WarmUpState",
        "generate_key",
        "SigningKey",
        "PublicKey",
        "Trust",
        "Signature",
        "SignatureError",
        "KeyFileError",
        "SigningUnavailableError",
    ],
    "warmenv.blocking": [
        "open",
        "open_environment",
        "BlockingEnvironment",
        "BlockingStore",
        "import_bundle",
        "export_bundle",
        "warm_up",
        "BlockingWarmUp",
        "EventLoopThreadError",
    ],
}

# The public attributes of `Environment` that `BlockingEnvironment` does not
# mirror, each with the reason. Every other one must have a blocking twin with
# the same parameters (see the test below), so a method added to the async
# environment fails there until it is mirrored or listed here.
NOT_MIRRORED_BY_BLOCKING: dict[str, str] = {
    "storage": "storages are async, usable on the loop thread only; env.store(ns) is the twin",
    "database": "the open SqliteDatabase, usable on the loop thread only (env.environment)",
    "arrivals": "the imports' announcements to the loop's stores: used on the loop thread only",
    "flush_statistics": "statistics() includes unflushed counts; the loop thread flushes them",
    "run_statistics_flusher": "run by open_environment on the loop thread",
    "bulk_copy": "an import's internals (warmenv.blocking.import_bundle)",
    "insert_imported": "an import's internals (warmenv.blocking.import_bundle)",
    "snapshot_directory": "an import's internals (warmenv.blocking.import_bundle)",
    "bundle_signers": "read by warmenv.caches.restore under require_signature, on the loop",
    "touch": "a store's internals (hit recency, batched by the store)",
    "start_soon": "background work runs on the loop thread (warmenv.blocking.warm_up)",
    "set_task_group": "open_environment's block owns the task group, on the loop thread",
    "record_import": "a warm-up's internals (warmenv.blocking.warm_up)",
}

# The public attributes of `Store` that `BlockingStore` does not mirror, each
# with the reason; every other one must have a blocking twin with its parameters.
NOT_MIRRORED_BY_BLOCKING_STORE: dict[str, str] = {
    "open": "a blocking store is opened by BlockingEnvironment.store(ns)",
    "storage": "storages are async, usable on the loop thread only (store.store.storage)",
    "get_nowait": "a blocking get() of a held value never leaves its thread: get is the twin",
    "aclose": "the store's counts are flushed by its environment when the `with` block ends",
    "held": "the memory both faces share: the store's internals, not the API",
    "compute_held": "the computation both faces share: the store's internals, not the API",
    "hit_path": "the hit path both faces share (behind a ttl's check): the store's internals",
}

# What a user of stores and environments imports from the package itself.
TOP_LEVEL = [
    "WarmenvError",
    "ConfigError",
    "Config",
    "load_config",
    "open_environment",
    "Environment",
    "activate",
    "set_root",
    "active",
    "Namespace",
    "Origin",
    "Insertion",
    "Stored",
    "Conflict",
    "Failed",
    "Purged",
    "InsertSummary",
    "NamespaceSummary",
    "Storage",
    "MemoryStorage",
    "Store",
    "CacheMode",
    "Codec",
    "JsonCodec",
    "BytesCodec",
    "MISSING",
    "Missing",
    "RemoteSettings",
]


@pytest.mark.parametrize(
    ("module", "name"), [(module, name) for module, names in CONTRACT.items() for name in names]
)
def test_every_contract_name_is_exported_from_its_module(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    assert name in imported.__all__, f"{module}.__all__ lacks {name}"
    assert getattr(imported, name) is not None


@pytest.mark.parametrize(
    "module",
    [
        "warmenv",
        "warmenv.blocking",
        "warmenv.bundle",
        "warmenv.persistence",
        "warmenv.caches",
        "warmenv.remote",
    ],
)
def test_a_public_package_lists_no_name_of_its_future_import(module: str) -> None:
    assert "annotations" not in dir(importlib.import_module(module))


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_the_store_and_environment_names_are_importable_from_warmenv(name: str) -> None:
    assert name in warmenv.__all__, f"warmenv.__all__ lacks {name}"
    assert getattr(warmenv, name) is not None


def test_top_level_names_are_the_same_objects_as_in_their_modules() -> None:
    """One definition each: `warmenv.X is warmenv.<module>.X`, nothing defined twice.

    warmenv.blocking is the exception by design: its names are the synchronous
    twins of the async ones (`warmenv.blocking.open_environment`).
    """
    modules = [importlib.import_module(m) for m in CONTRACT if m != "warmenv.blocking"]
    for name in warmenv.__all__:
        if name == "__version__":
            continue
        homes = [module for module in modules if name in getattr(module, "__all__", ())]
        for module in homes:
            assert getattr(module, name) is getattr(warmenv, name), f"{module.__name__}.{name}"


def public_attributes(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_every_environment_method_has_a_blocking_twin_with_its_parameters() -> None:
    from warmenv import Environment
    from warmenv.blocking import BlockingEnvironment

    mirrored = public_attributes(Environment) - NOT_MIRRORED_BY_BLOCKING.keys()
    missing = sorted(mirrored - public_attributes(BlockingEnvironment))
    assert not missing, f"BlockingEnvironment lacks {missing}"
    for name in sorted(mirrored):
        theirs, ours = getattr(Environment, name), getattr(BlockingEnvironment, name)
        if not callable(theirs):  # a property or a slot: present is all there is to it
            continue
        assert not inspect.iscoroutinefunction(ours), f"BlockingEnvironment.{name} is async"
        expected = list(inspect.signature(theirs).parameters.values())
        actual = list(inspect.signature(ours).parameters.values())
        assert actual == expected, f"BlockingEnvironment.{name}{inspect.signature(ours)}"


def test_what_blocking_does_not_mirror_it_really_lacks() -> None:
    from warmenv import Environment
    from warmenv.blocking import BlockingEnvironment

    stale = NOT_MIRRORED_BY_BLOCKING.keys() & public_attributes(BlockingEnvironment)
    assert not stale, f"mirrored now, drop from NOT_MIRRORED_BY_BLOCKING: {sorted(stale)}"
    unknown = NOT_MIRRORED_BY_BLOCKING.keys() - public_attributes(Environment)
    assert not unknown, f"not attributes of Environment: {sorted(unknown)}"


def test_missing_is_the_one_sentinel_everywhere() -> None:
    from warmenv.persistence import MISSING

    assert warmenv.MISSING is MISSING
    assert isinstance(warmenv.MISSING, warmenv.Missing)
    assert repr(warmenv.MISSING) == "MISSING"


def test_the_event_loop_thread_error_stays_in_blocking_and_is_a_warmenv_error() -> None:
    from warmenv.blocking import EventLoopThreadError

    assert "EventLoopThreadError" not in warmenv.__all__
    assert issubclass(EventLoopThreadError, warmenv.WarmenvError)
    assert issubclass(EventLoopThreadError, RuntimeError)


def test_the_installed_version_is_the_one_written_in_the_package() -> None:
    # pyproject.toml reads it from warmenv/__init__.py: `warmenv --version`, the
    # package metadata and the changelog's release cannot drift apart.
    assert importlib.metadata.version("warmenv") == warmenv.__version__
    assert warmenv.__version__.startswith("0.2.")


def test_blocking_open_environment_takes_what_open_environment_takes() -> None:
    # It took neither create, max_bytes nor statistics.
    from warmenv.blocking import open_environment as open_blocking

    theirs = inspect.signature(warmenv.open_environment).parameters
    ours = inspect.signature(open_blocking).parameters
    assert list(ours) == list(theirs)
    assert [p.default for p in ours.values()] == [p.default for p in theirs.values()]


def twin_parameters(theirs: Callable[..., object], ours: Callable[..., object], name: str) -> None:
    """`ours` takes what `theirs` takes: names, kinds, defaults, in order; and is not async."""
    assert not inspect.iscoroutinefunction(ours), f"{name} is async"
    expected = [(p.name, p.kind, p.default) for p in inspect.signature(theirs).parameters.values()]
    actual = [(p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()]
    assert actual == expected, f"{name}{inspect.signature(ours)}"


def test_every_store_method_has_a_blocking_twin_with_its_parameters() -> None:
    from warmenv import Store
    from warmenv.blocking import BlockingStore

    mirrored = public_attributes(Store) - NOT_MIRRORED_BY_BLOCKING_STORE.keys()
    missing = sorted(mirrored - public_attributes(BlockingStore))
    assert not missing, f"BlockingStore lacks {missing}"
    for name in sorted(mirrored):
        theirs, ours = getattr(Store, name), getattr(BlockingStore, name)
        if not callable(theirs):  # a property or a slot: present is all there is to it
            continue
        twin_parameters(theirs, ours, f"BlockingStore.{name}")


def test_what_the_blocking_store_does_not_mirror_it_really_lacks() -> None:
    from warmenv import Store
    from warmenv.blocking import BlockingStore

    stale = NOT_MIRRORED_BY_BLOCKING_STORE.keys() & public_attributes(BlockingStore)
    assert not stale, f"mirrored now, drop from NOT_MIRRORED_BY_BLOCKING_STORE: {sorted(stale)}"
    unknown = NOT_MIRRORED_BY_BLOCKING_STORE.keys() - public_attributes(Store)
    assert not unknown, f"not attributes of Store: {sorted(unknown)}"


@pytest.mark.parametrize("name", ["import_bundle", "export_bundle"])
def test_the_blocking_bundle_functions_take_every_option_of_the_async_ones(name: str) -> None:
    # Derived from the async signature: an option added there fails here
    # until warmenv.blocking forwards it (import_bundle lacked download=).
    import warmenv.blocking
    import warmenv.bundle

    theirs = inspect.signature(getattr(warmenv.bundle, name)).parameters
    ours = dict(inspect.signature(getattr(warmenv.blocking, name)).parameters)
    progress = ours.pop("progress")
    assert (progress.kind, progress.default) == (inspect.Parameter.KEYWORD_ONLY, None)
    assert list(ours) == list(theirs)
    for parameter in theirs.values():
        mine = ours[parameter.name]
        assert (mine.kind, mine.default) == (parameter.kind, parameter.default), mine
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:  # an option: the same type
            assert mine.annotation == parameter.annotation, mine
    if name == "import_bundle":  # the source: whatever the async form takes
        assert ours["source"].annotation == theirs["source"].annotation


def test_the_blocking_warm_up_takes_every_option_of_the_async_one() -> None:
    # The blocking one runs in its environment's block: it takes no task group.
    import warmenv.blocking
    import warmenv.bundle

    theirs = dict(inspect.signature(warmenv.bundle.warm_up).parameters)
    assert theirs.pop("task_group").default is None
    ours = inspect.signature(warmenv.blocking.warm_up).parameters
    assert list(ours) == list(theirs)
    for parameter in theirs.values():
        mine = ours[parameter.name]
        assert (mine.kind, mine.default) == (parameter.kind, parameter.default), mine
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            assert mine.annotation == parameter.annotation, mine


def test_every_way_of_importing_takes_the_one_definition_of_the_import_options() -> None:
    # Issue 19: the options are written once (ImportOptions); a face that listed one by
    # hand beside them, or took others, would be where a new option goes missing.
    import warmenv.blocking
    import warmenv.bundle
    from warmenv.bundle import ImportOptions
    from warmenv.bundle.importing import importing

    faces: dict[str, Callable[..., object]] = {
        "warmenv.bundle.import_bundle": warmenv.bundle.import_bundle,
        "warmenv.bundle.importing": importing,
        "warmenv.bundle.warm_up": warmenv.bundle.warm_up,
        "warmenv.blocking.import_bundle": warmenv.blocking.import_bundle,
        "warmenv.blocking.warm_up": warmenv.blocking.warm_up,
    }
    for name, face in faces.items():
        parameters = inspect.signature(face).parameters
        (options,) = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        assert options.annotation == "Unpack[ImportOptions]", f"{name}{inspect.signature(face)}"
        assert not parameters.keys() & ImportOptions.__optional_keys__, name
    assert ImportOptions.__optional_keys__ == ImportOptions.__annotations__.keys()


def test_every_way_of_exporting_takes_the_one_definition_of_the_export_options() -> None:
    # Issue 19: as for imports, the export options are written once (ExportOptions).
    import warmenv.blocking
    import warmenv.bundle
    from warmenv.bundle import ExportOptions

    faces: dict[str, Callable[..., object]] = {
        "warmenv.bundle.export_bundle": warmenv.bundle.export_bundle,
        "warmenv.bundle.exporting": warmenv.bundle.exporting,
        "warmenv.blocking.export_bundle": warmenv.blocking.export_bundle,
    }
    keys = ExportOptions.__required_keys__ | ExportOptions.__optional_keys__
    for name, face in faces.items():
        parameters = inspect.signature(face).parameters
        (options,) = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        assert options.annotation == "Unpack[ExportOptions]", f"{name}{inspect.signature(face)}"
        assert not parameters.keys() & keys, name
    assert keys == ExportOptions.__annotations__.keys()
    assert ExportOptions.__required_keys__ == {"name", "version"}


def test_a_warm_up_takes_every_option_of_import_bundle() -> None:
    # A new import option must reach every way of importing: warm_up lacked trust= once.
    import warmenv.bundle

    theirs = dict(inspect.signature(warmenv.bundle.import_bundle).parameters)
    ours = dict(inspect.signature(warmenv.bundle.warm_up).parameters)
    assert ours.pop("task_group").default is None
    assert ours.pop("on_event").default is None
    assert list(ours) == list(theirs)
    for parameter in theirs.values():
        mine = ours[parameter.name]
        assert (mine.kind, mine.default) == (parameter.kind, parameter.default), mine
        assert mine.annotation == parameter.annotation, mine


def test_the_blocking_warm_up_handle_has_what_the_async_one_has() -> None:
    from warmenv.blocking import BlockingWarmUp
    from warmenv.bundle import WarmUp

    assert public_attributes(BlockingWarmUp) == public_attributes(WarmUp)
    for name in sorted(public_attributes(WarmUp)):
        theirs, ours = getattr(WarmUp, name), getattr(BlockingWarmUp, name)
        if not callable(theirs):
            continue
        assert not inspect.iscoroutinefunction(ours), f"BlockingWarmUp.{name} is async"
        twin_parameters(theirs, ours, f"BlockingWarmUp.{name}")
        # The same types in and out, too: wait(timeout) answers whether it ended on both.
        mine, their = inspect.signature(ours), inspect.signature(theirs)
        assert mine.return_annotation == their.return_annotation, f"BlockingWarmUp.{name}"
        assert [p.annotation for p in mine.parameters.values()] == [
            p.annotation for p in their.parameters.values()
        ], f"BlockingWarmUp.{name}{mine}"


def test_a_bundle_function_named_like_its_module_is_the_function() -> None:
    # warmenv.bundle imports its names at first use; importing the submodule
    # `warmenv.bundle.importing` first must not leave the module where the function was.
    child = run_python(
        textwrap.dedent(
            """
            import json
            import warmenv.bundle.exporting, warmenv.bundle.importing, warmenv.bundle.preflight
            from warmenv import bundle
            from warmenv.bundle import importing
            found = [bundle.importing, bundle.exporting, bundle.preflight, importing]
            print(json.dumps([type(f).__name__ for f in found]))
            """
        )
    )
    assert json_lines(child) == [["function"] * 4]


def test_import_warmenv_and_a_local_environment_import_nothing_of_the_shared_tier(
    tmp_path: Path,
) -> None:
    # The Redis tier's room (its wire, coredis) is imported where a tier is configured:
    # a process without one (every compiler hook, most library users) never pays for it.
    child = run_python(
        textwrap.dedent(
            """
            import json, sys
            import anyio
            import warmenv, warmenv.environment, warmenv.blocking

            def shared_tier():
                return sorted(m for m in sys.modules if m.startswith(("warmenv.remote", "coredis")))

            imported = [shared_tier()]

            async def main():
                async with warmenv.open_environment("e", root=sys.argv[1], remote=""):
                    pass

            anyio.run(main)
            imported.append(shared_tier())
            from warmenv import RemoteSettings
            import warmenv.remote
            imported.append(RemoteSettings is warmenv.remote.RemoteSettings)
            print(json.dumps(imported))
            """
        ),
        str(tmp_path),
    )
    assert json_lines(child) == [[[], [], True]]


def test_a_command_on_an_environment_without_a_tier_imports_nothing_of_it(tmp_path: Path) -> None:
    # `warmenv run` wraps a pod's entrypoint and `warmenv ls/stats` are run by hand: without a
    # configured remote, none of them pays for the Redis tier's room (its wire, coredis).
    child = run_python(
        textwrap.dedent(
            """
            import contextlib, io, json, sys
            import anyio
            import warmenv
            from warmenv.cli import main

            async def made():
                async with warmenv.open_environment("e", root=sys.argv[1], remote=""):
                    pass

            anyio.run(made)
            codes = []
            for command in (["ls"], ["stats", "--env", "e"]):
                with contextlib.redirect_stdout(io.StringIO()):
                    codes.append(main([*command, "--root", sys.argv[1]]))
            tier = sorted(m for m in sys.modules if m.startswith(("warmenv.remote", "coredis")))
            print(json.dumps([codes, tier]))
            """
        ),
        str(tmp_path),
    )
    assert json_lines(child) == [[[0, 0], []]]
