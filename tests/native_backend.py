"""What the tests of the native backend share: whether it is there, and how to insist on it.

A checkout built without a C compiler has no ``kvcore._native``: the tests
that need it skip with the reason. ``KVCORE_REQUIRE_NATIVE=1`` (set by
``.ci/run``) turns that skip into a failure, so CI cannot pass without the
compiled backend.
"""

from __future__ import annotations

import importlib
import os

import pytest

from kvcore._backend import native_available


def require_native() -> None:
    """Skip the calling test without the compiled module (fail under KVCORE_REQUIRE_NATIVE=1)."""
    if native_available():
        return
    reason = "kvcore._native is not built (no C compiler when kvcore was installed)"
    if os.environ.get("KVCORE_REQUIRE_NATIVE") == "1":
        pytest.fail(f"{reason}; KVCORE_REQUIRE_NATIVE=1 requires it")
    pytest.skip(reason)


def require_native_hashing() -> None:
    """Skip without ``kvcore._native_hash`` (fail under KVCORE_REQUIRE_NATIVE=1)."""
    if native_hashing_built():
        return
    pytest.skip("kvcore._native_hash is not built (no OpenSSL headers when kvcore was installed)")


def native_hashing_built() -> bool:
    """Whether ``kvcore._native_hash`` imports (always, under KVCORE_REQUIRE_NATIVE=1)."""
    try:
        importlib.import_module("kvcore._native_hash")
    except ImportError:
        if os.environ.get("KVCORE_REQUIRE_NATIVE") == "1":
            raise
        return False
    return True
