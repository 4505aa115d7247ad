"""Sizing: blocks from memory, the fit of one longest request, concurrency.

A request holds, in every group, at most the blocks its spec needs for the
longest admitted request (:mod:`.needs`). In the shared pool every block
costs ``bytes_per_block`` (the widest group) whichever group owns it, so one
longest request needs ``bytes_per_block × Σ_groups blocks`` bytes, plus the
blocks types reserve once per pool (attention sinks) and the null block. In
a two-level pool (``classes`` given) it needs whole large pages per page
class (:mod:`.two_level`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from kvcore._block_pool import MAX_NUM_BLOCKS
from kvcore._config import KVCacheConfig, KVCacheGroupSpec, KVCacheLayout
from kvcore._planning.grouping import get_kv_cache_groups
from kvcore._planning.layout import bytes_per_block, check_layout, layout_tensors
from kvcore._planning.needs import blocks_per_request, pages_per_request, reserved_blocks
from kvcore._planning.page_classes import PageClasses
from kvcore._planning.two_level import memory_needed_two_level, two_level_concurrency
from kvcore._utils import format_bytes
from kvcore.errors import InsufficientMemoryError, InvalidConfigError, PoolTooLargeError
from kvcore.specs import KVCacheSpec, TokenLimits

__all__ = [
    "InsufficientMemoryError",
    "blocks_per_request",
    "check_fits",
    "estimate_max_model_len",
    "fit_max_model_len",
    "get_kv_cache_config",
    "get_kv_cache_configs",
    "max_concurrency",
    "memory_needed",
    "pages_per_request",
    "reserved_blocks",
]


def memory_needed(
    groups: Sequence[KVCacheGroupSpec],
    limits: TokenLimits,
    *,
    classes: PageClasses | None = None,
) -> int:
    """Bytes for one longest request: its blocks, the reserved blocks and the null block.

    With ``classes`` (a two-level pool): whole large pages per class and large
    page 0.
    """
    if classes is not None:
        return memory_needed_two_level(groups, classes, limits)
    if not groups:
        return 0
    blocks = blocks_per_request(groups, limits) + reserved_blocks(groups) + 1
    return bytes_per_block(groups) * blocks


def fit_max_model_len(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    limits: TokenLimits,
    *,
    classes: PageClasses | None = None,
) -> int:
    """The longest ``max_model_len`` in ``[1, limits.max_model_len]`` whose request fits.

    What ``max_model_len=-1`` asks :func:`kvcore.plan` for (the reference
    engine's auto-fit). A binary search on the bytes one longest request
    needs: its blocks in every group, the blocks reserved once per pool and
    the null block, each block costing the widest group's bytes (with
    ``classes``, the large pages of a two-level pool).

    Args:
        groups: The KV cache groups.
        available_memory: Bytes for the KV cache.
        limits: Token limits; ``limits.max_model_len`` is the upper bound.
        classes: The page classes of a two-level pool; ``None``: the shared pool.

    Returns:
        The length in tokens; 0 if not even one token fits.
    """
    if not groups:
        return limits.max_model_len

    def fits(length: int) -> bool:
        trial = attrs.evolve(limits, max_model_len=length)
        return memory_needed(groups, trial, classes=classes) <= available_memory

    low, high, best = 1, limits.max_model_len, 0
    while low <= high:
        middle = (low + high) // 2
        if fits(middle):
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best


def check_fits(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    limits: TokenLimits,
    *,
    classes: PageClasses | None = None,
) -> None:
    """Refuse memory that cannot hold one request of ``limits.max_model_len`` tokens.

    ``classes``: the page classes of a two-level pool (``None``: the shared pool).

    Raises:
        InsufficientMemoryError: the message states the memory needed, the
            memory given and the longest request that would fit.
    """
    needed = memory_needed(groups, limits, classes=classes)
    if needed <= available_memory:
        return
    longest = fit_max_model_len(groups, available_memory, limits, classes=classes)
    hint = (
        f"lower max_model_len to at most {longest}"
        if longest
        else "not even a 1-token request fits; give more memory"
    )
    null = (
        "the null block"
        if classes is None
        else f"large page 0 (the null blocks), in large pages of {classes.bytes_per_large_page} "
        "bytes"
    )
    msg = (
        f"one request of max_model_len={limits.max_model_len} tokens needs "
        f"{needed} bytes ({format_bytes(needed)}) of KV cache, including {null}, "
        f"but only {available_memory} bytes ({format_bytes(available_memory)}) are "
        f"available: give at least {format_bytes(needed, round_up=True)} ({needed} bytes), "
        f"or {hint}{_batched_tokens_hint(groups, available_memory, limits, classes)}"
    )
    raise InsufficientMemoryError(msg)


def _batched_tokens_hint(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    limits: TokenLimits,
    classes: PageClasses | None,
) -> str:
    """Advice to lower ``max_num_batched_tokens``, when a smaller step budget would fit.

    Windowed types (sliding windows, chunks) keep a step's tokens beyond the
    window, so one request's need grows with the budget; with a budget of the
    whole request a window needs the whole request.
    """
    budget = limits.batched_tokens
    if budget <= 1:
        return ""
    smaller = attrs.evolve(limits, max_num_batched_tokens=1)
    if memory_needed(groups, smaller, classes=classes) > available_memory:
        return ""
    low, high = 1, budget - 1  # the largest budget whose request fits
    while low < high:
        middle = (low + high + 1) // 2
        trial = attrs.evolve(limits, max_num_batched_tokens=middle)
        if memory_needed(groups, trial, classes=classes) <= available_memory:
            low = middle
        else:
            high = middle - 1
    return (
        f", or lower max_num_batched_tokens (now {budget}) to at most {low}: windowed layers "
        "keep one step's tokens beyond their window, so a smaller step budget needs less"
    )


def get_kv_cache_config(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    *,
    num_blocks: int | None = None,
    layout: KVCacheLayout = "layer_outer",
) -> KVCacheConfig:
    """Size the pool for ``groups`` in ``available_memory`` bytes and lay out the tensors.

    Args:
        groups: The KV cache groups (see :func:`kvcore.planning.get_kv_cache_groups`).
        available_memory: Bytes for the KV cache.
        num_blocks: Use this many blocks instead of what the memory holds.
        layout: ``"layer_outer"`` or ``"block_outer"``.

    Returns:
        ``available_memory // bytes_per_block`` blocks (or ``num_blocks``)
        and one tensor per run of same-spec layers of every group. A model
        without groups gets one block (the null block) and no tensors.

    Raises:
        InvalidConfigError: fewer than 2 blocks (the null block and one
            usable block) fit, or the layout cannot express the groups.
        PoolTooLargeError: more blocks than int32 block ids address.
    """
    if not any(group.layer_names for group in groups):
        return KVCacheConfig(num_blocks=1, kv_cache_groups=groups, layout=layout)
    check_layout(groups, layout)
    block_bytes = bytes_per_block(groups)
    count = available_memory // block_bytes if num_blocks is None else num_blocks
    if count < 2:
        msg = (
            f"{format_bytes(available_memory)} holds {count} block(s) of {block_bytes} bytes; "
            "the pool needs the null block and at least one usable block: give at least "
            f"{2 * block_bytes} bytes"
        )
        raise InsufficientMemoryError(msg)
    if count > MAX_NUM_BLOCKS:
        msg = (
            f"num_blocks={count} ({format_bytes(available_memory)} in blocks of {block_bytes} "
            "bytes) is more than a pool can address: block tables hold int32 ids (at most "
            f"{MAX_NUM_BLOCKS} blocks); plan with less memory or fewer blocks"
        )
        raise PoolTooLargeError(msg)
    return KVCacheConfig(
        num_blocks=count,
        kv_cache_groups=groups,
        kv_cache_tensors=layout_tensors(groups, count, layout),
        layout=layout,
    )


def max_concurrency(config: KVCacheConfig, limits: TokenLimits) -> float:
    """How many requests of ``limits.max_model_len`` tokens the pool holds at once.

    ``num_blocks / Σ_groups blocks per request`` as the reference reports it
    (the null block is counted in the pool), after the blocks reserved once
    per pool. 0.0 for a config without groups. With a two-level pool
    (``config.page_pool``), counted in small pages: the large pages but page 0
    over the large-page share one request holds.
    """
    if config.page_pool is not None:
        return two_level_concurrency(config, limits)
    groups = config.kv_cache_groups
    if not groups:
        return 0.0
    usable = config.num_blocks - reserved_blocks(groups)
    return usable / blocks_per_request(groups, limits)


def _project(
    groups: Sequence[KVCacheGroupSpec], worker_layers: Mapping[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    """The global groups restricted to one worker's layers (a group may become empty)."""
    projected = []
    for group in groups:
        keep = [i for i, name in enumerate(group.layer_names) if name in worker_layers]
        layer_specs = None
        if group.layer_specs is not None and keep:
            layer_specs = [group.layer_specs[i] for i in keep]
        projected.append(
            KVCacheGroupSpec(
                layer_names=[group.layer_names[i] for i in keep],
                kv_cache_spec=group.kv_cache_spec,
                layer_specs=layer_specs,
            )
        )
    return projected


def get_kv_cache_configs(
    worker_layer_specs: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: Sequence[int],
    limits: TokenLimits,
    *,
    num_blocks: int | None = None,
    hybrid: bool = True,
    layout: KVCacheLayout = "layer_outer",
    group_size_rule: str = "reference",
) -> list[KVCacheConfig]:
    """Plan the KV cache of several workers sharing one block id space.

    Workers of one pipeline stage (tensor parallel) report the same layers;
    stages report disjoint layers. The layers of all workers are grouped once,
    the groups are projected onto each worker, each worker's memory is checked
    against one longest request of its own layers, and every worker gets the
    smallest block count of all (the scheduler hands out one set of ids).

    Args:
        worker_layer_specs: Each worker's layer name → spec.
        available_memory: Each worker's bytes for the KV cache.
        limits: Token limits, for the memory check.
        num_blocks: Give every worker this many blocks instead.
        hybrid: See :func:`kvcore.planning.get_kv_cache_groups`.
        layout: See :func:`kvcore.planning.get_kv_cache_groups`.
        group_size_rule: See :func:`kvcore.planning.get_kv_cache_groups`.

    Raises:
        InvalidConfigError: one layer has different specs on two workers, the
            lists have different lengths, or grouping fails.
        InsufficientMemoryError: a worker's memory cannot hold one longest
            request.
    """
    if len(worker_layer_specs) != len(available_memory):
        msg = (
            f"{len(worker_layer_specs)} workers' layers but {len(available_memory)} memory "
            "amounts; give one amount per worker"
        )
        raise InvalidConfigError(msg)
    merged: dict[str, KVCacheSpec] = {}
    for worker, specs in enumerate(worker_layer_specs):
        for name, spec in specs.items():
            if name in merged and merged[name] != spec:
                msg = (
                    f"layer {name!r} has different specs on two workers ({merged[name]!r} and, "
                    f"on worker {worker}, {spec!r}); every worker must describe a layer alike"
                )
                raise InvalidConfigError(msg)
            merged.setdefault(name, spec)
    groups = get_kv_cache_groups(
        merged, hybrid=hybrid, layout=layout, group_size_rule=group_size_rule, limits=limits
    )
    projected = [_project(groups, specs) for specs in worker_layer_specs]
    memory = list(available_memory)
    for index, worker_groups in enumerate(projected):
        block_bytes = bytes_per_block(worker_groups)
        if not block_bytes:
            continue
        if num_blocks is not None:
            memory[index] = num_blocks * block_bytes
        check_fits(worker_groups, memory[index], limits)
    configs = [
        get_kv_cache_config(worker_groups, mem, layout=layout)
        for worker_groups, mem in zip(projected, memory, strict=True)
    ]
    sized = [config.num_blocks for config in configs if config.kv_cache_tensors]
    if not sized:
        return configs
    fewest = min(sized)
    return [
        get_kv_cache_config(config.kv_cache_groups, 0, num_blocks=fewest, layout=layout)
        if config.kv_cache_tensors
        else attrs.evolve(config, num_blocks=fewest)
        for config in configs
    ]


def estimate_max_model_len(
    layer_specs: Mapping[str, KVCacheSpec], available_memory: int, limits: TokenLimits
) -> int:
    """Longest model length whose per-layer memory sum fits, ignoring grouping.

    The reference's older estimate: ``Σ_layers max_memory_usage_bytes``, no
    padding, no null block. Binary search in ``[1, limits.max_model_len]``;
    0 if not even one token fits.
    """

    def fits(length: int) -> bool:
        trial = attrs.evolve(limits, max_model_len=length)
        return (
            sum(s.max_memory_usage_bytes(trial) for s in layer_specs.values()) <= available_memory
        )

    low, high, best = 1, limits.max_model_len, 0
    while low <= high:
        middle = (low + high) // 2
        if fits(middle):
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best
