"""A continuous-batching engine loop that drives a manager and the executor together.

Each step, like a serving engine's scheduler:

1. Requests whose arrival step has come join the waiting queue. At a step
   listed in :attr:`EngineConfig.reset_prefix_cache_at`, every running
   request is preempted and the prefix cache is reset (what an engine does
   for a weight update).
2. **Running requests**, in order, get their next tokens within the step's
   token budget: a prefill chunk, or one decode token, plus draft tokens
   and lookahead slots with speculative decoding. If ``allocate_slots``
   says no, the last running request is preempted (freed, its computed
   tokens dropped, first in the waiting queue) and the allocation retried.
3. **Waiting requests**, first come first served, unless something was
   preempted this step: ``get_computed_blocks``, then ``allocate_slots``
   with the hit. The manager caches a block when the step that fills it is
   scheduled, but its contents are only written while that step runs.
   Attention reads them in time (every request's keys and values are
   written before any is read, layer by layer), a recurrent layer does not:
   it reads its initial state when the step starts. With
   :attr:`EngineConfig.defer_same_step_hits` the engine announces every
   step (:meth:`~kvcore.KVCacheManager.new_step_starts`), and the manager
   keeps a request whose hit ends on a state cached in this step waiting
   until the next one.
4. **The step runs** on the executor; then computed tokens advance, the
   next token is appended when a request reaches its end (with speculative
   decoding: the accepted draft tokens and a bonus token), and requests
   with all their output tokens are freed.

Output tokens are a pure function of the seed, the request and the
position, so the run is reproducible and independent of scheduling.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import attrs

from kvcore._events import BlockRemoved
from kvcore._exec.executor import Executor, Scheduled
from kvcore._kv_cache_manager import KVCacheManager
from kvcore._request import Request
from kvcore.errors import InvalidConfigError, InvalidRequestError

__all__ = ["EngineConfig", "EngineRequest", "EngineStats", "ReferenceEngine", "synthetic_requests"]


def _token_tuple(tokens: Iterable[int]) -> tuple[int, ...]:
    return tuple(tokens)


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 1:
        msg = f"{attribute.name} must be a positive integer, got {value!r}"
        raise InvalidConfigError(msg)


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 0:
        msg = f"{attribute.name} must be an integer >= 0, got {value!r}"
        raise InvalidConfigError(msg)


def _probability(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
        msg = f"{attribute.name} must be a probability between 0 and 1, got {value!r}"
        raise InvalidConfigError(msg)


@attrs.frozen(kw_only=True)
class EngineRequest:
    """A request to serve.

    Attributes:
        request_id: Unique id.
        prompt_token_ids: The prompt.
        max_output_tokens: Output tokens to produce (>= 1).
        arrival_step: The step at which it joins the waiting queue.
        num_encoder_tokens: Encoder tokens (encoder-decoder models), else 0.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...] = attrs.field(converter=_token_tuple)
    max_output_tokens: int = attrs.field(validator=_positive)
    arrival_step: int = attrs.field(default=0, validator=_non_negative)
    num_encoder_tokens: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen(kw_only=True)
class EngineConfig:
    """Scheduler limits and the features to exercise.

    Attributes:
        max_num_batched_tokens: Token budget of one step (prefill chunks,
            decode and draft tokens).
        max_num_seqs: Most requests running at once.
        num_speculative_tokens: Draft tokens proposed per decode step (0:
            no speculative decoding). Each is verified in the next step and
            as many lookahead slots are allocated; build the manager with
            ``use_eagle=True``.
        draft_acceptance: Chance that a draft token is the right one.
        reset_prefix_cache_at: Steps at which every running request is
            preempted and the prefix cache reset.
        defer_same_step_hits: Announce every step to the manager, which
            then keeps a request waiting while its hit ends on a recurrent
            state cached in the current step (see the module documentation).
            Without it the manager behaves as vLLM 0.14's, and such a hit
            reads the state before it is written.
        seed: Seed of the output tokens and of the draft outcomes.
        vocab_size: Output token ids are drawn below this.
    """

    max_num_batched_tokens: int = attrs.field(default=32, validator=_positive)
    max_num_seqs: int = attrs.field(default=8, validator=_positive)
    num_speculative_tokens: int = attrs.field(default=0, validator=_non_negative)
    draft_acceptance: float = attrs.field(default=0.6, validator=_probability)
    reset_prefix_cache_at: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    defer_same_step_hits: bool = True
    seed: int = 0
    vocab_size: int = attrs.field(default=256, validator=_positive)


@attrs.define
class EngineStats:
    """What a run did, to show which paths it exercised."""

    steps: int = 0
    admissions: int = 0
    hit_admissions: int = 0
    hit_tokens: int = 0
    prefill_chunks: int = 0
    decode_steps: int = 0
    preemptions: int = 0
    resumed_with_hit: int = 0
    evicted_blocks: int = 0
    resets: int = 0
    deferred_admissions: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    finished: int = 0


class _Plan:
    """What one step has scheduled so far."""

    __slots__ = ("budget", "preempted", "scheduled", "written")

    def __init__(self, budget: int) -> None:
        self.budget = budget  # tokens still schedulable
        self.scheduled: list[tuple[_Live, int, tuple[int, ...]]] = []
        self.written: set[int] = set()  # blocks the step writes, so far
        self.preempted = False

    def schedule(self, live: _Live, num_new: int, drafts: tuple[int, ...]) -> None:
        self.scheduled.append((live, num_new, drafts))
        self.budget -= num_new


class _Live:
    __slots__ = ("num_output", "request", "spec")

    def __init__(self, spec: EngineRequest, request: Request) -> None:
        self.spec = spec
        self.request = request
        self.num_output = 0


class ReferenceEngine:
    """Serves requests through a manager and an executor, step by step.

    Args:
        executor: The executor; its manager is the one driven (build it with
            ``enable_kv_cache_events=True`` to count evictions).
        requests: The requests, each with a prompt plus output that fits the
            manager's ``max_model_len``.
        config: Limits and features.
        on_step: Called after every step with the engine (e.g. to check the
            manager's invariants).

    Raises:
        InvalidRequestError: a request does not fit ``max_model_len``, or two
            share an id.
    """

    def __init__(
        self,
        executor: Executor,
        requests: Sequence[EngineRequest],
        config: EngineConfig | None = None,
        *,
        on_step: Callable[[ReferenceEngine], None] | None = None,
    ) -> None:
        self.executor = executor
        self.manager: KVCacheManager = executor.manager
        self.config = config or EngineConfig()
        self.on_step = on_step
        limit = self.manager.max_model_len
        seen: set[str] = set()
        for spec in requests:
            if spec.request_id in seen:
                msg = f"two requests share the id {spec.request_id!r}"
                raise InvalidRequestError(msg)
            seen.add(spec.request_id)
            if len(spec.prompt_token_ids) + spec.max_output_tokens > limit:
                msg = (
                    f"request {spec.request_id!r}: {len(spec.prompt_token_ids)} prompt + "
                    f"{spec.max_output_tokens} output tokens exceed max_model_len={limit}"
                )
                raise InvalidRequestError(msg)
        self._pending = deque(sorted(requests, key=lambda r: r.arrival_step))
        self._waiting: deque[_Live] = deque()
        self._running: list[_Live] = []
        self._rng = random.Random(self.config.seed)
        self.stats = EngineStats()
        self.finished: list[Request] = []

    @property
    def done(self) -> bool:
        """Whether every request has finished."""
        return not (self._pending or self._waiting or self._running)

    def token(self, request_id: str, position: int) -> int:
        """The model's output token at ``position`` of a request (a pure function)."""
        key = f"{self.config.seed}:{request_id}:{position}".encode()
        digest = hashlib.blake2b(key, digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.config.vocab_size

    # -- one step ---------------------------------------------------------------------

    def _preempt(self, live: _Live) -> None:
        self.manager.free(live.request)
        live.request.num_computed_tokens = 0
        live.request.num_preemptions += 1
        self._waiting.appendleft(live)
        self.stats.preemptions += 1

    def _reset(self) -> None:
        for live in reversed(self._running):
            self._preempt(live)
        self._running.clear()
        if not self.manager.reset_prefix_cache():
            msg = "reset_prefix_cache refused although no request holds blocks"
            raise AssertionError(msg)
        self.stats.resets += 1

    def _drafts(self, live: _Live) -> tuple[int, ...]:
        """Draft tokens for the positions after the request's last token."""
        request = live.request
        room = min(
            self.manager.max_model_len - request.num_tokens,
            live.spec.max_output_tokens - live.num_output - 1,
        )
        count = max(0, min(self.config.num_speculative_tokens, room))
        drafts = []
        for offset in range(count):
            truth = self.token(request.request_id, request.num_tokens + offset)
            right = self._rng.random() < self.config.draft_acceptance
            drafts.append(truth if right else (truth + 1) % self.config.vocab_size)
        return tuple(drafts)

    def _blocks_written(self, request: Request, num_new: int) -> set[int]:
        """Blocks holding the positions a step computes for ``request``, in every group."""
        start = request.num_computed_tokens
        groups = self.manager.kv_cache_config.kv_cache_groups
        tables = self.manager.get_block_ids(request.request_id)
        written = set()
        for group, table in zip(groups, tables, strict=True):
            size = group.kv_cache_spec.block_size
            written.update(table[start // size : (start + num_new - 1) // size + 1])
        written.discard(0)
        return written

    def step(self) -> None:
        """Schedule, execute and advance one step."""
        config, stats = self.config, self.stats
        while self._pending and self._pending[0].arrival_step <= stats.steps:
            spec = self._pending.popleft()
            request = Request(spec.request_id, spec.prompt_token_ids)
            self._waiting.append(_Live(spec, request))
        if stats.steps in config.reset_prefix_cache_at:
            self._reset()
        if config.defer_same_step_hits:
            self.manager.new_step_starts()
        step = _Plan(config.max_num_batched_tokens)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        if not step.scheduled:
            if self._waiting and not self._running and not step.preempted:
                head = self._waiting[0].request
                msg = (
                    f"request {head.request_id!r} cannot be admitted even with every block "
                    "free; give the pool more blocks"
                )
                raise InvalidConfigError(msg)
            stats.steps += 1
            return
        self._execute(step.scheduled)
        stats.steps += 1
        if self.on_step is not None:
            self.on_step(self)

    def _schedule_running(self, step: _Plan) -> None:
        """Give every running request its next tokens (and drafts), preempting when full."""
        index = 0
        while index < len(self._running) and step.budget > 0:
            live = self._running[index]
            request = live.request
            num_new = request.num_tokens - request.num_computed_tokens
            drafts: tuple[int, ...] = ()
            if num_new == 1 and live.num_output:
                drafts = self._drafts(live)[: step.budget - 1]
            num_new = min(num_new + len(drafts), step.budget)
            while True:
                blocks = self.manager.allocate_slots(
                    request, num_new, num_lookahead_tokens=len(drafts)
                )
                if blocks is not None:
                    break
                victim = self._running.pop()
                self._preempt(victim)
                step.preempted = True
                if victim is live:
                    break
            if blocks is None:
                return
            step.written.update(self._blocks_written(request, num_new))
            step.schedule(live, num_new, drafts)
            index += 1

    def _schedule_waiting(self, step: _Plan) -> None:
        """Admit waiting requests, head first, while they fit the budget and the pool."""
        manager, stats = self.manager, self.stats
        while self._waiting and step.budget > 0 and len(self._running) < self.config.max_num_seqs:
            live = self._waiting[0]
            request = live.request
            hits, num_hit = manager.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit, step.budget)
            blocks = manager.allocate_slots(
                request, num_new, num_hit, hits, num_encoder_tokens=live.spec.num_encoder_tokens
            )
            if blocks is None:
                if any(b in step.written for group in hits.blocks for b in group):
                    stats.deferred_admissions += 1  # (the pool may be full as well)
                return
            request.num_computed_tokens = num_hit
            step.written.update(self._blocks_written(request, num_new))
            self._waiting.popleft()
            self._running.append(live)
            stats.admissions += 1
            if num_hit:
                stats.hit_admissions += 1
                stats.hit_tokens += num_hit
                if request.num_preemptions:
                    stats.resumed_with_hit += 1
            step.schedule(live, num_new, ())

    def _execute(self, scheduled: list[tuple[_Live, int, tuple[int, ...]]]) -> None:
        """Run the scheduled requests through the executor and advance them."""
        self.executor.step(
            [
                Scheduled(
                    request=live.request,
                    num_tokens=num_new,
                    token_ids=None
                    if not drafts
                    else (*live.request.all_token_ids[live.request.num_computed_tokens :], *drafts),
                    num_encoder_tokens=live.spec.num_encoder_tokens,
                )
                for live, num_new, drafts in scheduled
            ]
        )
        self._advance(scheduled)
        self.stats.evicted_blocks += sum(
            len(event.block_hashes)
            for event in self.manager.take_events()
            if isinstance(event, BlockRemoved)
        )

    def _advance(self, scheduled: list[tuple[_Live, int, tuple[int, ...]]]) -> None:
        stats = self.stats
        finished = False
        for live, num_new, drafts in scheduled:
            request = live.request
            request_id = request.request_id
            if drafts:
                stats.draft_tokens += len(drafts)
                accepted = 0
                for offset, draft in enumerate(drafts):
                    if draft != self.token(request_id, request.num_tokens + offset):
                        break
                    accepted += 1
                stats.accepted_draft_tokens += accepted
                new_tokens = [
                    self.token(request_id, request.num_tokens + offset)
                    for offset in range(accepted + 1)
                ]
                request.num_computed_tokens += 1 + accepted
                request.append_output_token_ids(new_tokens)
                live.num_output += len(new_tokens)
                stats.decode_steps += 1
            else:
                request.num_computed_tokens += num_new
                if request.num_computed_tokens < request.num_tokens:
                    stats.prefill_chunks += 1
                    continue
                if live.num_output:
                    stats.decode_steps += 1
                request.append_output_token_ids(self.token(request_id, request.num_tokens))
                live.num_output += 1
            if live.num_output >= live.spec.max_output_tokens:
                self.manager.free(request)
                self.finished.append(request)
                stats.finished += 1
                live.num_output = -1
                finished = True
        if finished:
            self._running = [live for live in self._running if live.num_output >= 0]

    def run(self, max_steps: int = 100_000) -> EngineStats:
        """Step until every request has finished.

        Raises:
            InvalidConfigError: a request can never be admitted.
            RuntimeError: ``max_steps`` passed first.
        """
        while not self.done:
            if self.stats.steps >= max_steps:
                msg = f"the engine did not finish within {max_steps} steps"
                raise RuntimeError(msg)
            self.step()
        return self.stats


def synthetic_requests(
    num_requests: int,
    *,
    max_model_len: int,
    seed: int = 0,
    prompt_lengths: tuple[int, int] = (8, 60),
    max_output: int = 12,
    num_prefixes: int = 3,
    arrival_gap: int = 2,
    num_encoder_tokens: int = 0,
    vocab_size: int = 256,
) -> list[EngineRequest]:
    """Requests with shared prefixes, arriving a few steps apart: hits, evictions, preemptions.

    Most prompts start with one of ``num_prefixes`` shared prefixes (a
    system prompt); some repeat an earlier prompt exactly (a retried or
    multi-turn request), the rest add their own tokens.
    """
    rng = random.Random(seed)
    low, high = prompt_lengths
    high = min(high, max_model_len - 2)
    prefixes = [
        [rng.randrange(vocab_size) for _ in range(rng.randint(low, high))]
        for _ in range(num_prefixes)
    ]
    requests: list[EngineRequest] = []
    step = 0
    for index in range(num_requests):
        roll = rng.random()
        if requests and roll < 0.2:
            prompt = list(rng.choice(requests).prompt_token_ids)
        else:
            length = rng.randint(low, high)
            prompt = list(rng.choice(prefixes))[:length] if roll < 0.85 else []
            prompt += [rng.randrange(vocab_size) for _ in range(length - len(prompt))]
        room = max_model_len - len(prompt)
        requests.append(
            EngineRequest(
                request_id=f"r{index}",
                prompt_token_ids=prompt,
                max_output_tokens=rng.randint(1, max(1, min(max_output, room))),
                arrival_step=step,
                num_encoder_tokens=num_encoder_tokens,
            )
        )
        step += rng.randint(0, arrival_gap)
    return requests
