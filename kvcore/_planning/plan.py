"""``kvcore.plan``: a model and an amount of memory → a ready :class:`KVCacheConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from kvcore._config import KVCacheGroupSpec, KVCacheLayout
from kvcore._hits import hash_and_alignment
from kvcore._planning.alignment import align_state_pages
from kvcore._planning.group_size import GROUP_SIZE_RULES
from kvcore._planning.grouping import get_kv_cache_groups, natural_page_groups
from kvcore._planning.kv_cache_plan import KVCachePlan
from kvcore._planning.layout import bytes_per_block
from kvcore._planning.memory import parse_memory
from kvcore._planning.model_config import ModelConfig, build_layer_specs, load_model_config
from kvcore._planning.notes import shared_notes, two_level_notes
from kvcore._planning.page_classes import PageClasses, page_classes
from kvcore._planning.pool_choice import (
    PoolChoice,
    ResolvedPool,
    check_pool,
    check_shared_checkpoint,
    checkpoint_states,
    resolve_pool,
)
from kvcore._planning.report import group_reports
from kvcore._planning.sizing import (
    check_fits,
    fit_max_model_len,
    get_kv_cache_config,
)
from kvcore._planning.two_level import two_level_config
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._utils import format_bytes
from kvcore.errors import InvalidConfigError, KVCoreError
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


def _positive(name: str, value: object) -> int:
    if type(value) is not int or value <= 0:
        msg = f"{name} must be a positive integer, got {value!r}"
        raise InvalidConfigError(msg)
    return value


@attrs.frozen(kw_only=True)
class _Planner:
    """What every assembly of one :func:`plan` call shares: the specs, memory and choices."""

    cfg: ModelConfig
    layer_specs: dict[str, KVCacheSpec]
    specs: dict[str, KVCacheSpec]  # aligned (shared pool) or checkpointed (two-level)
    registry: Registry
    memory_bytes: int
    num_blocks: int | None
    layout: KVCacheLayout
    hybrid: bool
    fit: bool
    pool: ResolvedPool

    def groups(self, rule: str, limits: TokenLimits) -> list[KVCacheGroupSpec]:
        """The groups of the pool's design, each served by a selected plugin."""
        if self.pool == "shared":
            groups = get_kv_cache_groups(
                self.specs,
                hybrid=self.hybrid,
                layout=self.layout,
                group_size_rule=rule,
                limits=limits,
            )
        else:
            groups = natural_page_groups(
                self.specs, hybrid=self.hybrid, group_size_rule=rule, limits=limits
            )
        for kv_group in groups:
            self.registry.manager_class(kv_group.kv_cache_spec)
        return groups

    def assemble(self, rule: str, limits: TokenLimits, *, sized: bool) -> KVCachePlan:
        """The plan with group size ``rule``; ``sized``: checked (or fitted) against the memory."""
        groups = self.groups(rule, limits)
        classes = page_classes(groups, self.layout) if self.pool != "shared" and groups else None
        if sized:
            limits = _fitted(
                groups, self._available(groups, classes), limits, fit=self.fit, classes=classes
            )
        if classes is None:
            config = get_kv_cache_config(
                groups, self.memory_bytes, num_blocks=self.num_blocks, layout=self.layout
            )
        else:
            config = two_level_config(
                groups, classes, self.memory_bytes, num_large_pages=self.num_blocks
            )
        return KVCachePlan(
            model=self.cfg.name,
            source=self.cfg.source,
            kv_cache_config=config,
            layer_specs=self.layer_specs,
            limits=limits,
            model_max_len=self.cfg.max_model_len,
            memory_bytes=self.memory_bytes,
            groups=tuple(group_reports(groups, limits, classes)),
            group_size_rule=rule,
            hybrid=self.hybrid,
            pool=self.pool,
            page_classes=classes,
            hit_alignment=self._hit_alignment(groups),
        )

    def _available(self, groups: list[KVCacheGroupSpec], classes: PageClasses | None) -> int:
        """Bytes to size for: the memory, or what ``num_blocks`` blocks (large pages) cost."""
        if self.num_blocks is None:
            return self.memory_bytes
        unit = bytes_per_block(groups) if classes is None else classes.bytes_per_large_page
        return self.num_blocks * unit

    def _hit_alignment(self, groups: list[KVCacheGroupSpec]) -> int:
        """The token multiple every prefix hit is (the hit rule's lcm of cached block sizes)."""
        specs = [group.kv_cache_spec for group in groups]
        cacheable = [self.registry.manager_class(s).is_prefix_cacheable(s) for s in specs]
        return hash_and_alignment(specs, cacheable)[1]


def _planner(
    cfg: ModelConfig,
    layer_specs: dict[str, KVCacheSpec],
    *,
    pool: object,
    mamba_checkpoint: int | None,
    block_size: int,
    **shared: Any,
) -> tuple[_Planner, int | None, str | None]:
    """The planner of the pool asked for, the state checkpoint grid it uses, and why.

    The third value is a manager's refusal of the default grid (the grid
    then is the attention block size), else ``None``.
    """
    resolved = resolve_pool(pool, layer_specs)
    if resolved == "shared":
        specs = align_state_pages(layer_specs)
        check_shared_checkpoint(specs, mamba_checkpoint, model=cfg.name)
        checkpoint = mamba_checkpoint
        refused = None
    else:
        specs, checkpoint = checkpoint_states(
            layer_specs, mamba_checkpoint, block_size=block_size, model=cfg.name
        )
        refused = None
        if mamba_checkpoint is None and checkpoint is not None:
            refused = _refused_grid(specs, shared["registry"])
            if refused is not None:
                specs, checkpoint = checkpoint_states(
                    layer_specs, block_size, block_size=block_size, model=cfg.name
                )
    planner = _Planner(cfg=cfg, layer_specs=layer_specs, specs=specs, pool=resolved, **shared)
    return planner, checkpoint, refused


def _refused_grid(specs: Mapping[str, KVCacheSpec], registry: Registry) -> str | None:
    """Why a manager refuses the hit grid of ``specs`` with prefix caching on, or ``None``.

    A type whose hit search cannot align its hits to more than its own block
    (chunked local attention) refuses states checkpointed more coarsely.
    """
    distinct = list(dict.fromkeys(specs.values()))
    classes = [registry.manager_class(spec) for spec in distinct]
    cacheable = [cls.is_prefix_cacheable(s) for cls, s in zip(classes, distinct, strict=True)]
    alignment = hash_and_alignment(distinct, cacheable)[1]
    for cls, spec in zip(classes, distinct, strict=True):
        try:
            cls.validate_config(
                spec, enable_caching=True, use_eagle=False, alignment_tokens=alignment
            )
        except InvalidConfigError as exc:
            return str(exc)
    return None


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
    pool: PoolChoice = "auto",
    mamba_checkpoint: int | None = None,
) -> KVCachePlan:
    """Plan the KV cache of a model in an amount of memory.

    Reads the model's config, builds every layer's spec through the plugins
    (:func:`~kvcore.hookspecs.kvcore_layer_kinds`), groups the layers,
    checks that one request of ``max_model_len`` tokens fits, and sizes the
    pool. For the shared pool it first aligns state pages with attention
    pages and groups by one page size
    (:func:`kvcore.planning.get_kv_cache_groups`); for the two-level pool
    every group keeps its natural block size and page, and the groups' pages
    become page classes carved from large pages.

    Args:
        model: A shipped model name (:func:`kvcore.planning.list_models`), a path to a
            ``config.json`` (or its directory), or a loaded
            :class:`~kvcore.planning.ModelConfig`.
        memory: Bytes for the KV cache: an ``int`` or a string such as
            ``"80GiB"`` or ``"24GB"``.
        max_model_len: Longest request, in tokens. ``None`` or ``-1`` (the
            reference engine's spelling): the model's context length, lowered
            to the longest that fits the memory. Given explicitly, it must fit.
        block_size: Tokens per attention block (default 16); under the shared
            pool raised for models with state layers until an attention page
            holds a state.
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
        num_blocks: Use this many blocks instead of what ``memory`` holds
            (large pages, under the two-level pool).
        layout: ``"layer_outer"`` or ``"block_outer"`` (pages of different
            sizes packed side by side instead of unified).
        hybrid: ``False``: allocate the layers of local types for every
            token, in one block table (engines without the hybrid manager).
        options: Plugins' plan options, ``"<plugin>.<option>"`` → value
            (``{"mamba.cache_mode": "none"}``); ``kvcore plugins`` lists them.
        pool: ``"auto"`` (default): ``"two-level"`` where the layers' natural
            pages differ, or where they agree but the shared plan wastes
            bytes (padding layer slots) and the two-level plan wastes fewer
            (``num_blocks`` not given; a note says so); else ``"shared"``.
            ``"shared"``: one page size for every group, as the reference
            engine plans. ``"two-level"``:
            every group keeps its natural page, carved from large pages.
        mamba_checkpoint: Tokens between two cached states of a state group
            (Mamba, linear attention) in the ``"align"`` cache mode: a
            positive multiple of ``block_size``; default 512 (rounded up to
            a multiple of ``block_size``), or ``block_size`` when a group's
            manager refuses hits aligned past its own block (the plan's
            notes say so). Under the shared pool the states follow the
            raised attention block size, so only that value is accepted.

    Returns:
        The plan; ``plan.kv_cache_config`` and ``plan.max_model_len`` build a
        :class:`kvcore.KVCacheManager`.

    Raises:
        InvalidConfigError: unknown model (the message lists the shipped
            ones), a malformed config (naming the file and the field), a
            ``dtype`` that is neither a plain dtype nor a declared KV format
            (the message lists both), bad option (a plan option no selected
            plugin declares, or a value it does not accept), an unknown
            ``pool``, a ``mamba_checkpoint`` the pool cannot give (the message
            names the valid values), or layers that cannot be grouped.
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
    check_pool(pool)
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
    choice = _PoolPlan(
        cfg=cfg,
        layer_specs=layer_specs,
        limits=limits,
        group_size_rule=group_size_rule,
        mamba_checkpoint=mamba_checkpoint,
        block_size=block,
        fit=fit,
        shared={
            "registry": registry,
            "memory_bytes": memory_bytes,
            "num_blocks": num_blocks,
            "layout": layout,
            "hybrid": hybrid,
            "fit": fit,
        },
    )
    resolved = resolve_pool(pool, layer_specs)
    result = choice.plan(resolved)
    if pool == "auto" and resolved == "shared" and num_blocks is None and result.waste_fraction:
        result = choice.least_waste(result)
    return result


@attrs.frozen(kw_only=True)
class _PoolPlan:
    """Everything :func:`plan` decided before the pool: plans it for either pool."""

    cfg: ModelConfig
    layer_specs: dict[str, KVCacheSpec]
    limits: TokenLimits
    group_size_rule: str
    mamba_checkpoint: int | None
    block_size: int
    fit: bool
    shared: dict[str, Any]

    def least_waste(self, shared_plan: KVCachePlan) -> KVCachePlan:
        """``pool="auto"`` for layers of one page: the two-level plan if it wastes less.

        The layers need no page unification, but the shared pool may still
        waste bytes (padding layer slots of groups with fewer layers); a
        two-level pool whose groups' pages differ by their layer count (the
        block-outer layout) need not. Ties, and a two-level plan that does
        not fit, keep the shared plan.
        """
        try:
            two_level = self.plan("two-level")
        except KVCoreError:
            return shared_plan
        if two_level.waste_fraction >= shared_plan.waste_fraction:
            return shared_plan
        note = (
            "planned for the two-level pool although every layer has one page: the shared "
            f"pool would waste {format_bytes(shared_plan.wasted_bytes)} "
            f"({shared_plan.waste_fraction:.2%} of the pool) in padding layer slots, this one "
            f"{format_bytes(two_level.wasted_bytes)}; pool='shared' plans it as the reference does"
        )
        return attrs.evolve(two_level, notes=(note, *two_level.notes))

    def plan(self, pool: ResolvedPool) -> KVCachePlan:
        """The plan for ``pool``, with its notes."""
        planner, checkpoint, refused = _planner(
            self.cfg,
            self.layer_specs,
            pool=pool,
            mamba_checkpoint=self.mamba_checkpoint,
            block_size=self.block_size,
            **self.shared,
        )
        return _finish(
            planner,
            self.group_size_rule,
            self.limits,
            checkpoint=checkpoint,
            refused=refused,
            block_size=self.block_size,
        )


def _finish(
    planner: _Planner,
    group_size_rule: str,
    limits: TokenLimits,
    *,
    checkpoint: int | None,
    refused: str | None,
    block_size: int,
) -> KVCachePlan:
    """Assemble the plan of ``planner`` (and the reference plan beside a gcd one), with notes."""
    cfg, layer_specs, fit, hybrid = planner.cfg, planner.layer_specs, planner.fit, planner.hybrid
    result = planner.assemble(group_size_rule, limits, sized=True)
    if group_size_rule != "reference":
        reference = planner.assemble("reference", result.limits, sized=False)
        result = attrs.evolve(result, reference=reference)
    groups = list(result.kv_cache_config.kv_cache_groups)
    model_max_len = cfg.max_model_len
    if planner.pool == "shared":
        notes = shared_notes(
            layer_specs, planner.specs, groups, result.limits, model_max_len, hybrid, fitted=fit
        )
    else:
        notes = two_level_notes(
            layer_specs,
            groups,
            result.limits,
            model_max_len,
            checkpoint=checkpoint,
            block_size=block_size,
            refused=refused,
            fitted=fit,
        )
    return attrs.evolve(
        result,
        notes=notes,
        max_model_len_fitted=fit,
        num_blocks_given=planner.num_blocks is not None,
        mamba_checkpoint=checkpoint,
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
    groups: list[KVCacheGroupSpec],
    available: int,
    limits: TokenLimits,
    *,
    fit: bool,
    classes: PageClasses | None,
) -> TokenLimits:
    """``limits`` checked against ``available`` bytes; with ``fit``, the longest request that fits.

    Raises:
        InsufficientMemoryError: not even one request fits (of one token, when fitting).
    """
    if not groups:
        return limits
    if not fit:
        check_fits(groups, available, limits, classes=classes)
        return limits
    fitted = fit_max_model_len(groups, available, limits, classes=classes)
    if fitted == 0:
        check_fits(groups, available, attrs.evolve(limits, max_model_len=1), classes=classes)
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
