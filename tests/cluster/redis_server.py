"""A real redis-server on loopback, started and stopped by the tests (imported by name)."""

from __future__ import annotations

import os
import shutil
import socket
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


class RedisServer:
    """One redis-server process on 127.0.0.1 (no persistence), which a test can stop and start."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
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
