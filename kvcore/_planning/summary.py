"""The text of ``kvcore plan``: the groups, then the pool, one request, capacity, waste."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvcore._planning.report import short_layer_list
from kvcore._utils import format_bytes

if TYPE_CHECKING:
    from kvcore._planning.plan import KVCachePlan

__all__ = ["group_table", "plan_summary"]


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
