from __future__ import annotations

import os
import uuid

import pytest
from redis_server import RedisServer, redis_server_binary

#: Set by .ci/run to the redis-server it started on loopback.
URL_ENV = "KVCORE_REDIS_URL"


class _External:
    def __init__(self, url: str) -> None:
        self.url = url


@pytest.fixture(scope="session")
def redis_session(tmp_path_factory):
    """A redis-server for the whole session (tests use their own namespaces).

    CI's (``KVCORE_REDIS_URL``), or one started here on a free loopback port.
    """
    if os.environ.get(URL_ENV):
        yield _External(os.environ[URL_ENV])
        return
    server = RedisServer(redis_server_binary(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_server(tmp_path):
    """A redis-server of the test's own, which the test may stop and start again."""
    server = RedisServer(redis_server_binary(), tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"
