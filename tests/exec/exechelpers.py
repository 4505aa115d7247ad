"""Helpers of the executor tests: plan a tiny model, run it through the engine loop."""

from __future__ import annotations

from collections.abc import Callable

import kvcore
from kvcore.executor import (
    EngineConfig,
    ExecutionReport,
    Executor,
    ReferenceEngine,
    synthetic_requests,
    tiny_model_path,
)
from kvcore.testing import check_manager_invariants


def tiny_plan(
    name: str,
    *,
    layout: str = "layer_outer",
    hybrid: bool = True,
    pressure: float = 1.5,
    block_size: int = 4,
    max_num_batched_tokens: int = 32,
    dtype: str | None = None,
    pool: str = "shared",
    mamba_checkpoint: int | None = None,
    plan_options: dict[str, str] | None = None,
) -> kvcore.KVCachePlan:
    """A tiny model's plan with a pool of ``pressure`` times what one longest request needs.

    ``pool`` defaults to the shared pool: the plans these tests check were
    made for it (``"auto"`` plans a two-level pool for the tiny models whose
    pages differ). Under the two-level pool the need is counted in large pages.
    """
    options = dict(
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        layout=layout,
        hybrid=hybrid,
        dtype=dtype,
        pool=pool,
        mamba_checkpoint=mamba_checkpoint,
        options=plan_options,
    )
    path = tiny_model_path(name)
    base = kvcore.plan(path, memory="64MiB", **options)
    if base.page_classes is not None:
        need = base.memory_needed_bytes // base.page_classes.bytes_per_large_page
    else:
        reserved = sum(
            g.kv_cache_spec.pool_reserved_blocks for g in base.kv_cache_config.kv_cache_groups
        )
        need = base.blocks_per_request + 1 + reserved
    return kvcore.plan(path, num_blocks=int(need * pressure), **options)


def is_encoder_decoder(plan: kvcore.KVCachePlan) -> bool:
    return any(spec.kind == "cross_attention" for spec in plan.layer_specs.values())


def _after_step(
    engine: ReferenceEngine, invariants: bool, on_step: Callable[[ReferenceEngine], None] | None
) -> None:
    if invariants:
        check_manager_invariants(engine.manager)
    if on_step is not None:
        on_step(engine)


def run_engine(
    plan: kvcore.KVCachePlan,
    *,
    num_requests: int = 14,
    config: EngineConfig | None = None,
    use_eagle: bool = False,
    seed: int = 0,
    max_output: int = 12,
    invariants: bool = True,
    on_step: Callable[[ReferenceEngine], None] | None = None,
) -> tuple[Executor, ReferenceEngine, ExecutionReport]:
    """Serve synthetic requests through the plan's cache; check invariants after every step.

    ``on_step`` is called after every step too (after the invariants).
    """
    encoder = is_encoder_decoder(plan)
    executor = Executor.from_plan(plan, enable_caching=not encoder, use_eagle=use_eagle, seed=seed)
    requests = synthetic_requests(
        num_requests,
        max_model_len=plan.max_model_len,
        seed=seed,
        max_output=max_output,
        num_encoder_tokens=20 if encoder else 0,
    )
    engine = ReferenceEngine(
        executor,
        requests,
        config or EngineConfig(reset_prefix_cache_at=(15,)),
        on_step=lambda e: _after_step(e, invariants, on_step),
    )
    engine.run()
    return executor, engine, executor.check()
