"""A real redis-server on loopback, started and stopped by the tests (imported by name)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

#: Set by .ci/run: a missing redis-server fails the Redis tests instead of skipping them.
REQUIRE_ENV = "KVCORE_REQUIRE_REDIS"


def redis_server_binary() -> str:
    """The redis-server executable; skips (or fails under CI) when there is none."""
    binary = shutil.which("redis-server")
    if binary is None:
        reason = (
            "redis-server is not installed: the Redis index tests talk to a real server "
            "(apt-get install redis-server)"
        )
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason}; {REQUIRE_ENV} is set, so this is an error")
        pytest.skip(reason)
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throw-away certificate authority and a server certificate for 127.0.0.1 (openssl).

    Returns:
        ``(ca.crt, server.crt, server.key)``.
    """
    if shutil.which("openssl") is None:
        reason = "openssl is not installed: the Redis TLS test makes its certificates with it"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason}; {REQUIRE_ENV} is set, so this is an error")
        pytest.skip(reason)
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    key, csr, crt = folder / "server.key", folder / "server.csr", folder / "server.crt"
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca_crt, "-days", "1"]
        + ["-subj", "/CN=kvcore test CA"],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial"]
        + ["-out", crt, "-days", "1", "-extfile", ext],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return ca_crt, crt, key


class RedisServer:
    """One redis-server process on 127.0.0.1 (no persistence), which a test can stop and start.

    Args:
        binary: The redis-server executable.
        workdir: Its working folder.
        tls: ``(ca.crt, server.crt, server.key)``: serve TLS only (``rediss://``).
    """

    def __init__(
        self, binary: str, workdir: Path, tls: tuple[Path, Path, Path] | None = None
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls[0]}"
        return f"redis://127.0.0.1:{self.port}"

    def _arguments(self) -> list[str]:
        args = [self.binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.workdir)]
        if self.tls is None:
            return [*args, "--port", str(self.port)]
        ca, crt, key = self.tls
        return [
            *args,
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(crt),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(ca),
            "--tls-auth-clients",
            "no",
        ]

    def _pings(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
            if self.tls is None:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
            context = ssl.create_default_context(cafile=str(self.tls[0]))
            with context.wrap_socket(conn, server_hostname="127.0.0.1") as secure:
                secure.sendall(b"PING\r\n")
                return secure.recv(16).startswith(b"+PONG")

    def start(self) -> None:
        self.process = subprocess.Popen(
            self._arguments(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self._pings():
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail(f"redis-server did not answer on port {self.port} within 10 s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
