"""What the tests of the native backend share: whether it is there, and how to insist on it.

A checkout built without a C compiler has no ``kvcore._native``: the tests
that need it skip with the reason. ``KVCORE_REQUIRE_NATIVE=1`` (set by
``.ci/run``) turns that skip into a failure, so CI cannot pass without the
compiled backend.
"""

from __future__ import annotations

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
