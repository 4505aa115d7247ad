"""kvcore inside vLLM: vLLM's own scheduler on kvcore's KV cache manager.

One configuration line selects it::

    vllm serve MODEL --scheduler-cls kvcore.integrations.vllm.KVCoreScheduler

:class:`KVCoreScheduler` is vLLM 0.14's ``Scheduler`` with
:class:`KVCoreKVCacheManager` in place of vLLM's ``KVCacheManager``: the same
calls, arguments and answers, every allocation made by a
:class:`kvcore.KVCacheManager` built from vLLM's KV cache config
(:func:`kv_cache_config_from_vllm`). Served: vLLM 0.14.x
(:data:`SUPPORTED_VLLM`; importing the scheduler or the manager checks the
installed release).

vLLM's requests are mirrored: the manager keeps one :class:`kvcore.Request`
per live vLLM request and brings it up to date before each call (the new
tokens, ``num_computed_tokens``, ``num_preemptions``); see the docs page
*Use kvcore in vLLM* for the fields read, when, and the copy's cost.

:func:`kv_cache_config_from_vllm` and :func:`kv_cache_spec_from_vllm` do not
import vLLM; :class:`KVCoreScheduler`, :class:`KVCoreKVCacheManager` and
:func:`vllm_event` do, when first used.
"""

from __future__ import annotations

from typing import Any

from kvcore.integrations.vllm._convert import kv_cache_config_from_vllm, kv_cache_spec_from_vllm
from kvcore.integrations.vllm._version import (
    SUPPORTED_VLLM,
    UnsupportedVLLMError,
    check_vllm_version,
)

#: The names importable without vLLM. ``KVCoreScheduler``,
#: ``KVCoreKVCacheManager`` and ``vllm_event`` are public too, but their
#: modules import vLLM: they are loaded on first access (after the version
#: check) and so left out of ``__all__``, which tools may import without vLLM.
__all__ = [
    "kv_cache_config_from_vllm",
    "kv_cache_spec_from_vllm",
    "SUPPORTED_VLLM",
    "UnsupportedVLLMError",
    "check_vllm_version",
]

# Names whose modules import vLLM: loaded on first access, after the version check.
_LAZY = {
    "KVCoreScheduler": "kvcore.integrations.vllm._scheduler",
    "KVCoreKVCacheManager": "kvcore.integrations.vllm._manager",
    "vllm_event": "kvcore.integrations.vllm._manager",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    import importlib

    check_vllm_version()
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *_LAZY])
