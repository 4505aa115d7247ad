"""Sizing a two-level pool: large pages from memory, a request's large pages, waste.

Memory buys large pages: each costs ``large_page_bytes`` in every backing
run (:class:`~kvcore._planning.page_classes.PageClasses`), and large page 0
is reserved for the classes' null blocks. A page class takes memory a large
page at a time, so one request of the longest admitted length needs, per
class, ``ceil(small pages its groups hold / small pages per large page)``
large pages (the blocks reserved once per pool, such as attention sinks,
counted with the class that reserves them), summed over the classes, plus
large page 0.

Many requests share large pages: when every small page is in use no large
page is partly empty, so capacity and waste are counted in small pages. The
waste is what holds no KV then: large page 0, class padding (small pages
padded to divide the large page), empty layer slots (a layer-outer group with
fewer layers than there are runs) and pages padded within a group.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcore._blocks import MAX_NUM_BLOCKS
from kvcore._config import KVCacheConfig, KVCacheGroupSpec
from kvcore._planning.layout import two_level_tensors
from kvcore._planning.needs import class_blocks, class_reserved_blocks, pages_per_request
from kvcore._planning.page_classes import PageClasses
from kvcore._utils import cdiv, format_bytes
from kvcore.errors import InsufficientMemoryError, PoolTooLargeError
from kvcore.specs import TokenLimits

__all__ = [
    "block_cost_bytes",
    "block_waste",
    "large_pages_needed",
    "large_pages_per_request",
    "memory_needed_two_level",
    "two_level_concurrency",
    "two_level_config",
    "two_level_waste",
]


def large_pages_per_request(
    groups: Sequence[KVCacheGroupSpec], classes: PageClasses, limits: TokenLimits
) -> int:
    """Large pages one longest request holds alone: per class, its small pages rounded up."""
    needs = class_blocks(groups, classes.group_classes, classes.num_classes, limits)
    return sum(cdiv(n, classes.pages_per_large_page(c)) for c, n in enumerate(needs))


def large_pages_needed(
    groups: Sequence[KVCacheGroupSpec], classes: PageClasses, limits: TokenLimits
) -> int:
    """Large pages a pool needs for one longest request: its own, the reserved blocks', page 0."""
    needs = class_blocks(groups, classes.group_classes, classes.num_classes, limits)
    reserved = class_reserved_blocks(groups, classes.group_classes, classes.num_classes)
    return 1 + sum(
        cdiv(n + r, classes.pages_per_large_page(c))
        for c, (n, r) in enumerate(zip(needs, reserved, strict=True))
    )


def memory_needed_two_level(
    groups: Sequence[KVCacheGroupSpec], classes: PageClasses, limits: TokenLimits
) -> int:
    """Bytes for one longest request: :func:`large_pages_needed` large pages over every run."""
    if not groups:
        return 0
    return large_pages_needed(groups, classes, limits) * classes.bytes_per_large_page


def two_level_config(
    groups: Sequence[KVCacheGroupSpec],
    classes: PageClasses,
    available_memory: int,
    *,
    num_large_pages: int | None = None,
) -> KVCacheConfig:
    """Size a two-level pool in ``available_memory`` bytes and lay out its tensors.

    Args:
        groups: The KV cache groups, with their natural pages.
        classes: Their page classes and large page (:func:`page_classes`).
        available_memory: Bytes for the KV cache.
        num_large_pages: Use this many large pages instead of what the memory holds.

    Returns:
        A config whose ``num_blocks`` is the large page count and whose
        ``page_pool`` carves them.

    Raises:
        InsufficientMemoryError: fewer than 2 large pages (page 0 and one
            usable) fit.
        PoolTooLargeError: a class would have more small pages than int32
            block ids address.
    """
    large = classes.bytes_per_large_page
    count = available_memory // large if num_large_pages is None else num_large_pages
    if count < 2:
        msg = (
            f"{format_bytes(available_memory)} holds {count} large page(s) of {large} bytes "
            f"({classes.num_runs} run(s) of {classes.large_page_bytes}); the pool needs large "
            f"page 0 (the null blocks) and at least one usable: give at least {2 * large} bytes"
        )
        raise InsufficientMemoryError(msg)
    most = max(classes.pages_per_large_page(c) for c in range(classes.num_classes))
    if count * most > MAX_NUM_BLOCKS:
        msg = (
            f"{count} large pages of {most} small pages each give more block ids than int32 "
            f"block tables address (at most {MAX_NUM_BLOCKS}); plan with less memory or fewer "
            "blocks"
        )
        raise PoolTooLargeError(msg)
    return KVCacheConfig(
        num_blocks=count,
        kv_cache_groups=groups,
        kv_cache_tensors=two_level_tensors(groups, classes, count),
        layout=classes.layout,
        page_pool=classes.page_pool(count),
    )


def two_level_concurrency(config: KVCacheConfig, limits: TokenLimits) -> float:
    """Requests of ``limits.max_model_len`` tokens a two-level pool holds at once.

    Requests share large pages, so this counts small pages: the large pages
    but page 0, less the reserved blocks, over what one request holds, each
    class's small pages as a fraction of a large page. 0.0 without groups.
    """
    pool = config.page_pool
    groups = config.kv_cache_groups
    if pool is None or not groups:
        return 0.0
    needs = class_blocks(groups, pool.group_classes, pool.num_classes, limits)
    reserved = class_reserved_blocks(groups, pool.group_classes, pool.num_classes)
    per_request = sum(n / pool.pages_per_large_page(c) for c, n in enumerate(needs))
    taken = sum(r / pool.pages_per_large_page(c) for c, r in enumerate(reserved))
    return (pool.num_large_pages - 1 - taken) / per_request if per_request else 0.0


def block_cost_bytes(classes: PageClasses, group_id: int) -> int:
    """Bytes one block id of group ``group_id`` takes: its class page in every run."""
    return classes.num_runs * classes.class_page_bytes[classes.group_classes[group_id]]


def block_waste(classes: PageClasses, group_id: int, group: KVCacheGroupSpec) -> dict[str, int]:
    """Bytes of one block of ``group`` that hold no KV, by cause (see :func:`two_level_waste`)."""
    klass = classes.group_classes[group_id]
    page = classes.class_page_bytes[klass]
    layers = len(group.layer_names)
    outer = classes.layout == "layer_outer"
    slots = (classes.num_runs - layers) * page if outer else 0
    padding = (layers if outer else 1) * classes.padding_bytes(klass)
    real = sum(spec.real_page_size_bytes for _, spec in group.items())
    return {
        "class padding": padding,
        "padding layer slots": slots,
        "padded pages": block_cost_bytes(classes, group_id) - slots - padding - real,
    }


def two_level_waste(
    groups: Sequence[KVCacheGroupSpec],
    classes: PageClasses,
    limits: TokenLimits,
    num_large_pages: int,
) -> dict[str, int]:
    """Bytes of the pool that hold no KV when it is full of longest requests, by cause.

    ``"reserved large page"``: large page 0. The others are the usable large
    pages times the share of a longest request's bytes lost to each cause:
    ``"class padding"`` (small pages padded to divide the large page),
    ``"padding layer slots"`` (runs a layer-outer group with fewer layers
    than runs leaves empty) and ``"padded pages"`` (pages smaller than
    their group's page).
    """
    spent = 0
    lost = {"class padding": 0, "padding layer slots": 0, "padded pages": 0}
    for group_id, group in enumerate(groups):
        blocks = pages_per_request(group, limits)
        spent += blocks * block_cost_bytes(classes, group_id)
        for cause, amount in block_waste(classes, group_id, group).items():
            lost[cause] += blocks * amount
    page = classes.bytes_per_large_page
    usable = (num_large_pages - 1) * page
    shares = {cause: usable * amount // spent if spent else 0 for cause, amount in lost.items()}
    return {"reserved large page": page, **shares}
