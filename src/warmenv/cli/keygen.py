"""`warmenv keygen KEY`: make a key pair to sign bundles with.

The private key goes to KEY (PEM, mode 600, never replacing a file), the
public key to KEY.pub and to the output, one line (`ed25519:...`) to paste
into `trusted_keys` or `--trust` where bundles are imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import anyio.to_thread

from warmenv.bundle.signing import generate_key
from warmenv.cli._output import Output

# Accepted after every sub-command (a wrapper may pass them to all), but this one reads
# no environment: its --help does not offer them.
UNUSED_OPTIONS = ("--env", "--root", "--remote")


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "keygen",
        parents=[parent],
        help="make a key pair to sign bundles with",
        description="Write a new Ed25519 private key to KEY (mode 600: only you may read it) "
        "and its public key to KEY.pub, and print the public key: sign bundles with "
        "`warmenv export --sign KEY`, and trust the public key where they are imported "
        "(--trust, or trusted_keys in warmenv.toml). Never replaces a file.",
    )
    parser.add_argument("key", metavar="KEY", type=Path, help="the private key file to write")
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace, out: Output) -> int:
    key: Path = args.key
    public = await anyio.to_thread.run_sync(generate_key, key)
    public_file = key.with_name(key.name + ".pub")
    out.line(
        f"wrote the private key to {key} (keep it secret) and the public key to {public_file}:"
    )
    out.line(str(public))
    out.result(
        {"private_key": str(key), "public_key_file": str(public_file), "public_key": str(public)}
    )
    return 0
