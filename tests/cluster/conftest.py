from __future__ import annotations

import os
import uuid

import pytest
from clusterhelpers import layout
from redis_server import RedisServer, redis_server_binary

from kvcore.cluster import ClusterIndex, EmbeddedBackend

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


@pytest.fixture(params=["embedded", "redis"])
def make_index(request):
    """Indexes on the in-process backend and on a real Redis (one namespace per index).

    ``make(specs, num_blocks=40, hash_algorithm="fast", **index_options)``:
    ``num_blocks`` is the layout's pool size, the default bound of an
    engine's entries.
    """
    made = []

    def make(specs, num_blocks=40, hash_algorithm="fast", **kwargs):
        lay = layout(specs, num_blocks, hash_algorithm)
        if request.param == "embedded":
            index = ClusterIndex(lay, EmbeddedBackend(), **kwargs)
        else:
            from kvcore.cluster import RedisBackend

            server = request.getfixturevalue("redis_session")
            namespace = f"test-{uuid.uuid4().hex[:10]}"
            groups = len(lay.config.kv_cache_groups)
            backend = RedisBackend(server.url, groups, namespace=namespace)
            index = ClusterIndex(lay, backend, **kwargs)
        made.append(index)
        return index

    yield make
    for index in made:
        index.close()
