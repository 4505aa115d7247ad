"""The exceptions of the cluster layer (events on the wire, the cluster index, the router)."""

from __future__ import annotations

import importlib
from types import ModuleType

from kvcore.errors import InvalidConfigError, KVCoreError

__all__ = [
    "EngineConflictError",
    "EventFormatError",
    "IndexUnavailableError",
    "InvalidEventError",
    "InvalidConfigError",
    "MissingExtraError",
    "require",
]


class MissingExtraError(KVCoreError, ImportError):
    """A cluster feature needs a package of the ``fleet`` extra that is not installed."""


class IndexUnavailableError(KVCoreError, ConnectionError):
    """The cluster index's backend (Redis) cannot be reached or refuses to work.

    Raised for a lost connection, a timeout, failed authentication or TLS,
    and errors Redis answers with (out of memory, busy, no permission); the
    message carries Redis's reason. Routing falls back to load.
    """


class EventFormatError(KVCoreError, ValueError):
    """A KV event payload is not a valid event batch (neither kvcore's nor vLLM's format)."""


class InvalidEventError(EventFormatError):
    """An event batch that decodes but does not fit the engine or the fleet's layout.

    A group the layout does not have, a block hash of the wrong type or
    width, a block size or attention kind other than the group's, more blocks
    than the engine's pool. The batch is refused whole: none of its events
    is applied, and since the engine's cache changed in a way the index
    cannot follow, the engine's entries are dropped and it is followed again
    from its next batch (as after lost events).
    """


class EngineConflictError(KVCoreError):
    """Two live engine incarnations publish under one engine id.

    The id is refused (not scored, entries dropped, batches ignored) until
    one of the two has been silent for the index's heartbeat timeout. Give
    every engine its own id.
    """


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
