"""The exceptions of the cluster layer (events on the wire, the cluster index, the router)."""

from __future__ import annotations

import importlib
from types import ModuleType

from kvcore.errors import InvalidConfigError, KVCoreError

__all__ = [
    "EventFormatError",
    "IndexUnavailableError",
    "InvalidConfigError",
    "MissingExtraError",
    "require",
]


class MissingExtraError(KVCoreError, ImportError):
    """A cluster feature needs a package of the ``fleet`` extra that is not installed."""


class IndexUnavailableError(KVCoreError, ConnectionError):
    """The cluster index's backend (Redis) cannot be reached; routing falls back to load."""


class EventFormatError(KVCoreError, ValueError):
    """A KV event payload is not a valid event batch (neither kvcore's nor vLLM's format)."""


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` (a package of the ``fleet`` extra) or say how to install it.

    Args:
        module: The import name (``"msgspec"``, ``"zmq"``, ``"redis"``).
        feature: What needs it, for the message (e.g. ``"the Redis index"``).

    Raises:
        MissingExtraError: the package is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        package = {"zmq": "pyzmq"}.get(module, module)
        msg = (
            f"{feature} needs the {package!r} package, which is not installed; install "
            "kvcore's fleet extra: pip install 'kvcore[fleet]'"
        )
        raise MissingExtraError(msg) from None
