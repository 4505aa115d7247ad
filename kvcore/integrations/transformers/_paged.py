"""The paged cache of one transformers model: a manager, the allocated views, the layer map."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from kvcore._kv_cache_manager import KVCacheManager
from kvcore._planning.allocate import KVCacheBuffers, allocate_kv_cache
from kvcore._planning.plan import KVCachePlan
from kvcore._registry import Registry
from kvcore.errors import InvalidConfigError
from kvcore.integrations.transformers._planning import plan_model
from kvcore.paging import PLANNED_PREFIX, layer_groups
from kvcore.specs import KVCacheSpec

__all__ = ["LayerSlot", "PagedModelCache"]

#: The cache dtype's torch dtype, by canonical name.
_TORCH_DTYPES: Mapping[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


@attrs.frozen(kw_only=True)
class LayerSlot:
    """Where one of the model's cache layers lives in kvcore.

    Attributes:
        layer_idx: The index transformers passes to the cache (``layer_idx``
            of the attention or mixer module).
        name: The module's path in the model (``model.layers.3.self_attn``).
        group_id: The KV cache group holding it.
        spec: The layer's planned spec (block size and page as allocated).
        computes: The layer's own spec, as the model config built it: what it
            computes and so which positions it reads
            (:meth:`~kvcore.specs.KVCacheSpec.positions_read`). It differs from
            ``spec`` when planning allocated a window for every token, and
            a group's merged spec records one window for all its layers.
        views: The layer's tensors, one per page part, ``(num_blocks, ...)``.
        cross: It attends to the encoder's output (cross attention).
        state: It holds a recurrent state per block (the page does not grow
            with the block size), not one row per token.
    """

    layer_idx: int
    name: str
    group_id: int
    spec: KVCacheSpec
    computes: KVCacheSpec
    views: tuple[torch.Tensor, ...] = attrs.field(eq=False, repr=False)
    cross: bool = False
    state: bool = False


def _is_cross(module: torch.nn.Module, name: str) -> bool:
    return bool(getattr(module, "is_cross_attention", False)) or name.endswith("encoder_attn")


class PagedModelCache:
    """A transformers model's KV cache in kvcore: the manager, the views and the layer map.

    One per model (and device). :class:`~kvcore.integrations.transformers.KVCoreCache`
    objects made from it for each forward read and write these views through
    the manager's block tables. Build it with :meth:`for_model`, or from a
    plan made by :func:`~kvcore.integrations.transformers.plan_model`.

    Args:
        model: The transformers model.
        plan: Its plan.
        enable_caching: Prefix caching across requests.
        device: Where the cache lives; default the model's device.
        model_prefix: The model's module path for the planned names' leading
            ``model.`` (``"model.language_model."`` for a multimodal wrapper);
            default ``model.``.
        registry: The plugins that serve the plan's groups.

    Raises:
        InvalidConfigError: a planned layer is not a module of the model, has
            no ``layer_idx``, or two share one; the cache dtype is not a float
            type transformers computes in.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        plan: KVCachePlan,
        *,
        enable_caching: bool = True,
        device: torch.device | str | None = None,
        model_prefix: str | None = None,
        registry: Registry | None = None,
    ) -> None:
        config = plan.kv_cache_config
        device = next(model.parameters()).device if device is None else device
        self.plan = plan
        self.manager = KVCacheManager(
            config,
            plan.max_model_len,
            enable_caching=enable_caching,
            hash_algorithm="fast",
            registry=registry,
        )
        self.buffers: KVCacheBuffers = allocate_kv_cache(config, device=device)
        self.device = torch.device(device)
        slots = _layer_slots(model, plan, self.buffers, model_prefix)
        self.self_layers: dict[int, LayerSlot] = {s.layer_idx: s for s in slots if not s.cross}
        self.cross_layers: dict[int, LayerSlot] = {s.layer_idx: s for s in slots if s.cross}
        self.num_layers = max(self.self_layers, default=-1) + 1
        self.cross_group_ids = sorted({s.group_id for s in self.cross_layers.values()})
        self.state_group_ids = sorted({s.group_id for s in self.self_layers.values() if s.state})

    @classmethod
    def for_model(
        cls,
        model: torch.nn.Module,
        *,
        memory: int | str,
        max_model_len: int | None = None,
        max_num_batched_tokens: int | None = None,
        block_size: int | None = None,
        num_blocks: int | None = None,
        hybrid: bool = True,
        options: Mapping[str, str] | None = None,
        registry: Registry | None = None,
        **kwargs: Any,
    ) -> PagedModelCache:
        """Plan the model's cache (:func:`plan_model`) and allocate it.

        Keyword arguments beyond the planning ones go to the constructor.
        """
        plan = plan_model(
            model,
            memory=memory,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
            num_blocks=num_blocks,
            hybrid=hybrid,
            options=options,
            registry=registry,
        )
        return cls(model, plan, registry=registry, **kwargs)

    @property
    def block_sizes(self) -> tuple[int, ...]:
        """Tokens per block of each KV cache group."""
        return tuple(g.kv_cache_spec.block_size for g in self.plan.kv_cache_config.kv_cache_groups)

    @property
    def num_groups(self) -> int:
        """KV cache groups."""
        return len(self.plan.kv_cache_config.kv_cache_groups)


def _layer_slots(
    model: torch.nn.Module,
    plan: KVCachePlan,
    buffers: KVCacheBuffers,
    model_prefix: str | None,
) -> list[LayerSlot]:
    config = plan.kv_cache_config
    groups = layer_groups(config, model_prefix=model_prefix)
    modules = dict(model.named_modules())
    slots = []
    seen: dict[tuple[bool, int], str] = {}
    for (name, group_id), planned in zip(groups.items(), _planned_names(config), strict=True):
        module = modules.get(name)
        if module is None:
            prefix = PLANNED_PREFIX if model_prefix is None else model_prefix
            msg = (
                f"planned layer {name!r} is not a module of the {type(model).__name__}; its "
                f"decoder may sit under another path than {prefix!r}: give model_prefix"
            )
            raise InvalidConfigError(msg)
        layer_idx = getattr(module, "layer_idx", None)
        if type(layer_idx) is not int:
            msg = f"module {name!r} has no integer layer_idx; transformers caches by it"
            raise InvalidConfigError(msg)
        spec = config.layer_spec(planned)
        cross = _is_cross(module, name)
        if (cross, layer_idx) in seen:
            msg = f"modules {seen[cross, layer_idx]!r} and {name!r} share layer_idx {layer_idx}"
            raise InvalidConfigError(msg)
        seen[cross, layer_idx] = name
        views = buffers.views[planned]
        if not all(v.dtype in _TORCH_DTYPES.values() for v in views):
            msg = (
                f"layer {name!r}: the cache dtype {views[0].dtype} is not one transformers "
                "computes in; plan a float dtype"
            )
            raise InvalidConfigError(msg)
        slots.append(
            LayerSlot(
                layer_idx=layer_idx,
                name=name,
                group_id=group_id,
                spec=spec,
                computes=plan.layer_specs[planned],
                views=tuple(views),
                cross=cross,
                state=not spec.page_size_follows_block_size,
            )
        )
    return slots


def _planned_names(config: Any) -> list[str]:
    return [name for group in config.kv_cache_groups for name in group.layer_names]
