"""Drive vLLM's scheduler, stock and on kvcore, side by side on the same requests.

Everything here is vLLM's real code (``vllm.v1.core.sched.scheduler``, its
configs, requests and outputs) except the model: each step's sampled tokens
are a function of the request and position, and EAGLE drafts are accepted by
a fixed rule, so both schedulers see the same outputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm.config import (
    CacheConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

MODELS = Path(__file__).resolve().parent / "models"
HASH_UNIT = 512  # Mooncake: one hash id per 512 prompt tokens
OUTPUT_TOKEN_BASE = 10**9  # output token ids never equal a prompt's

init_none_hash(sha256)


@dataclass(frozen=True)
class TraceRequest:
    """One Mooncake request as token ids: ``hash_id * 512 + i`` per 512-token unit."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int


def mooncake_requests(
    path: Path, count: int, *, max_model_len: int, max_tokens: int
) -> list[TraceRequest]:
    """The first ``count`` requests, outputs capped at ``max_tokens``, fitting the model."""
    requests = []
    with path.open() as lines:
        for index, line in zip(range(count), lines, strict=False):
            record = json.loads(line)
            tokens = [h * HASH_UNIT + i for h in record["hash_ids"] for i in range(HASH_UNIT)]
            outputs = max(1, min(record["output_length"], max_tokens))
            length = min(record["input_length"], max_model_len - outputs)
            requests.append(TraceRequest(str(index), tuple(tokens[:length]), outputs))
    return requests


def output_token(request_id: str, position: int) -> int:
    """The token a request generates at ``position`` (the same in every run)."""
    return OUTPUT_TOKEN_BASE + (int(request_id) * 7919 + position) % 50000


# -- configurations ----------------------------------------------------------------------


def full_spec(block_size: int) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=2, head_size=16, dtype=torch.float16
    )


def window_spec(block_size: int, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=2,
        head_size=16,
        dtype=torch.float16,
        sliding_window=window,
    )


def mamba_spec(block_size: int) -> MambaSpec:
    return MambaSpec(
        block_size=block_size, shapes=((4, 64), (2, 16, 16)), dtypes=(torch.float16,) * 2
    )


def kv_cache_config(num_blocks: int, specs: Sequence[KVCacheSpec]) -> KVCacheConfig:
    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


@dataclass(frozen=True)
class Setup:
    """What one lockstep run builds both schedulers from."""

    specs: tuple[KVCacheSpec, ...]
    num_blocks: int
    block_size: int = 16
    max_model_len: int = 32768
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 8192
    num_speculative_tokens: int = 0  # > 0: EAGLE with that many drafts
    connector: bool = False  # the external-token connector of lockstep_connector


def vllm_config(setup: Setup) -> VllmConfig:
    model = ModelConfig(
        model=str(MODELS / "tiny-llama"),
        dtype="float16",
        seed=0,
        skip_tokenizer_init=True,
        max_model_len=setup.max_model_len,
    )
    parallel = ParallelConfig()
    speculative = None
    if setup.num_speculative_tokens:
        speculative = SpeculativeConfig(
            method="eagle",
            model=str(MODELS / "tiny-eagle"),
            num_speculative_tokens=setup.num_speculative_tokens,
            target_model_config=model,
            target_parallel_config=parallel,
        )
    transfer = None
    if setup.connector:
        transfer = KVTransferConfig(
            kv_connector="LockstepConnector",
            kv_connector_module_path="lockstep_connector",
            kv_role="kv_both",
        )
    cache = CacheConfig(block_size=setup.block_size, enable_prefix_caching=True)
    cache.num_gpu_blocks = setup.num_blocks
    scheduler = SchedulerConfig(
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        max_model_len=setup.max_model_len,
        is_encoder_decoder=False,
    )
    return VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=cache,
        parallel_config=parallel,
        speculative_config=speculative,
        kv_transfer_config=transfer,
    )


def make_scheduler(cls: type[Scheduler], setup: Setup) -> Scheduler:
    config = vllm_config(setup)
    return cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config(setup.num_blocks, setup.specs),
        structured_output_manager=StructuredOutputManager(config),
        block_size=setup.block_size,
        log_stats=True,
    )


def vllm_request(trace: TraceRequest, block_size: int) -> Request:
    return Request(
        request_id=trace.request_id,
        prompt_token_ids=list(trace.prompt),
        sampling_params=SamplingParams(max_tokens=trace.max_tokens, ignore_eos=True),
        pooling_params=None,
        eos_token_id=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


# -- one step ----------------------------------------------------------------------------


def step_record(output: SchedulerOutput, scheduler: Scheduler) -> dict[str, Any]:
    """Everything a step decided, in plain values: what must be equal between runs."""
    cached = output.scheduled_cached_reqs
    stats = scheduler.make_stats()
    prefix = stats.prefix_cache_stats if stats is not None else None
    return {
        "new": [(r.req_id, r.block_ids, r.num_computed_tokens) for r in output.scheduled_new_reqs],
        "cached": list(
            zip(
                cached.req_ids,
                cached.resumed_req_ids if hasattr(cached, "resumed_req_ids") else [],
                cached.new_block_ids,
                cached.num_computed_tokens,
                strict=False,
            )
        ),
        "resumed": sorted(getattr(cached, "resumed_req_ids", ()) or ()),
        "tokens": dict(output.num_scheduled_tokens),
        "spec": {k: list(v) for k, v in output.scheduled_spec_decode_tokens.items()},
        "preempted": sorted(output.preempted_req_ids or ()),
        "finished": sorted(output.finished_req_ids),
        "common_prefix": list(output.num_common_prefix_blocks),
        "usage": scheduler.kv_cache_manager.usage,
        "hits": None
        if prefix is None
        else (
            prefix.requests,
            prefix.queries,
            prefix.hits,
            prefix.preempted_requests,
            prefix.preempted_queries,
            prefix.preempted_hits,
        ),
    }


def model_output(output: SchedulerOutput, scheduler: Scheduler, step: int) -> ModelRunnerOutput:
    """Sampled tokens for the requests that finished their prefill or decode this step.

    A request whose scheduled tokens reach its token count samples one token
    plus the drafts accepted by a fixed rule (the first ``step % (drafts + 1)``).
    """
    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        drafts = output.scheduled_spec_decode_tokens.get(req_id, [])
        if request.num_computed_tokens - len(drafts) < request.num_tokens:
            sampled.append([])  # a chunk of the prompt: nothing sampled
            continue
        accepted = step % (len(drafts) + 1) if drafts else 0
        start = request.num_tokens
        sampled.append([output_token(req_id, start + i) for i in range(accepted + 1)])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def propose_drafts(scheduler: Scheduler, output: SchedulerOutput, num_drafts: int) -> None:
    """EAGLE's proposals for the next step: the tokens the model will sample, so some match."""
    req_ids = [r for r in output.num_scheduled_tokens if r in scheduler.requests]
    drafts = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        drafts.append([output_token(req_id, request.num_tokens + i) for i in range(num_drafts)])
    scheduler.update_draft_token_ids(DraftTokenIds(req_ids, drafts))


def run(
    schedulers: Sequence[Scheduler],
    requests: Sequence[TraceRequest],
    setup: Setup,
    *,
    arrivals_per_step: int,
    max_steps: int,
    on_step: Callable[[int, list[dict[str, Any]]], None],
) -> int:
    """Step every scheduler until all requests finish; ``on_step`` gets each step's records.

    Returns the number of steps.
    """
    pending: Iterator[TraceRequest] = iter(requests)
    remaining = len(requests)
    step = 0
    while (remaining or any(s.has_requests() for s in schedulers)) and step < max_steps:
        for trace in [t for _, t in zip(range(arrivals_per_step), pending, strict=False)]:
            remaining -= 1
            for scheduler in schedulers:
                scheduler.add_request(vllm_request(trace, setup.block_size))
        records = []
        for scheduler in schedulers:
            output = scheduler.schedule()
            result = model_output(output, scheduler, step)
            scheduler.update_from_output(output, result)
            if setup.num_speculative_tokens:
                propose_drafts(scheduler, output, setup.num_speculative_tokens)
            records.append(step_record(output, scheduler))
        on_step(step, records)
        step += 1
    return step
