"""Record an op sequence from real prompts and replay it through kvcore and vLLM.

A small continuous-batching loop drives kvcore and records what it did:
admission = cache lookup + one allocation for the uncached prompt, one decode
token per running request per step, preemption of the newest request when the
pool is full, free on finish. The recorded sequence is then replayed through
kvcore and through vLLM 0.14's ``KVCacheManager`` (same specs, same process),
recording every observable result (hit lengths and blocks per group, new
block ids per group, refusals) so the two can be compared for equality.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kvcore
from kvcore.specs import KVCacheSpec

NEW, LOOKUP, ADMIT, DECODE, FREE, PREEMPT = range(6)
OUTPUT_TOKEN_BASE = 1 << 40
MAX_MODEL_LEN = 1 << 20


class Case:
    """One model: kvcore specs, the matching vLLM specs, and how to run it."""

    def __init__(
        self,
        name: str,
        kvcore_specs: Callable[[int], list[KVCacheSpec]],
        vllm_specs: Callable[[Any, int], list[Any]],
        *,
        enable_caching: bool = True,
        num_encoder_tokens: int = 0,
        note: str = "",
    ) -> None:
        self.name = name
        self.kvcore_specs = kvcore_specs
        self.vllm_specs = vllm_specs
        self.enable_caching = enable_caching
        self.num_encoder_tokens = num_encoder_tokens
        self.note = note


def make_kvcore(case: Case, num_blocks: int, block_size: int, hash_algorithm: str) -> Any:
    config = kvcore.KVCacheConfig.from_specs(num_blocks, case.kvcore_specs(block_size))
    return kvcore.KVCacheManager(
        config, MAX_MODEL_LEN, enable_caching=case.enable_caching, hash_algorithm=hash_algorithm
    )


def record_ops(
    case: Case,
    prompts: list[tuple[int, ...]],
    output_lengths: list[int],
    num_blocks: int,
    block_size: int,
    max_running: int,
) -> list[tuple[int, ...]]:
    """Drive kvcore with a tiny FCFS scheduler and record what it did."""
    manager = make_kvcore(case, num_blocks, block_size, "fast")
    enc = case.num_encoder_tokens
    ops: list[tuple[int, ...]] = []
    requests: dict[int, kvcore.Request] = {}
    waiting = list(range(len(prompts)))
    running: list[int] = []
    produced = [0] * len(prompts)
    while waiting or running:
        while waiting and len(running) < max_running:
            index = waiting[0]
            if index not in requests:
                requests[index] = kvcore.Request(str(index), prompts[index])
                ops.append((NEW, index))
            request = requests[index]
            ops.append((LOOKUP, index))
            hit, num_hit = manager.get_computed_blocks(request)
            num_new = request.num_tokens - num_hit
            ops.append((ADMIT, index, num_new))
            if (
                manager.allocate_slots(request, num_new, num_hit, hit, num_encoder_tokens=enc)
                is None
            ):
                break
            request.num_computed_tokens = request.num_tokens
            waiting.pop(0)
            running.append(index)
        if not running:
            break  # the first waiting request can never fit
        for index in list(running):
            if index not in running:
                continue
            request = requests[index]
            if produced[index] >= output_lengths[index]:
                ops.append((FREE, index))
                manager.free(request)
                running.remove(index)
                continue
            token = OUTPUT_TOKEN_BASE + index * 100_000 + produced[index]
            while True:
                ops.append((DECODE, index, token))
                request.append_output_token_ids(token)
                if manager.allocate_slots(request, 1, num_encoder_tokens=enc) is not None:
                    request.num_computed_tokens += 1
                    produced[index] += 1
                    break
                request._all_token_ids.pop()
                victim = running.pop()
                ops.append((PREEMPT, victim))
                manager.free(requests[victim])
                requests[victim].num_computed_tokens = 0
                waiting.insert(0, victim)
                if victim == index:
                    break
    return ops


def replay_kvcore(
    case: Case,
    ops: list[tuple[int, ...]],
    prompts: list[tuple[int, ...]],
    num_blocks: int,
    bs: int,
    hash_algorithm: str = "sha256",
) -> list[Any]:
    """Run the recorded ops through kvcore; return every observable result."""
    manager = make_kvcore(case, num_blocks, bs, hash_algorithm)
    get_computed_blocks = manager.get_computed_blocks
    allocate_slots = manager.allocate_slots
    free = manager.free
    enc = case.num_encoder_tokens
    Request = kvcore.Request
    requests: dict[int, Any] = {}
    hits: dict[int, Any] = {}
    out: list[Any] = []
    record = out.append
    for op in ops:
        kind = op[0]
        if kind == DECODE:
            request = requests[op[1]]
            request.append_output_token_ids(op[2])
            blocks = allocate_slots(request, 1, num_encoder_tokens=enc)
            if blocks is None:
                request._all_token_ids.pop()
                record(None)
            else:
                request.num_computed_tokens += 1
                record([list(g) for g in blocks.blocks])
        elif kind == NEW:
            requests[op[1]] = Request(str(op[1]), prompts[op[1]])
        elif kind == LOOKUP:
            hit = get_computed_blocks(requests[op[1]])
            hits[op[1]] = hit
            record((hit[1], [list(g) for g in hit[0].blocks]))
        elif kind == ADMIT:
            request = requests[op[1]]
            hit_blocks, num_hit = hits.pop(op[1])
            blocks = allocate_slots(request, op[2], num_hit, hit_blocks, num_encoder_tokens=enc)
            if blocks is None:
                record(None)
            else:
                request.num_computed_tokens = request.num_tokens
                record([list(g) for g in blocks.blocks])
        else:
            request = requests[op[1]]
            free(request)
            if kind == PREEMPT:
                request.num_computed_tokens = 0
    return out


def replay_vllm(
    vllm: Any,
    case: Case,
    ops: list[tuple[int, ...]],
    prompts: list[tuple[int, ...]],
    num_blocks: int,
    bs: int,
) -> list[Any]:
    """Run the recorded ops through vLLM's KVCacheManager; same results format."""
    iface = vllm.kv_cache_interface
    groups = [
        iface.KVCacheGroupSpec([f"layer.{i}"], spec)
        for i, spec in enumerate(case.vllm_specs(vllm, bs))
    ]
    config = iface.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    vllm.kv_cache_utils.init_none_hash(vllm.sha256)
    hasher = vllm.kv_cache_utils.get_request_block_hasher(bs, vllm.sha256)
    manager = vllm.kv_cache_manager.KVCacheManager(
        config, MAX_MODEL_LEN, hash_block_size=bs, enable_caching=case.enable_caching
    )
    params = vllm.SamplingParams(max_tokens=1 << 20)
    Request = vllm.request.Request
    get_computed_blocks = manager.get_computed_blocks
    allocate_slots = manager.allocate_slots
    free = manager.free
    enc = case.num_encoder_tokens
    requests: dict[int, Any] = {}
    hits: dict[int, Any] = {}
    out: list[Any] = []
    record = out.append

    def ids(blocks: Any) -> list[list[int]]:
        return [[b.block_id for b in group] for group in blocks.blocks]

    for op in ops:
        kind = op[0]
        if kind == DECODE:
            request = requests[op[1]]
            request.append_output_token_ids(op[2])
            blocks = allocate_slots(request, 1, num_encoder_tokens=enc)
            if blocks is None:
                request._output_token_ids.pop()
                request._all_token_ids.pop()
                record(None)
            else:
                request.num_computed_tokens += 1
                record(ids(blocks))
        elif kind == NEW:
            requests[op[1]] = Request(
                str(op[1]), list(prompts[op[1]]), params, None, None, block_hasher=hasher
            )
        elif kind == LOOKUP:
            hit = get_computed_blocks(requests[op[1]])
            hits[op[1]] = hit
            record((hit[1], ids(hit[0])))
        elif kind == ADMIT:
            request = requests[op[1]]
            hit_blocks, num_hit = hits.pop(op[1])
            blocks = allocate_slots(request, op[2], num_hit, hit_blocks, num_encoder_tokens=enc)
            if blocks is None:
                record(None)
            else:
                request.num_computed_tokens = request.num_tokens
                record(ids(blocks))
        else:
            request = requests[op[1]]
            free(request)
            if kind == PREEMPT:
                request.num_computed_tokens = 0
    return out
