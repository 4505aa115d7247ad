"""Whether vLLM's CPU build is importable here, and what to do when it is not.

The tests of ``kvcore.integrations.vllm`` run against vLLM itself. Without
it they skip, with the reason; ``KVCORE_REQUIRE_VLLM=1`` (set by ``.ci/run``
for its vLLM environment) turns the skip into a failure.
"""

from __future__ import annotations

import os
import warnings

import pytest


def require_vllm() -> None:
    """Return if vLLM 0.14 imports; else skip the calling module (fail under CI)."""
    from kvcore.integrations.vllm import UnsupportedVLLMError, check_vllm_version

    try:
        check_vllm_version()
        with warnings.catch_warnings():
            # vLLM's imports warn about optional packages missing on a CPU machine.
            warnings.simplefilter("ignore")
            import vllm.v1.core.sched.scheduler  # noqa: F401
    except (ImportError, UnsupportedVLLMError) as exc:
        reason = (
            f"vLLM 0.14 is not importable ({exc}); make vLLM's environment as the README's "
            "Benchmarks section says"
        )
        if os.environ.get("KVCORE_REQUIRE_VLLM") == "1":
            pytest.fail(f"{reason} (KVCORE_REQUIRE_VLLM=1: vLLM must be present)", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
