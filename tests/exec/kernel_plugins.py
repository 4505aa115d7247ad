"""Plugins for the kernel-hook tests (importable by module name, as the hook collection needs)."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

import kvcore
from kvcore.managers import PrefixManager
from kvcore.reference import Params, TokenRowKernel, attend, project
from kvcore.specs import AttentionSpec, KVCacheSpec, TokenLimits
from kvcore_plugins.full_attention import FullAttentionSpec


@attrs.frozen(kw_only=True)
class TemperatureAttentionSpec(AttentionSpec):
    """Full attention whose scores are divided by a temperature (a third-party type)."""

    kind: ClassVar[str] = "temperature_attention"
    temperature: float = 2.0

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes


class TemperatureAttentionManager(PrefixManager[TemperatureAttentionSpec]):
    """Any cached prefix is a hit."""


class TemperatureKernel(TokenRowKernel):
    """The default attention row, with the query divided by the temperature."""

    def read_out(self, spec: KVCacheSpec, params: Params, x: Any, rows: Any) -> Any:
        assert isinstance(spec, TemperatureAttentionSpec)
        key = spec.head_size
        query = project(x, params["wq"]).reshape(spec.num_kv_heads, key) / spec.temperature
        return project(attend(query, rows[..., :key], rows[..., key:]).reshape(-1), params["wo"])


class Temperature:
    """A third-party plugin with a type and its reference kernel."""

    @staticmethod
    @kvcore.hookimpl
    def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
        return [kvcore.LayerType(TemperatureAttentionSpec, TemperatureAttentionManager)]

    @staticmethod
    @kvcore.hookimpl
    def kvcore_reference_kernels() -> dict[type[KVCacheSpec], TokenRowKernel]:
        return {TemperatureAttentionSpec: TemperatureKernel()}


class NoKernel:
    """The same type without the kernel hook."""

    @staticmethod
    @kvcore.hookimpl
    def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
        return [kvcore.LayerType(TemperatureAttentionSpec, TemperatureAttentionManager)]


class Duplicate:
    """Claims a kernel for full attention, which the built-in plugin provides."""

    @staticmethod
    @kvcore.hookimpl
    def kvcore_reference_kernels() -> dict[type[KVCacheSpec], TokenRowKernel]:
        return {FullAttentionSpec: TokenRowKernel()}


class BadReturn:
    """Returns a list instead of a mapping."""

    @staticmethod
    @kvcore.hookimpl
    def kvcore_reference_kernels() -> list[object]:
        return [TokenRowKernel()]
