"""A shared Redis: TLS (``rediss://``), ACL users (``user:password@``), key namespaces.

Against real redis-servers: one serving TLS only, with a certificate made for
the test by openssl, and ACL users made with ``ACL SETUSER``.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from clusterhelpers import Engine, full, layout, prompt_hits, window
from redis_server import RedisServer, make_certificates, redis_server_binary

import kvcore
from kvcore.cluster import ClusterIndex, IndexUnavailableError, RedisBackend
from kvcore.testing import admit

SPECS = [full(), window()]


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("redis-tls")
    server = RedisServer(redis_server_binary(), folder, tls=make_certificates(folder))
    server.start()
    yield server
    server.stop()


def follow_one_engine(url: str, namespace: str, **backend_options) -> ClusterIndex:
    """An index on ``url`` that has applied one engine's 12-token prompt."""
    index = ClusterIndex(
        layout(SPECS), RedisBackend(url, 2, namespace=namespace, **backend_options)
    )
    engine = Engine("a", SPECS)
    admit(engine.manager, kvcore.Request("r", list(range(12))))
    index.submit("a", *engine.publish())
    return index


def test_a_rediss_url_talks_tls_and_checks_the_certificate(tls_server, namespace):
    index = follow_one_engine(tls_server.url, namespace)
    try:
        assert prompt_hits(index, range(13)) == {"a": 12}
        assert index.cached_blocks("a") == 6
    finally:
        index.close()
    # Without the test's authority the server's certificate is not trusted.
    untrusted = f"rediss://127.0.0.1:{tls_server.port}/0"
    index = follow_one_engine(untrusted, namespace, socket_timeout_s=2.0)
    try:
        with pytest.raises(IndexUnavailableError, match=r"unreachable.*certificate verify failed"):
            index.flush()
    finally:
        index.close()
    # Plain text to a TLS port does not get through either.
    index = follow_one_engine(
        f"redis://127.0.0.1:{tls_server.port}", namespace, socket_timeout_s=1.0
    )
    try:
        with pytest.raises(IndexUnavailableError):
            index.flush()
    finally:
        index.close()


@pytest.fixture
def acl_user(redis_session, namespace):
    """A Redis user allowed every non-dangerous command on ``NAMESPACE:*`` keys only."""
    admin = redis.Redis.from_url(redis_session.url)
    name, password = f"kv-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.acl_setuser(
        name,
        enabled=True,
        passwords=[f"+{password}"],
        keys=[f"{namespace}:*"],
        commands=["+@all", "-@dangerous"],
    )
    yield name, password
    admin.acl_deluser(name)
    admin.close()


def with_credentials(url: str, user: str, password: str) -> str:
    return url.replace("redis://", f"redis://{user}:{password}@", 1)


def test_a_user_limited_to_the_namespace_runs_the_index(redis_session, namespace, acl_user):
    user, password = acl_user
    index = follow_one_engine(with_credentials(redis_session.url, user, password), namespace)
    try:
        assert prompt_hits(index, range(13)) == {"a": 12}
        assert index.cached_blocks("a") == 6
    finally:
        index.close()


def test_a_wrong_password_is_an_outage_that_does_not_show_the_password(
    redis_session, namespace, acl_user
):
    user, _ = acl_user
    url = with_credentials(redis_session.url, user, "not-the-password")
    index = follow_one_engine(url, namespace)
    try:
        with pytest.raises(IndexUnavailableError) as raised:
            index.flush()
        assert "not-the-password" not in str(raised.value)
        assert "***" in str(raised.value)
    finally:
        index.close()


def test_keys_outside_the_users_namespace_are_refused(redis_session, namespace, acl_user):
    user, password = acl_user
    url = with_credentials(redis_session.url, user, password)
    index = follow_one_engine(url, f"{namespace}-other")
    try:
        with pytest.raises(IndexUnavailableError, match="NoPermissionError"):
            index.flush()
    finally:
        index.close()


def test_every_key_lives_under_the_namespace(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    try:
        index = follow_one_engine(redis_server.url, "fleet-a")
        index.heartbeat("b")
        assert prompt_hits(index, range(13)) == {"a": 12, "b": 0}
        index.close()
        keys = sorted(client.scan_iter(count=1000))
        assert keys
        assert all(key.startswith(b"fleet-a:") for key in keys), keys
    finally:
        client.close()


def test_a_namespace_with_a_separator_is_refused():
    with pytest.raises(kvcore.errors.InvalidConfigError, match="namespace must be"):
        RedisBackend("redis://127.0.0.1:1", 1, namespace="a:b")
