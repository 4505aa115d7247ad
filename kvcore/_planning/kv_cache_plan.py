"""What ``kvcore.plan`` returns: :class:`KVCachePlan`, and the text of ``kvcore plan``.

The plan's fields, and its summary: the groups, then the pool, one request,
capacity and waste. One module, so that the class and the text it prints
need no import of each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvcore._config import KVCacheConfig
from kvcore._planning.page_classes import PageClasses
from kvcore._planning.pool_choice import ResolvedPool
from kvcore._planning.report import GroupReport, short_layer_list
from kvcore._planning.sizing import blocks_per_request, max_concurrency, memory_needed
from kvcore._planning.two_level import large_pages_per_request, two_level_waste
from kvcore._utils import format_bytes
from kvcore.specs import KVCacheSpec, TokenLimits

__all__ = ["KVCachePlan", "group_table", "plan_summary"]


@attrs.frozen(kw_only=True)
class KVCachePlan:
    """A planned KV cache: the config for the manager and what it costs.

    Attributes:
        model: The model's name.
        source: Where its config was read from.
        kv_cache_config: Groups, block count and tensors; hand it to
            :class:`kvcore.KVCacheManager` (with :attr:`max_model_len`) and to
            :func:`kvcore.allocate_kv_cache`.
        layer_specs: Every layer's spec as built from the model config (before
            grouping changed block sizes or pages).
        limits: The token limits planned for (``max_model_len`` after fitting).
        model_max_len: The model's own context length.
        memory_bytes: The memory planned for, in bytes.
        groups: A report per group (pages, blocks per request, waste).
        group_size_rule: ``"reference"`` or ``"gcd"``.
        hybrid: Whether each attention type keeps its own groups (``False``:
            local layers allocated as full attention).
        reference: With the ``"gcd"`` rule, the reference rule's plan of the
            same model, memory and limits, for comparison (not checked to fit).
        notes: What planning changed to make the layers fit together, one
            sentence each (a raised block size, padded pages, windows
            allocated as full attention, a lowered ``max_model_len``).
        max_model_len_fitted: ``max_model_len`` was fitted to the memory (not
            given): the model's, lowered to the longest request that fits.
        num_blocks_given: The block count was given (``num_blocks``), not
            derived from ``memory_bytes``, which then sized nothing.
        pool: ``"shared"`` (one page size for every group) or ``"two-level"``
            (large pages carved into small pages of each group's natural
            page); ``pool="auto"`` resolved.
        page_classes: The page classes and the large page of a two-level
            pool (``None`` for the shared pool or a model without groups).
        mamba_checkpoint: Tokens between two cached states of a state group
            (its block size), when the model keeps states on a grid.
        hit_alignment: Every prefix hit is a multiple of this many tokens: the
            lcm of the block sizes of the groups that can be prefix-cached.
    """

    model: str
    source: str
    kv_cache_config: KVCacheConfig
    layer_specs: dict[str, KVCacheSpec] = attrs.field(repr=False)
    limits: TokenLimits
    model_max_len: int
    memory_bytes: int
    groups: tuple[GroupReport, ...]
    group_size_rule: str
    hybrid: bool
    reference: KVCachePlan | None = None
    notes: tuple[str, ...] = ()
    max_model_len_fitted: bool = False
    num_blocks_given: bool = False
    pool: ResolvedPool = "shared"
    page_classes: PageClasses | None = None
    mamba_checkpoint: int | None = None
    hit_alignment: int = 1

    @property
    def max_model_len(self) -> int:
        """Longest request planned for, in tokens (the model's, or less to fit)."""
        return self.limits.max_model_len

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included; large pages in a two-level pool."""
        return self.kv_cache_config.num_blocks

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs (the widest group's pages)."""
        return self.kv_cache_config.bytes_per_block

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request of :attr:`max_model_len` tokens holds across all groups.

        In a two-level pool these are small pages of the groups' classes.
        """
        return blocks_per_request(self.kv_cache_config.kv_cache_groups, self.limits)

    @property
    def large_pages_per_request(self) -> int:
        """Large pages one request of :attr:`max_model_len` tokens holds alone (0: shared pool).

        Per page class, its small pages rounded up to whole large pages.
        """
        if self.page_classes is None:
            return 0
        groups = self.kv_cache_config.kv_cache_groups
        return large_pages_per_request(groups, self.page_classes, self.limits)

    @property
    def max_concurrency(self) -> float:
        """Requests of :attr:`max_model_len` tokens the pool holds at once."""
        return max_concurrency(self.kv_cache_config, self.limits)

    @property
    def token_capacity(self) -> int:
        """Tokens the pool holds in requests of :attr:`max_model_len` tokens."""
        return int(self.max_concurrency * self.max_model_len)

    @property
    def memory_needed_bytes(self) -> int:
        """Bytes one request of :attr:`max_model_len` tokens needs (null block included).

        In a two-level pool: whole large pages per class, and large page 0.
        """
        return memory_needed(
            self.kv_cache_config.kv_cache_groups, self.limits, classes=self.page_classes
        )

    @property
    def wasted_bytes_per_request(self) -> int:
        """Bytes one request of :attr:`max_model_len` tokens holds but no layer uses."""
        return sum(group.wasted_bytes_per_request for group in self.groups)

    @property
    def waste_fraction(self) -> float:
        """Share of the pool that holds no KV when it is full of longest requests (0.0 to 1.0).

        Shared pool: the share of a longest request's bytes no layer uses (the
        null block is not counted). Two-level pool: :attr:`wasted_bytes` over
        the pool's bytes.
        """
        if self.page_classes is not None:
            size = self.kv_cache_config.size_bytes
            return self.wasted_bytes / size if size else 0.0
        total = self.bytes_per_block * self.blocks_per_request
        return self.wasted_bytes_per_request / total if total else 0.0

    @property
    def wasted_bytes(self) -> int:
        """Bytes of the pool wasted when it is full of requests of :attr:`max_model_len` tokens.

        In a two-level pool large page 0 is counted too (see :attr:`waste_breakdown`).
        """
        if self.page_classes is not None:
            return sum(self.waste_breakdown.values())
        return int(self.waste_fraction * self.kv_cache_config.size_bytes)

    @property
    def waste_breakdown(self) -> dict[str, int]:
        """Where :attr:`wasted_bytes` go in a two-level pool (empty for the shared pool).

        ``"reserved large page"`` (large page 0, the null blocks), ``"class
        padding"`` (small pages padded to divide the large page), ``"padding
        layer slots"`` (runs a group with fewer layers leaves empty) and
        ``"padded pages"`` (pages smaller than their group's page), in bytes.
        """
        classes = self.page_classes
        if classes is None:
            return {}
        groups = self.kv_cache_config.kv_cache_groups
        return two_level_waste(groups, classes, self.limits, self.num_blocks)

    @property
    def padding_slots(self) -> int:
        """Empty layer slots over all groups (uniform-page groups only)."""
        return sum(group.padding_slots for group in self.groups)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description of the plan (summary figures, groups, config)."""
        data = {
            "model": self.model,
            "source": self.source,
            "memory_bytes": self.memory_bytes,
            "num_blocks_given": self.num_blocks_given,
            "max_model_len": self.max_model_len,
            "max_model_len_fitted": self.max_model_len_fitted,
            "model_max_len": self.model_max_len,
            "max_num_batched_tokens": self.limits.max_num_batched_tokens,
            "max_num_encoder_tokens": self.limits.max_num_encoder_tokens,
            "group_size_rule": self.group_size_rule,
            "hybrid": self.hybrid,
            "layout": self.kv_cache_config.layout,
            "num_layers": len(self.layer_specs),
            "num_blocks": self.num_blocks,
            "bytes_per_block": self.bytes_per_block,
            "size_bytes": self.kv_cache_config.size_bytes,
            "blocks_per_request": self.blocks_per_request,
            "memory_needed_bytes": self.memory_needed_bytes,
            "max_concurrency": self.max_concurrency,
            "token_capacity": self.token_capacity,
            "padding_slots": self.padding_slots,
            "wasted_bytes": self.wasted_bytes,
            "wasted_bytes_per_request": self.wasted_bytes_per_request,
            "waste_fraction": self.waste_fraction,
            "notes": list(self.notes),
            "groups": [group.to_dict() for group in self.groups],
            "kv_cache_config": self.kv_cache_config.to_dict(),
            "pool": self.pool,
            "mamba_checkpoint": self.mamba_checkpoint,
            "hit_alignment": self.hit_alignment,
            "page_classes": self._page_classes_dict(),
        }
        if self.reference is not None:
            reference = self.reference.to_dict()
            del reference["kv_cache_config"]
            data["reference"] = reference
        return data

    def _page_classes_dict(self) -> dict[str, Any] | None:
        """The page classes, the large pages a request holds and the waste, for JSON."""
        classes = self.page_classes
        if classes is None:
            return None
        return {
            **attrs.asdict(classes),
            "pages_per_large_page": [
                classes.pages_per_large_page(c) for c in range(classes.num_classes)
            ],
            "bytes_per_large_page": classes.bytes_per_large_page,
            "large_pages_per_request": self.large_pages_per_request,
            "waste_breakdown": self.waste_breakdown,
        }

    def summary(self) -> str:
        """The plan as a few lines of text: groups, blocks, capacity, waste.

        For a two-level pool also the page classes (page, small pages per
        large page, padding, groups), the large pages, where the waste goes
        and the token grid prefix hits land on.
        """
        return plan_summary(self)


def plan_summary(plan: KVCachePlan) -> str:
    """The plan as a few lines of text (see :meth:`kvcore.KVCachePlan.summary`)."""
    lines = [*_heading(plan), "", *group_table(plan.groups)]
    if not plan.groups:
        lines.append("    (no layer holds a KV cache: attention-free model)")
    lines += ["", *(_two_level_lines(plan) if plan.page_classes else _shared_lines(plan))]
    if plan.notes:
        lines += ["", *(f"note: {note}" for note in plan.notes)]
    if plan.reference is not None:
        lines += ["", "group size rules side by side:"]
        for label, other in (("reference", plan.reference), (plan.group_size_rule, plan)):
            lines.append(
                f"  {label + ':':<11}{len(other.groups)} groups, {other.padding_slots} "
                f"padding slots, {other.num_blocks} "
                f"{'large pages' if other.page_classes else 'blocks'}, max concurrency "
                f"{other.max_concurrency:.2f}, wasted {format_bytes(other.wasted_bytes)} "
                f"({other.waste_fraction:.2%})"
            )
    return "\n".join(lines)


def _heading(plan: KVCachePlan) -> list[str]:
    """The model, its layers, and what it was planned for."""
    kinds: dict[str, int] = {}
    for spec in plan.layer_specs.values():
        kinds[spec.kind] = kinds.get(spec.kind, 0) + 1
    described = ", ".join(f"{count} {kind}" for kind, count in kinds.items()) or "none"
    if plan.max_model_len == plan.model_max_len:
        fitted = "model maximum"
    elif plan.max_model_len_fitted:
        fitted = f"fitted to memory; model maximum {plan.model_max_len}"
    else:
        fitted = f"given; model maximum {plan.model_max_len}"
    config = plan.kv_cache_config
    size = format_bytes(config.size_bytes)
    unit = "large pages" if plan.page_classes else "blocks"
    memory = (
        f"{plan.num_blocks} {unit} given ({size})"
        if plan.num_blocks_given
        else f"memory {format_bytes(plan.memory_bytes)}"
    )
    return [
        f"{plan.model}: {len(plan.layer_specs)} cache layers ({described})",
        f"{memory}, max_model_len {plan.max_model_len} "
        f"({fitted}), {plan.limits.batched_tokens} batched tokens per step, "
        f"{config.layout.replace('_', '-')} layout, "
        f"{plan.group_size_rule} group size"
        + ("" if plan.hybrid else ", hybrid manager disabled")
        + (", two-level pool" if plan.pool == "two-level" else ""),
    ]


def _shared_lines(plan: KVCachePlan) -> list[str]:
    """Blocks, one request, capacity and waste of a shared pool."""
    return [
        f"blocks:          {plan.num_blocks} of {format_bytes(plan.bytes_per_block)} "
        f"({format_bytes(plan.kv_cache_config.size_bytes)} in all)",
        f"one request:     {plan.blocks_per_request} blocks, "
        f"{format_bytes(plan.memory_needed_bytes)} at {plan.max_model_len} tokens",
        f"token capacity:  {plan.token_capacity} tokens",
        f"max concurrency: {plan.max_concurrency:.2f} requests of {plan.max_model_len} tokens",
        f"wasted:          {format_bytes(plan.wasted_bytes)} ({plan.waste_fraction:.2%} "
        f"of the pool at max_model_len; {plan.padding_slots} padding layer slots)",
    ]


def _two_level_lines(plan: KVCachePlan) -> list[str]:
    """Page classes, large pages, one request, capacity, waste and the hit grid."""
    classes = plan.page_classes
    assert classes is not None
    runs = f" in each of {classes.num_runs} runs" if classes.num_runs > 1 else ""
    how = (
        "the lcm of the class pages"
        if classes.lcm
        else "a multiple of the largest class page, smaller pages padded to divide it"
    )
    lines = [
        f"page classes:    {classes.num_classes}, in large pages of "
        f"{format_bytes(classes.large_page_bytes)}{runs} ({how})"
    ]
    for klass in range(classes.num_classes):
        groups = ", ".join(str(g) for g in classes.groups_of(klass))
        padding = classes.padding_bytes(klass)
        lines.append(
            f"  class {klass}:       {format_bytes(classes.class_page_bytes[klass])} pages, "
            f"{classes.pages_per_large_page(klass)} per large page, "
            + (f"padded by {format_bytes(padding)}" if padding else "no padding")
            + f"; group{'s' if len(classes.groups_of(klass)) > 1 else ''} {groups}"
        )
    config = plan.kv_cache_config
    waste = plan.waste_breakdown
    return [
        *lines,
        f"large pages:     {plan.num_blocks} of {format_bytes(classes.bytes_per_large_page)} "
        f"({format_bytes(config.size_bytes)} in all), large page 0 reserved for the null blocks",
        f"one request:     {plan.blocks_per_request} blocks in "
        f"{plan.large_pages_per_request} large pages, "
        f"{format_bytes(plan.memory_needed_bytes)} at {plan.max_model_len} tokens",
        f"token capacity:  {plan.token_capacity} tokens",
        f"max concurrency: {plan.max_concurrency:.2f} requests of {plan.max_model_len} tokens",
        f"wasted:          {format_bytes(plan.wasted_bytes)} ({plan.waste_fraction:.2%} of the "
        "pool when every block is in use: "
        + ", ".join(f"{what} {format_bytes(amount)}" for what, amount in waste.items())
        + ")",
        f"prefix hits:     multiples of {plan.hit_alignment} tokens (the lcm of the cached "
        "groups' block sizes)",
    ]


def group_table(groups: Sequence[Any]) -> list[str]:
    """The header and one line per group, each column as wide as its widest cell.

    A column is at least as wide as before (the usual table is unchanged);
    a long cell (a page of several sizes, a long kind) widens its column
    instead of running into the next.
    """
    header = ("group", "type", "layers", "which", "block", "page", "blocks/req", "waste/block")
    rows = _group_rows(groups)
    minimum = (5, 24, 7, 22, 7, 12, 12, 13)
    left = {1, 3}  # type and which are left-aligned, numbers right-aligned
    widths = [
        max(minimum[i], *(len(row[i]) + (2 if i not in left else 1) for row in rows))
        if rows
        else minimum[i]
        for i in range(len(header))
    ]

    def line(cells: Sequence[str]) -> str:
        out = f"{cells[0]:>{widths[0]}}  "
        for i in range(1, len(cells)):
            out += f"{cells[i]:<{widths[i]}}" if i in left else f"{cells[i]:>{widths[i]}}"
            if i == 2:
                out += "  "
        return out

    return [line(header), *(line(row) for row in rows)]


def _group_rows(groups: Sequence[Any]) -> list[tuple[str, ...]]:
    """The group table's cells: one row per group (a page of several sizes joined by /)."""
    return [
        (
            str(group.index),
            group.kind,
            str(group.num_layers),
            short_layer_list(group.layer_names),
            str(group.block_size),
            "/".join(format_bytes(p) for p in group.page_sizes),
            str(group.pages_per_request),
            format_bytes(group.wasted_bytes_per_block),
        )
        for group in groups
    ]
