"""``kvcore.plan``: a model and an amount of memory → a ready :class:`KVCacheConfig`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from kvcore._config import KVCacheConfig, KVCacheGroupSpec, KVCacheLayout
from kvcore._planning.alignment import align_state_pages
from kvcore._planning.group_size import GROUP_SIZE_RULES
from kvcore._planning.grouping import get_kv_cache_groups
from kvcore._planning.layout import bytes_per_block
from kvcore._planning.memory import parse_memory
from kvcore._planning.model_config import ModelConfig, build_layer_specs, load_model_config
from kvcore._planning.report import GroupReport, group_reports, short_layer_list
from kvcore._planning.sizing import (
    blocks_per_request,
    check_fits,
    fit_max_model_len,
    get_kv_cache_config,
    max_concurrency,
    memory_needed,
)
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._utils import format_bytes
from kvcore.errors import InvalidConfigError
from kvcore.specs import KVCacheSpec, KVFormat, TokenLimits

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "FIT_MAX_MODEL_LEN",
    "KVCachePlan",
    "plan",
    "print_plan",
]

#: Attention block size when none is given, in tokens.
DEFAULT_BLOCK_SIZE: Final = 16
#: Chunked-prefill budget per step when none is given (the reference server's
#: default); windowed types keep the window plus one step of tokens.
DEFAULT_MAX_NUM_BATCHED_TOKENS: Final = 8192
#: ``max_model_len`` asking for the longest length that fits (as the reference
#: engine's ``--max-model-len -1``).
FIT_MAX_MODEL_LEN: Final = -1


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

    @property
    def max_model_len(self) -> int:
        """Longest request planned for, in tokens (the model's, or less to fit)."""
        return self.limits.max_model_len

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return self.kv_cache_config.num_blocks

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs (the widest group's pages)."""
        return self.kv_cache_config.bytes_per_block

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request of :attr:`max_model_len` tokens holds across all groups."""
        return blocks_per_request(self.kv_cache_config.kv_cache_groups, self.limits)

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
        """Bytes one request of :attr:`max_model_len` tokens needs (null block included)."""
        return memory_needed(self.kv_cache_config.kv_cache_groups, self.limits)

    @property
    def wasted_bytes_per_request(self) -> int:
        """Bytes one request of :attr:`max_model_len` tokens holds but no layer uses."""
        return sum(group.wasted_bytes_per_request for group in self.groups)

    @property
    def waste_fraction(self) -> float:
        """Share of a longest request's bytes that no layer uses (0.0 to 1.0)."""
        total = self.bytes_per_block * self.blocks_per_request
        return self.wasted_bytes_per_request / total if total else 0.0

    @property
    def wasted_bytes(self) -> int:
        """Bytes of the pool wasted when it is full of requests of :attr:`max_model_len` tokens."""
        return int(self.waste_fraction * self.kv_cache_config.size_bytes)

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
        }
        if self.reference is not None:
            reference = self.reference.to_dict()
            del reference["kv_cache_config"]
            data["reference"] = reference
        return data

    def summary(self) -> str:
        """The plan as a few lines of text: groups, blocks, capacity, waste."""
        kinds: dict[str, int] = {}
        for spec in self.layer_specs.values():
            kinds[spec.kind] = kinds.get(spec.kind, 0) + 1
        described = ", ".join(f"{count} {kind}" for kind, count in kinds.items()) or "none"
        if self.max_model_len == self.model_max_len:
            fitted = "model maximum"
        elif self.max_model_len_fitted:
            fitted = f"fitted to memory; model maximum {self.model_max_len}"
        else:
            fitted = f"given; model maximum {self.model_max_len}"
        size = format_bytes(self.kv_cache_config.size_bytes)
        memory = (
            f"{self.num_blocks} blocks given ({size})"
            if self.num_blocks_given
            else f"memory {format_bytes(self.memory_bytes)}"
        )
        lines = [
            f"{self.model}: {len(self.layer_specs)} cache layers ({described})",
            f"{memory}, max_model_len {self.max_model_len} "
            f"({fitted}), {self.limits.batched_tokens} batched tokens per step, "
            f"{self.kv_cache_config.layout.replace('_', '-')} layout, "
            f"{self.group_size_rule} group size"
            + ("" if self.hybrid else ", hybrid manager disabled"),
            "",
            *self._group_table(),
        ]
        if not self.groups:
            lines.append("    (no layer holds a KV cache: attention-free model)")
        lines += [
            "",
            f"blocks:          {self.num_blocks} of {format_bytes(self.bytes_per_block)} "
            f"({format_bytes(self.kv_cache_config.size_bytes)} in all)",
            f"one request:     {self.blocks_per_request} blocks, "
            f"{format_bytes(self.memory_needed_bytes)} at {self.max_model_len} tokens",
            f"token capacity:  {self.token_capacity} tokens",
            f"max concurrency: {self.max_concurrency:.2f} requests of {self.max_model_len} tokens",
            f"wasted:          {format_bytes(self.wasted_bytes)} ({self.waste_fraction:.2%} "
            f"of the pool at max_model_len; {self.padding_slots} padding layer slots)",
        ]
        if self.notes:
            lines += ["", *(f"note: {note}" for note in self.notes)]
        if self.reference is not None:
            lines += ["", "group size rules side by side:"]
            for label, other in (("reference", self.reference), (self.group_size_rule, self)):
                lines.append(
                    f"  {label + ':':<11}{len(other.groups)} groups, {other.padding_slots} "
                    f"padding slots, {other.num_blocks} blocks, max concurrency "
                    f"{other.max_concurrency:.2f}, wasted {format_bytes(other.wasted_bytes)} "
                    f"({other.waste_fraction:.2%})"
                )
        return "\n".join(lines)

    def _group_table(self) -> list[str]:
        """The header and one line per group, each column as wide as its widest cell.

        A column is at least as wide as before (the usual table is unchanged);
        a long cell (a page of several sizes, a long kind) widens its column
        instead of running into the next.
        """
        header = ("group", "type", "layers", "which", "block", "page", "blocks/req",
                  "waste/block")
        rows = _group_rows(self.groups)
        minimum = (5, 24, 7, 22, 7, 12, 12, 13)
        left = {1, 3}  # type and which are left-aligned, numbers right-aligned
        widths = [
            max(minimum[i], *(len(row[i]) + (2 if i not in left else 1) for row in rows))
            if rows else minimum[i]
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


def _notes(
    layer_specs: dict[str, KVCacheSpec],
    aligned: dict[str, KVCacheSpec],
    groups: list[KVCacheGroupSpec],
    limits: TokenLimits,
    model_max_len: int,
    hybrid: bool,
    *,
    fitted: bool,
) -> tuple[str, ...]:
    """One sentence per change planning made to fit the layers together."""
    notes = []
    raised = {
        (spec.block_size, aligned[name].block_size)
        for name, spec in layer_specs.items()
        if spec.page_size_follows_block_size and aligned[name].block_size != spec.block_size
    }
    if raised:
        (before, after), *_ = sorted(raised)
        states = [s for s in aligned.values() if not s.page_size_follows_block_size]
        largest = max(s.real_page_size_bytes for s in states)
        notes.append(
            f"attention block size raised from {before} to {after} tokens so that a page "
            f"holds a {largest}-byte recurrent state"
        )
    final = {name: spec for group in groups for name, spec in group.items()}
    padded: dict[str, int] = {}
    for spec in final.values():
        if spec.page_size_bytes != spec.real_page_size_bytes:
            padded[spec.kind] = padded.get(spec.kind, 0) + 1
    if padded:
        which = ", ".join(f"{count} {kind}" for kind, count in padded.items())
        notes.append(f"pages padded to the common page size: {which} layers")
    promoted: dict[tuple[str, str], int] = {}
    for name, spec in final.items():
        if type(spec) is not type(layer_specs[name]):
            key = (layer_specs[name].kind, spec.kind)
            promoted[key] = promoted.get(key, 0) + 1
    reason = (
        "the hybrid manager is disabled"
        if not hybrid
        else "their pages cannot be unified with the others (allocation-only fallback)"
    )
    for (kind, as_kind), count in promoted.items():
        notes.append(
            f"{count} {kind} layers allocated as {as_kind} because {reason}; their attention "
            "compute is unchanged, their memory savings are lost"
        )
    if fitted and limits.max_model_len < model_max_len:
        notes.append(
            f"max_model_len lowered from the model's {model_max_len} to {limits.max_model_len} "
            "tokens, the longest request that fits"
        )
    return tuple(notes)


def _positive(name: str, value: object) -> int:
    if type(value) is not int or value <= 0:
        msg = f"{name} must be a positive integer, got {value!r}"
        raise InvalidConfigError(msg)
    return value


def _assemble(
    cfg: ModelConfig,
    layer_specs: dict[str, KVCacheSpec],
    groups: list[KVCacheGroupSpec],
    limits: TokenLimits,
    memory_bytes: int,
    *,
    num_blocks: int | None,
    layout: KVCacheLayout,
    rule: str,
    hybrid: bool,
) -> KVCachePlan:
    config = get_kv_cache_config(groups, memory_bytes, num_blocks=num_blocks, layout=layout)
    return KVCachePlan(
        model=cfg.name,
        source=cfg.source,
        kv_cache_config=config,
        layer_specs=layer_specs,
        limits=limits,
        model_max_len=cfg.max_model_len,
        memory_bytes=memory_bytes,
        groups=tuple(group_reports(groups, limits)),
        group_size_rule=rule,
        hybrid=hybrid,
    )


def plan(
    model: str | Path | ModelConfig,
    *,
    memory: int | str = "80GiB",
    max_model_len: int | None = None,
    block_size: int | None = None,
    dtype: str | KVFormat | None = None,
    registry: Registry | None = None,
    group_size_rule: str = "reference",
    max_num_batched_tokens: int | None = None,
    num_blocks: int | None = None,
    layout: KVCacheLayout = "layer_outer",
    hybrid: bool = True,
    options: Mapping[str, str] | None = None,
) -> KVCachePlan:
    """Plan the KV cache of a model in an amount of memory.

    Reads the model's config, builds every layer's spec through the plugins
    (:func:`~kvcore.hookspecs.kvcore_layer_kinds`), aligns state pages with
    attention pages, groups the layers (:func:`kvcore.planning.get_kv_cache_groups`),
    checks that one request of ``max_model_len`` tokens fits, and sizes the
    pool.

    Args:
        model: A shipped model name (:func:`kvcore.planning.list_models`), a path to a
            ``config.json`` (or its directory), or a loaded
            :class:`~kvcore.planning.ModelConfig`.
        memory: Bytes for the KV cache: an ``int`` or a string such as
            ``"80GiB"`` or ``"24GB"``.
        max_model_len: Longest request, in tokens. ``None`` or ``-1`` (the
            reference engine's spelling): the model's context length, lowered
            to the longest that fits the memory. Given explicitly, it must fit.
        block_size: Tokens per attention block (default 16); raised for
            models with state layers until an attention page holds a state.
        dtype: KV cache dtype: a plain dtype (``"bfloat16"``, ``"fp8"``, ...)
            or a KV format a selected plugin declares (``"nvfp4"``, or the
            :class:`~kvcore.specs.KVFormat`), for every attention layer whose
            type stores it; default the model's (``ModelConfig.dtype``:
            float32 for a config that names none).
        registry: The plugins to plan with; default :func:`kvcore.load_registry`.
        group_size_rule: ``"reference"`` (the reference engine's layout) or
            ``"gcd"`` (kvcore's layout wasting the least; the plan then also
            carries the reference plan for comparison).
        max_num_batched_tokens: Tokens scheduled per step (default 8192):
            sliding-window and chunked layers keep that many beyond the window.
        num_blocks: Use this many blocks instead of what ``memory`` holds.
        layout: ``"layer_outer"`` or ``"block_outer"`` (pages of different
            sizes packed side by side instead of unified).
        hybrid: ``False``: allocate the layers of local types for every
            token, in one block table (engines without the hybrid manager).
        options: Plugins' plan options, ``"<plugin>.<option>"`` → value
            (``{"mamba.cache_mode": "none"}``); ``kvcore plugins`` lists them.

    Returns:
        The plan; ``plan.kv_cache_config`` and ``plan.max_model_len`` build a
        :class:`kvcore.KVCacheManager`.

    Raises:
        InvalidConfigError: unknown model (the message lists the shipped
            ones), a malformed config (naming the file and the field), a
            ``dtype`` that is neither a plain dtype nor a declared KV format
            (the message lists both), bad option (a plan option no selected
            plugin declares, or a value it does not accept), or layers that
            cannot be grouped.
        InsufficientMemoryError: (an ``InvalidConfigError``) the memory cannot
            hold one request of ``max_model_len`` tokens (or, when fitting, of
            one token); the message states the memory needed.
        UnknownSpecError: a layer kind, or a group's spec, is served by no
            selected plugin.
    """
    registry = load_registry() if registry is None else registry
    cfg = model if isinstance(model, ModelConfig) else load_model_config(model, registry)
    if group_size_rule not in GROUP_SIZE_RULES:
        msg = (
            f"group_size_rule must be one of {', '.join(GROUP_SIZE_RULES)}, got {group_size_rule!r}"
        )
        raise InvalidConfigError(msg)
    registry.plan_option_values(options)  # an unknown option fails before anything is built
    memory_bytes = parse_memory(memory)
    block = _positive("block_size", DEFAULT_BLOCK_SIZE if block_size is None else block_size)
    fit = _fits_max_model_len(max_model_len)
    limits = _token_limits(cfg, None if fit else max_model_len, max_num_batched_tokens)
    if num_blocks is not None:
        _positive("num_blocks", num_blocks)
    layer_specs = build_layer_specs(
        cfg,
        registry,
        block_size=block,
        dtype=None if dtype is None else registry.cache_dtype(dtype),
        max_model_len=limits.max_model_len,
        options=options,
    )
    aligned = align_state_pages(layer_specs)

    def assemble(rule: str, limits: TokenLimits, *, sized: bool) -> KVCachePlan:
        groups = get_kv_cache_groups(
            aligned, hybrid=hybrid, layout=layout, group_size_rule=rule, limits=limits
        )
        for kv_group in groups:
            registry.manager_class(kv_group.kv_cache_spec)
        if sized:
            available = memory_bytes if num_blocks is None else num_blocks * bytes_per_block(groups)
            limits = _fitted(groups, available, limits, fit=fit)
        return _assemble(
            cfg,
            layer_specs,
            groups,
            limits,
            memory_bytes,
            num_blocks=num_blocks,
            layout=layout,
            rule=rule,
            hybrid=hybrid,
        )

    result = assemble(group_size_rule, limits, sized=True)
    if group_size_rule != "reference":
        reference = assemble("reference", result.limits, sized=False)
        result = attrs.evolve(result, reference=reference)
    groups = list(result.kv_cache_config.kv_cache_groups)
    model_max_len = cfg.max_model_len
    notes = _notes(layer_specs, aligned, groups, result.limits, model_max_len, hybrid, fitted=fit)
    return attrs.evolve(
        result, notes=notes, max_model_len_fitted=fit, num_blocks_given=num_blocks is not None
    )


def _fits_max_model_len(max_model_len: object) -> bool:
    """Whether ``max_model_len`` asks for the longest request that fits (``None`` or ``-1``)."""
    if max_model_len is None or (max_model_len == FIT_MAX_MODEL_LEN and type(max_model_len) is int):
        return True
    if type(max_model_len) is not int or max_model_len <= 0:
        msg = (
            "max_model_len must be a positive integer, or -1 to fit the longest that fits, "
            f"got {max_model_len!r}"
        )
        raise InvalidConfigError(msg)
    return False


def _token_limits(
    cfg: ModelConfig, max_model_len: int | None, max_num_batched_tokens: int | None
) -> TokenLimits:
    """The limits asked for: the model's context length unless ``max_model_len`` is given."""
    batched = (
        DEFAULT_MAX_NUM_BATCHED_TOKENS if max_num_batched_tokens is None else max_num_batched_tokens
    )
    return TokenLimits(
        max_model_len=_positive(
            "max_model_len", cfg.max_model_len if max_model_len is None else max_model_len
        ),
        max_num_batched_tokens=_positive("max_num_batched_tokens", batched),
        max_num_encoder_tokens=cfg.max_num_encoder_tokens,
    )


def _fitted(
    groups: list[KVCacheGroupSpec], available: int, limits: TokenLimits, *, fit: bool
) -> TokenLimits:
    """``limits`` checked against ``available`` bytes; with ``fit``, the longest request that fits.

    Raises:
        InsufficientMemoryError: not even one request fits (of one token, when fitting).
    """
    if not groups:
        return limits
    if not fit:
        check_fits(groups, available, limits)
        return limits
    fitted = fit_max_model_len(groups, available, limits)
    if fitted == 0:
        check_fits(groups, available, attrs.evolve(limits, max_model_len=1))
    return attrs.evolve(limits, max_model_len=fitted)


def print_plan(model: str | Path | ModelConfig, **options: Any) -> KVCachePlan:
    """Plan ``model`` (see :func:`~kvcore.plan`, same options), print its summary and return it.

    The summary lists every group (type, layers, block size, page size,
    blocks per request, wasted bytes per block), then the block count, the
    memory one longest request needs, the token capacity, the maximum
    concurrency and the wasted bytes.
    """
    result = plan(model, **options)
    print(result.summary())
    return result
