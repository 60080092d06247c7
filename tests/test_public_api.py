"""Every name the API contract (API.md) promises is importable from where it says.

The table below is the contract's list, module by module; a name moved or
dropped from a module's `__all__` breaks users' imports, so it fails here.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest

import warmenv

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
    ],
    "warmenv.blocking": [
        "open_environment",
        "BlockingEnvironment",
        "BlockingStore",
        "import_bundle",
        "export_bundle",
        "EventLoopThreadError",
    ],
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
]


@pytest.mark.parametrize(
    ("module", "name"), [(module, name) for module, names in CONTRACT.items() for name in names]
)
def test_every_contract_name_is_exported_from_its_module(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    assert name in imported.__all__, f"{module}.__all__ lacks {name}"
    assert getattr(imported, name) is not None


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
