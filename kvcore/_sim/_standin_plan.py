"""Temporary stand-in for ``kvcore.plan`` until the planning package lands (issue 4).

Builds a one-group, all-full-attention config by hand for two models. Delete
this module when ``kvcore.plan`` exists.
"""

from __future__ import annotations

import re

import attrs

from kvcore._config import KVCacheConfig
from kvcore.errors import InvalidConfigError
from kvcore.specs import KVCacheSpec

__all__ = ["StandinPlan", "plan"]

_MODELS = {
    # name: (layers, kv heads, head size, max_model_len)
    "gpt-oss-20b": (24, 8, 64, 131_072),
    "llama-3-8b": (32, 8, 128, 8192),
}


@attrs.frozen
class StandinPlan:
    kv_cache_config: KVCacheConfig
    max_model_len: int
    num_blocks: int

    def to_dict(self) -> dict[str, object]:
        return {"num_blocks": self.num_blocks, "max_model_len": self.max_model_len}


def _bytes(memory: str | int) -> int:
    if isinstance(memory, int):
        return memory
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(GiB|MiB|KiB|B)?\s*", memory)
    if not match:
        msg = f"cannot read memory {memory!r}; write e.g. 80GiB"
        raise InvalidConfigError(msg)
    scale = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1, None: 1}[match[2]]
    return int(float(match[1]) * scale)


def list_models() -> list[str]:
    return sorted(_MODELS)


def plan(
    model: str,
    *,
    memory: str | int = "80GiB",
    max_model_len: int | None = None,
    block_size: int | None = None,
    registry: object = None,
    **_: object,
) -> StandinPlan:
    from kvcore._plugin_loader import load_registry

    registry = registry if registry is not None else load_registry()
    by_kind = {lt.spec.kind: lt.spec for lt in registry.layer_types}  # type: ignore[attr-defined]
    FullAttentionSpec = by_kind["full_attention"]
    if model not in _MODELS:
        msg = f"unknown model {model!r}; shipped models: {', '.join(sorted(_MODELS))}"
        raise InvalidConfigError(msg)
    layers, heads, head_size, default_len = _MODELS[model]
    block_size = block_size or 16
    spec: KVCacheSpec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype="bfloat16"
    )
    layers_per_page = layers // 2 if model == "gpt-oss-20b" else layers
    num_blocks = _bytes(memory) // (spec.page_size_bytes * layers_per_page)
    max_model_len = max_model_len or default_len
    needed = -(-max_model_len // block_size) + 1
    if num_blocks < needed:
        msg = (
            f"memory {memory} holds {num_blocks} blocks; one request of max_model_len="
            f"{max_model_len} needs {needed}"
        )
        raise InvalidConfigError(msg)
    if model == "gpt-oss-20b":
        from kvcore._config import KVCacheGroupSpec

        sliding = by_kind["sliding_window"](
            block_size=block_size,
            num_kv_heads=heads,
            head_size=head_size,
            dtype="bfloat16",
            sliding_window=128,
        )
        config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_groups=(
                KVCacheGroupSpec(
                    layer_names=[f"l{i}" for i in range(1, layers, 2)], kv_cache_spec=spec
                ),
                KVCacheGroupSpec(
                    layer_names=[f"l{i}" for i in range(0, layers, 2)], kv_cache_spec=sliding
                ),
            ),
        )
    else:
        config = KVCacheConfig.from_specs(num_blocks, [spec])
    return StandinPlan(config, max_model_len, num_blocks)
