"""Redis servers of the tests' own, on free ports, that a test may kill and restart.

The machine's shared server (127.0.0.1:6379) is never touched: each server
here is a child process with nothing kept on disk (unless a test gives it a
data directory, to restart it with its data). A missing `redis-server`
fails the test with the hint to install it; the remote tier is a feature, and
a skipped test would hide that it was never exercised.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import attrs
import pytest

__all__ = [
    "COREDIS_UNCLOSED_STREAMS",
    "Certificate",
    "RedisServer",
    "redis_server",
    "self_signed_certificate",
    "tolerating_coredis_streams",
]

READY = b"Ready to accept connections"

# coredis 6.9 leaves a connection's memory streams unclosed when connecting
# fails or is cancelled (connection/_base.py `run`: `_connect()` raises before
# the `async with` that closes them); the GC reclaims them. Modules whose tests
# close a tier while it connects ignore only those warnings.
T = TypeVar("T")

COREDIS_UNCLOSED_STREAMS = [
    pytest.mark.filterwarnings("ignore:Unclosed <MemoryObject:ResourceWarning"),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <function MemoryObject"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]


def tolerating_coredis_streams(test: T) -> T:
    """COREDIS_UNCLOSED_STREAMS for one test, where the rest of its module uses no tier.

    The `coredis_streams` mark makes conftest collect garbage as the test
    ends, so the warnings surface (and are ignored) here, not in a later test.
    """
    for mark in [*COREDIS_UNCLOSED_STREAMS, pytest.mark.coredis_streams]:
        mark(test)  # a mark records itself on the function it decorates
    return test


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class RedisServer:
    """One `redis-server` child on 127.0.0.1:`port`; `stop` and `start` again at will."""

    def __init__(
        self,
        password: str | None = None,
        data_dir: Path | None = None,
        tls: Path | None = None,
        tls_name: str = "IP:127.0.0.1",
        options: Sequence[str] = (),
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("install redis-server: the remote tier's tests run their own servers")
        self.binary = binary
        self.password = password
        # With a directory, every write is in its append-only file before Redis
        # answers it (`appendfsync always`): a killed server restarts with its data.
        self.data_dir = data_dir
        # With a directory for its certificate, the server speaks TLS only (rediss://).
        # `tls_name`: the subjectAltName it is for (another one: a host name mismatch).
        self.certificate = None if tls is None else self_signed_certificate(tls, tls_name)
        self.port = free_port()
        self.options = list(options)  # more of redis-server's own, such as --rename-command
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.certificate is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        # The documented way to trust a private CA (docs/fleet.md).
        return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.certificate.cert}"

    def start(self) -> None:
        assert self.process is None, "already running"
        args = [self.binary, "--bind", "127.0.0.1"]
        if self.certificate is None:
            args += ["--port", str(self.port)]
        else:
            cert, key = str(self.certificate.cert), str(self.certificate.key)
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert]
        args += ["--save", "", "--loglevel", "notice"]
        if self.data_dir is None:
            args += ["--appendonly", "no"]
        else:
            args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.data_dir)]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.options
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert process.stdout is not None
        seen = []
        # The server says when it listens: read its log up to that line.
        for line in process.stdout:
            seen.append(line)
            if READY in line:
                break
        else:
            process.wait()
            raise RuntimeError(f"redis-server did not start: {b''.join(seen).decode()!r}")
        self.process = process

    def stop(self) -> None:
        """Kill the server (as a crash would) and wait for it to be gone."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()
        self.process = None


@attrs.frozen
class Certificate:
    """A self-signed certificate for 127.0.0.1, its own CA, and its key."""

    cert: Path
    key: Path


def self_signed_certificate(directory: Path, name: str = "IP:127.0.0.1") -> Certificate:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("install openssl: the rediss:// tests make their server a certificate")
    directory.mkdir(parents=True, exist_ok=True)
    made = Certificate(directory / "cert.pem", directory / "key.pem")
    args = [binary, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    args += ["-nodes", "-days", "1", "-subj", f"/CN={name.partition(':')[2]}"]
    args += ["-addext", f"subjectAltName={name}"]
    args += ["-keyout", str(made.key), "-out", str(made.cert)]
    subprocess.run(args, check=True, capture_output=True)
    return made


@contextmanager
def redis_server(
    password: str | None = None,
    tls: Path | None = None,
    tls_name: str = "IP:127.0.0.1",
    options: Sequence[str] = (),
) -> Iterator[RedisServer]:
    server = RedisServer(password, tls=tls, tls_name=tls_name, options=options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
