"""Which block pool serves a KV cache manager: the Python specification or its compiled twin.

``backend`` is ``"python"``, ``"native"`` or ``"auto"`` (the default, also
read from the ``KVCORE_BACKEND`` environment variable):

- ``"python"``: the pure-Python pool (:mod:`kvcore._block_pool`), everywhere;
- ``"native"``: the compiled pool (:mod:`kvcore._native_pool`); a
  configuration it does not serve (another eviction policy than ``lru``, a
  two-level pool, more than 256 groups) or a missing extension is an error;
- ``"auto"``: the compiled pool where it serves the configuration, else the
  Python pool (logged once per reason at INFO); without the extension the
  Python pool, saying so once (a WARNING of the ``kvcore`` logger).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Hashable
from functools import cache
from typing import Any, Final, TypeAlias, cast

from kvcore.errors import InvalidConfigError

__all__ = ["BACKENDS", "backend", "native_available", "native_chain", "resolve_backend"]

#: The accepted backend names.
BACKENDS: Final = ("auto", "python", "native")

#: ``chain(tokens, start, count, size, parent, out) -> bool``: append the
#: chained hashes of ``count`` blocks of ``size`` token ids from ``start``
#: to ``out``; ``False`` (nothing appended) for input only the Python path takes.
ChainFunction: TypeAlias = Callable[[list[int], int, int, int, Hashable, list[Hashable]], bool]

_logger = logging.getLogger("kvcore")
_said: set[str] = set()


@cache
def _native_import_error() -> str | None:
    """Why the compiled module does not import, or ``None`` when it does (asked once)."""
    try:
        importlib.import_module("kvcore._native")
    except ImportError as error:
        return str(error)
    return None


@cache
def _native_hash_module() -> tuple[Any, str | None]:
    """The compiled hashing module and ``None``, or ``None`` and why it does not import."""
    try:
        return importlib.import_module("kvcore._native_hash"), None
    except ImportError as error:
        return None, str(error)


def native_chain(algorithm: str) -> ChainFunction | None:
    """The compiled chain of block hashes for ``algorithm``, or ``None`` where there is none.

    ``"sha256"`` and ``"fast"`` have one in ``kvcore._native_hash``;
    ``"xxh3_128"`` has none. When that module did not build (no OpenSSL
    headers when kvcore was installed), says so once (a WARNING of the
    ``kvcore`` logger) and returns ``None``: the Python hasher serves.
    """
    if algorithm not in ("sha256", "fast"):
        return None
    module, error = _native_hash_module()
    if module is None:
        _say_once(
            "hashing",
            logging.WARNING,
            f"kvcore: compiled block hashing is not available ({error}); the native backend "
            "hashes in Python (reinstall kvcore with OpenSSL's headers, e.g. libssl-dev)",
        )
        return None
    return cast("ChainFunction", getattr(module, f"chain_{algorithm}"))


def native_available() -> bool:
    """Whether the compiled module ``kvcore._native`` was built and imports."""
    return _native_import_error() is None


def _say_once(key: str, level: int, message: str) -> None:
    if key not in _said:
        _said.add(key)
        _logger.log(level, message)


def _requested(backend: str | None) -> str:
    """The backend asked for: the argument, else ``KVCORE_BACKEND``, else ``auto``."""
    source = "backend"
    if backend is None:
        backend = os.environ.get("KVCORE_BACKEND", "") or "auto"
        source = "KVCORE_BACKEND"
    if backend not in BACKENDS:
        msg = f"{source} must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
        raise InvalidConfigError(msg)
    return backend


def resolve_backend(backend: str | None = None, gap: str | None = None) -> str:
    """The backend a new pool gets: ``"python"`` or ``"native"``.

    Args:
        backend: ``"python"``, ``"native"``, ``"auto"`` or ``None`` (read
            ``KVCORE_BACKEND``, default ``"auto"``).
        gap: What of the pool's configuration the native backend does not
            serve, or ``None`` when it serves it all.

    Raises:
        InvalidConfigError: an unknown name; or ``"native"`` asked for while the
            extension is missing or ``gap`` is set (the message says what to do).
    """
    requested = _requested(backend)
    if requested == "python":
        return "python"
    error = _native_import_error()
    if requested == "native":
        if error is not None:
            msg = (
                f"backend 'native' asked for but the compiled module did not import ({error}); "
                "reinstall kvcore with a C compiler present, or use backend='python'"
            )
            raise InvalidConfigError(msg)
        if gap is not None:
            msg = f"the native backend does not serve {gap}; use backend='auto' or 'python'"
            raise InvalidConfigError(msg)
        return "native"
    if error is not None:
        _say_once(
            "missing",
            logging.WARNING,
            f"kvcore: the compiled backend is not available ({error}); using the Python "
            "backend (reinstall with a C compiler for the native one)",
        )
        return "python"
    if gap is not None:
        _say_once(gap, logging.INFO, f"kvcore: the Python backend serves {gap}")
        return "python"
    return "native"


def backend() -> str:
    """The backend new KV cache managers get by default: ``"native"`` or ``"python"``.

    Follows ``KVCORE_BACKEND`` (``auto`` when unset): ``"native"`` when the
    compiled module imports and is not turned off. A manager whose
    configuration the native backend does not serve (see
    :attr:`kvcore.KVCacheManager.backend`) runs on the Python one.

    Raises:
        InvalidConfigError: ``KVCORE_BACKEND`` holds an unknown name, or
            ``native`` while the compiled module is missing.
    """
    return resolve_backend(None)
