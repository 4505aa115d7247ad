"""The core and the index work without the fleet extra; its parts say how to get it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent(
    """
    import sys

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("msgspec", "zmq", "redis"):
                raise ImportError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Blocker())
    """
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_kvcore_and_the_embedded_index_import_without_the_extra():
    result = run(
        """
        import kvcore, kvcore.cluster
        from kvcore.cluster import ClusterIndex, Router
        print("ok", "msgspec" in sys.modules, "zmq" in sys.modules, "redis" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "False", "False", "False"]


def test_the_wire_zmq_and_redis_name_the_extra_to_install():
    for use, what in (
        ("c.encode_batch", "msgspec"),
        ("c.EventPublisher", "msgspec"),
        ("c.RedisBackend('redis://127.0.0.1:1', 1)", "redis"),
    ):
        result = run(f"import kvcore.cluster as c\n{use}")
        assert result.returncode == 1
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("kvcore.cluster._errors.MissingExtraError: ")
        assert f"needs the {what!r} package" in last
        assert "pip install 'kvcore[fleet]'" in last
