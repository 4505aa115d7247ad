"""Record an op sequence from real prompts and replay it through kvcore and vLLM.

A small continuous-batching loop drives kvcore and records what it did:
admission = cache lookup + one allocation for the uncached prompt, one decode
token per running request per step, preemption of the newest request when the
pool is full, free on finish. The recorded sequence is then replayed through
kvcore and through vLLM 0.14's ``KVCacheManager`` (same specs, same process),
recording every observable result (hit lengths and blocks per group, new
block ids per group, refusals) so the two can be compared for equality.

**Aged pools.** By default the sequence starts with an untimed *ageing*
prefix: requests with prompts no other request shares are admitted until the
pool refuses even a one-block prompt, then all are freed. Afterwards (almost)
every block has been used, cached and freed, as on a server after its first
minutes, so every later allocation evicts a cached block, as it does in
steady state. A fresh pool flatters an implementation whose eviction is slow.

**Per-operation timing.** Every operation after the ageing prefix is timed
on its own (``perf_counter`` around the call; the benchmarks subtract the
measured cost of the two clock reads). Categories, the same for both
implementations:

``lookup``
    creating the request plus ``get_computed_blocks`` (vLLM hashes the prompt
    when the request is created, kvcore on the first lookup);
``admission``
    the ``allocate_slots`` call that admits a request with its cache hit;
``decode``
    appending one output token plus ``allocate_slots`` for it (vLLM hashes a
    completed block on append, kvcore in ``allocate_slots``);
``free``
    ``free`` of a finished or preempted request.

Turning the returned blocks into lists of ids for the comparison is not timed.
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from _common import CONVERSATION_TRACE

import kvcore
from kvcore._trace import read_mooncake_trace
from kvcore.specs import KVCacheSpec

# The replays do not announce steps (vLLM 0.14's behaviour, for identical
# results), so the Mamba plugin's warning about it would print once per
# manager built: it is expected here.
logging.getLogger("kvcore.mamba").setLevel(logging.ERROR)

NEW, LOOKUP, ADMIT, DECODE, FREE, PREEMPT = range(6)
#: The operation categories reported (see the module documentation).
CATEGORIES = ("lookup", "admission", "decode", "free")
_CATEGORY_OF_KIND = (0, 0, 1, 2, 3, 3)
OUTPUT_TOKEN_BASE = 1 << 40
#: Token ids of the ageing prompts (disjoint from trace and output tokens).
AGEING_TOKEN_BASE = 1 << 41
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


class Recording:
    """A recorded op sequence and the prompts it refers to.

    Attributes:
        ops: The operations, in order.
        prompts: Prompt token ids by request index (trace prompts, then the
            ageing prompts).
        timed_from: Index of the first op after the ageing prefix.
        num_blocks: Pool size the sequence was recorded with.
        block_size: Block size.
    """

    def __init__(
        self,
        ops: list[tuple[int, ...]],
        prompts: list[tuple[int, ...]],
        timed_from: int,
        num_blocks: int,
        block_size: int,
    ) -> None:
        self.ops = ops
        self.prompts = prompts
        self.timed_from = timed_from
        self.num_blocks = num_blocks
        self.block_size = block_size

    def counts(self) -> list[int]:
        """Timed operations per category (``CATEGORIES`` order)."""
        out = [0] * len(CATEGORIES)
        for op in self.ops[self.timed_from :]:
            if op[0] != NEW:
                out[_CATEGORY_OF_KIND[op[0]]] += 1
        return out

    def kind_counts(self) -> list[int]:
        """Timed operations per op kind (NEW .. PREEMPT)."""
        out = [0] * 6
        for op in self.ops[self.timed_from :]:
            out[op[0]] += 1
        return out


class Replay:
    """What one replay observed and how long each category of operation took.

    Attributes:
        results: Every observable result as text (its ``repr``), in op order
            (ageing prefix included).
        seconds: Per category (``CATEGORIES`` order), the summed time of the
            timed operations, clock reads included.
        clock_reads: Per category, how many timed spans were summed (to
            subtract the cost of the clock reads).
    """

    __slots__ = ("after", "clock_reads", "results", "seconds")

    def __init__(self, results: list[Any], seconds: list[float], clock_reads: list[int]) -> None:
        self.results = results
        self.seconds = seconds
        self.clock_reads = clock_reads
        #: What the ``after`` callback of the replay returned (``None`` without one).
        self.after: Any = None

    def per_op(self, counts: list[int], overhead: float) -> list[float]:
        """Seconds per operation of each category, less the clock overhead."""
        return [
            (s - n * overhead) / c if c else 0.0
            for s, n, c in zip(self.seconds, self.clock_reads, counts, strict=True)
        ]


def _by_category(spent: list[float], spans: list[int]) -> tuple[list[float], list[int]]:
    seconds = [0.0] * len(CATEGORIES)
    reads = [0] * len(CATEGORIES)
    for kind in range(6):
        seconds[_CATEGORY_OF_KIND[kind]] += spent[kind]
        reads[_CATEGORY_OF_KIND[kind]] += spans[kind]
    return seconds, reads


#: The options of :func:`add_trace_options`, as command-line flags (a
#: benchmark that replays in a child process passes them on).
TRACE_OPTIONS = ("trace", "requests", "block_size", "num_blocks", "max_running", "max_output")


def add_trace_options(
    parser: argparse.ArgumentParser,
    *,
    requests: int = 200,
    num_blocks: int = 12_000,
    max_output: int = 128,
) -> None:
    """Add the options of a replay of Mooncake requests (``TRACE_OPTIONS``) to ``parser``."""
    parser.add_argument("--trace", default=str(CONVERSATION_TRACE))
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=num_blocks)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument(
        "--max-output",
        type=int,
        default=max_output,
        help="cap on decode tokens per request (keeps the run short)",
    )


def trace_option_flags(args: argparse.Namespace) -> list[str]:
    """``args``' values of ``TRACE_OPTIONS`` as command-line flags."""
    flags = []
    for name in TRACE_OPTIONS:
        flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return flags


def trace_workload(
    args: argparse.Namespace, max_prompt: int | None = None
) -> tuple[list[list[int]], list[int]]:
    """Prompts and decode lengths of the first ``args.requests`` requests of ``args.trace``.

    Decode lengths are capped at ``args.max_output``, prompts (if given) at
    ``max_prompt`` tokens.
    """
    trace = list(read_mooncake_trace(args.trace, limit=args.requests))
    prompts = [r.prompt_token_ids[:max_prompt] for r in trace]
    return prompts, [min(r.output_length, args.max_output) for r in trace]


def make_kvcore(
    case: Case, num_blocks: int, block_size: int, hash_algorithm: str, backend: str | None = None
) -> Any:
    """A kvcore manager for ``case`` (``backend``: as ``KVCacheManager``'s, default auto)."""
    config = kvcore.KVCacheConfig.from_specs(num_blocks, case.kvcore_specs(block_size))
    return kvcore.KVCacheManager(
        config,
        MAX_MODEL_LEN,
        enable_caching=case.enable_caching,
        hash_algorithm=hash_algorithm,
        backend=backend,
    )


def record_ops(
    case: Case,
    prompts: Sequence[Sequence[int]],
    output_lengths: list[int],
    num_blocks: int,
    block_size: int,
    max_running: int,
    *,
    aged: bool = True,
    ageing_prompt_tokens: int = 1024,
) -> Recording:
    """Drive kvcore with a tiny FCFS scheduler and record what it did.

    With ``aged`` the sequence starts with the ageing prefix (module
    documentation), whose prompts are appended after ``prompts``.
    """
    manager = make_kvcore(case, num_blocks, block_size, "fast")
    enc = case.num_encoder_tokens
    ops: list[tuple[int, ...]] = []
    all_prompts = list(prompts)
    if aged:
        _age_recorded(manager, ops, all_prompts, block_size, enc, ageing_prompt_tokens)
    timed_from = len(ops)
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
                # Encoder tokens are passed only when a waiting request is
                # scheduled, as vLLM's scheduler does; a decode step has none.
                if manager.allocate_slots(request, 1) is not None:
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
    return Recording(ops, all_prompts, timed_from, num_blocks, block_size)


def _age_recorded(
    manager: Any,
    ops: list[tuple[int, ...]],
    prompts: list[tuple[int, ...]],
    block_size: int,
    enc: int,
    first_length: int,
) -> None:
    """The ageing prefix: admit unshared prompts, halving on refusal, then free them all."""
    live = []
    length = first_length
    while length >= block_size:
        index = len(prompts)
        base = AGEING_TOKEN_BASE + index * MAX_MODEL_LEN
        prompts.append(tuple(range(base, base + length)))
        request = kvcore.Request(str(index), prompts[index])
        ops.append((NEW, index))
        ops.append((LOOKUP, index))
        hit, num_hit = manager.get_computed_blocks(request)
        ops.append((ADMIT, index, length - num_hit))
        blocks = manager.allocate_slots(
            request, length - num_hit, num_hit, hit, num_encoder_tokens=enc
        )
        if blocks is None:
            length //= 2
            continue
        request.num_computed_tokens = length
        live.append((index, request))
    for index, request in live:
        ops.append((FREE, index))
        manager.free(request)


#: ``after(manager, make_request)``: called at the end of a replay with the
#: manager and a function ``(request_id, token_ids) -> request`` of the same
#: implementation, for benchmarks that time operations of their own.
After = Callable[[Any, Callable[[str, list[int]], Any]], Any]


def freeze_heap() -> None:
    """Leave every object made so far out of the cyclic collector's passes (the timed part starts).

    vLLM's engine core does the same once it has started
    (``vllm.utils.gc_utils.freeze_gc_heap``); without it, the collections
    that the replay's own allocations start would walk its recorded ops,
    prompts and results inside the timed operations. Undone with
    ``gc.unfreeze()`` when the replay ends. The results are kept as text
    (``repr``), which the collector does not track.
    """
    gc.collect()
    gc.freeze()


def replay_kvcore(
    case: Case,
    rec: Recording,
    hash_algorithm: str = "sha256",
    after: After | None = None,
    backend: str | None = None,
) -> Replay:
    """Run the recorded ops through kvcore; every observable result, and the times."""
    manager = make_kvcore(case, rec.num_blocks, rec.block_size, hash_algorithm, backend)
    get_computed_blocks = manager.get_computed_blocks
    allocate_slots = manager.allocate_slots
    free = manager.free
    enc = case.num_encoder_tokens
    prompts = rec.prompts
    timed_from = rec.timed_from
    Request = kvcore.Request
    clock = time.perf_counter
    requests: dict[int, Any] = {}
    hits: dict[int, Any] = {}
    out: list[Any] = []
    record = out.append
    spent = [0.0] * 6
    spans = [0] * 6
    for position, op in enumerate(rec.ops):
        if position == timed_from:
            spent = [0.0] * 6
            spans = [0] * 6
            freeze_heap()
        kind = op[0]
        if kind == DECODE:
            request = requests[op[1]]
            start = clock()
            request.append_output_token_ids(op[2])
            blocks = allocate_slots(request, 1)
            spent[DECODE] += clock() - start
            if blocks is None:
                request._all_token_ids.pop()
                record(None)
            else:
                request.num_computed_tokens += 1
                record(repr([list(g) for g in blocks.blocks]))
        elif kind == NEW:
            start = clock()
            requests[op[1]] = Request(str(op[1]), prompts[op[1]])
            spent[NEW] += clock() - start
        elif kind == LOOKUP:
            request = requests[op[1]]
            start = clock()
            hit = get_computed_blocks(request)
            spent[LOOKUP] += clock() - start
            hits[op[1]] = hit
            record(repr((hit[1], [list(g) for g in hit[0].blocks])))
        elif kind == ADMIT:
            request = requests[op[1]]
            hit_blocks, num_hit = hits.pop(op[1])
            start = clock()
            blocks = allocate_slots(request, op[2], num_hit, hit_blocks, num_encoder_tokens=enc)
            spent[ADMIT] += clock() - start
            if blocks is None:
                record(None)
            else:
                request.num_computed_tokens = request.num_tokens
                record(repr([list(g) for g in blocks.blocks]))
        else:
            request = requests[op[1]]
            start = clock()
            free(request)
            spent[kind] += clock() - start
            if kind == PREEMPT:
                request.num_computed_tokens = 0
        spans[kind] += 1
    if timed_from >= len(rec.ops):
        freeze_heap()
    replay = Replay(out, *_by_category(spent, spans))
    if after is not None:
        replay.after = after(manager, Request)
    gc.unfreeze()
    return replay


def replay_vllm(
    vllm: Any,
    case: Case,
    rec: Recording,
    hash_name: str = "sha256",
    after: After | None = None,
) -> Replay:
    """Run the recorded ops through vLLM's KVCacheManager; same results format."""
    iface = vllm.kv_cache_interface
    bs = rec.block_size
    groups = [
        iface.KVCacheGroupSpec([f"layer.{i}"], spec)
        for i, spec in enumerate(case.vllm_specs(vllm, bs))
    ]
    config = iface.KVCacheConfig(
        num_blocks=rec.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    hash_fn = vllm.hashing.get_hash_fn_by_name(hash_name)
    vllm.kv_cache_utils.init_none_hash(hash_fn)
    hasher = vllm.kv_cache_utils.get_request_block_hasher(bs, hash_fn)
    manager = vllm.kv_cache_manager.KVCacheManager(
        config, MAX_MODEL_LEN, hash_block_size=bs, enable_caching=case.enable_caching
    )
    params = vllm.SamplingParams(max_tokens=1 << 20)
    Request = vllm.request.Request
    get_computed_blocks = manager.get_computed_blocks
    allocate_slots = manager.allocate_slots
    free = manager.free
    enc = case.num_encoder_tokens
    prompts = rec.prompts
    timed_from = rec.timed_from
    clock = time.perf_counter
    requests: dict[int, Any] = {}
    hits: dict[int, Any] = {}
    out: list[Any] = []
    record = out.append
    spent = [0.0] * 6
    spans = [0] * 6

    def ids(blocks: Any) -> list[list[int]]:
        return [[b.block_id for b in group] for group in blocks.blocks]

    for position, op in enumerate(rec.ops):
        if position == timed_from:
            spent = [0.0] * 6
            spans = [0] * 6
            freeze_heap()
        kind = op[0]
        if kind == DECODE:
            request = requests[op[1]]
            start = clock()
            request.append_output_token_ids(op[2])
            blocks = allocate_slots(request, 1)
            spent[DECODE] += clock() - start
            if blocks is None:
                request._output_token_ids.pop()
                request._all_token_ids.pop()
                record(None)
            else:
                request.num_computed_tokens += 1
                record(repr(ids(blocks)))
        elif kind == NEW:
            prompt = list(prompts[op[1]])
            start = clock()
            requests[op[1]] = Request(str(op[1]), prompt, params, None, None, block_hasher=hasher)
            spent[NEW] += clock() - start
        elif kind == LOOKUP:
            request = requests[op[1]]
            start = clock()
            hit = get_computed_blocks(request)
            spent[LOOKUP] += clock() - start
            hits[op[1]] = hit
            record(repr((hit[1], ids(hit[0]))))
        elif kind == ADMIT:
            request = requests[op[1]]
            hit_blocks, num_hit = hits.pop(op[1])
            start = clock()
            blocks = allocate_slots(request, op[2], num_hit, hit_blocks, num_encoder_tokens=enc)
            spent[ADMIT] += clock() - start
            if blocks is None:
                record(None)
            else:
                request.num_computed_tokens = request.num_tokens
                record(repr(ids(blocks)))
        else:
            request = requests[op[1]]
            start = clock()
            free(request)
            spent[kind] += clock() - start
            if kind == PREEMPT:
                request.num_computed_tokens = 0
        spans[kind] += 1
    if timed_from >= len(rec.ops):
        freeze_heap()
    replay = Replay(out, *_by_category(spent, spans))
    if after is not None:

        def make_request(request_id: str, token_ids: list[int]) -> Any:
            return Request(request_id, token_ids, params, None, None, block_hasher=hasher)

        replay.after = after(manager, make_request)
    gc.unfreeze()
    return replay
