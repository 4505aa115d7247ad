"""Continuous-batching greedy generation with a transformers model on kvcore's cache."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from kvcore._request import Request
from kvcore.errors import InvalidConfigError, InvalidRequestError
from kvcore.integrations.transformers._cache import KVCoreCache, StepRow
from kvcore.integrations.transformers._paged import PagedModelCache

__all__ = ["GenerateResult", "GenerateStats", "Generation", "generate"]


@attrs.frozen(kw_only=True)
class Generation:
    """What one prompt produced.

    Attributes:
        token_ids: The generated tokens, in order.
        logits: With ``output_logits=True``, the logits each token was picked
            from, ``(len(token_ids), vocab)``; else ``None``.
        num_cached_tokens: Prompt tokens found in the prefix cache when the
            request was first admitted.
        num_preemptions: Times it was preempted (and recomputed).
    """

    token_ids: tuple[int, ...]
    logits: torch.Tensor | None = attrs.field(eq=False, repr=False)
    num_cached_tokens: int
    num_preemptions: int


@attrs.define
class GenerateStats:
    """What a :func:`generate` run did.

    Attributes:
        steps: Scheduling steps.
        forwards: Model forward passes.
        batched_forwards: Forwards of more than one request (decode steps).
        prompt_tokens: Prompt tokens of all requests.
        hit_tokens: Tokens admissions found cached (resumed requests' included).
        computed_tokens: Positions the model computed.
        preemptions: Requests preempted for want of blocks.
    """

    steps: int = 0
    forwards: int = 0
    batched_forwards: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    computed_tokens: int = 0
    preemptions: int = 0


@attrs.frozen(kw_only=True)
class GenerateResult:
    """The generations, in the order of the prompts, and the run's statistics."""

    generations: tuple[Generation, ...]
    stats: GenerateStats


class _Live:
    __slots__ = ("first_hit", "kept", "last_logits", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.last_logits: torch.Tensor | None = None  # of the last forward's last position
        self.kept: list[torch.Tensor] = []  # of each generated token (output_logits)
        self.first_hit: int | None = None


def _check_prompts(prompts: Sequence[Sequence[int]], max_new_tokens: int, limit: int) -> None:
    if type(max_new_tokens) is not int or max_new_tokens < 1:
        msg = f"max_new_tokens must be a positive integer, got {max_new_tokens!r}"
        raise InvalidRequestError(msg)
    for index, prompt in enumerate(prompts):
        if not prompt:
            msg = f"prompt {index} is empty; give at least one token"
            raise InvalidRequestError(msg)
        if len(prompt) + max_new_tokens > limit:
            msg = (
                f"prompt {index}: {len(prompt)} tokens + max_new_tokens={max_new_tokens} "
                f"exceed the cache's max_model_len={limit}; plan a longer max_model_len"
            )
            raise InvalidRequestError(msg)


class _Generator:
    """The scheduler: admits, chunks, preempts; runs prefill rows alone, decode rows together."""

    def __init__(
        self,
        model: torch.nn.Module,
        paged: PagedModelCache,
        *,
        max_new_tokens: int,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        eos_token_id: int | None,
        output_logits: bool,
        batch_decode: bool,
    ) -> None:
        self.model = model
        self.paged = paged
        self.manager = paged.manager
        self.max_new_tokens = max_new_tokens
        self.budget = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.eos_token_id = eos_token_id
        self.output_logits = output_logits
        self.batch_decode = batch_decode
        self.waiting: deque[_Live] = deque()
        self.running: list[_Live] = []
        self.stats = GenerateStats()
        config: Any = getattr(model, "config", None)
        self.layer_types = getattr(config.get_text_config(decoder=True), "layer_types", None)
        self.dtype = next(model.parameters()).dtype

    def _chunk(self, request: Request, budget: int) -> int:
        """Tokens to compute next: within the budget, and crossing no state block boundary.

        transformers hands over a recurrent layer's state after the forward's
        last position only, so a forward may end at most at the next block
        boundary of a state group: every block's state is then written.
        """
        count = min(request.num_tokens - request.num_computed_tokens, budget)
        start = request.num_computed_tokens
        for group_id in self.paged.state_group_ids:
            size = self.paged.block_sizes[group_id]
            count = min(count, size - start % size)
        return count

    def _preempt(self, live: _Live) -> None:
        self.manager.free(live.request)
        live.request.num_computed_tokens = 0
        live.request.num_preemptions += 1
        self.waiting.appendleft(live)
        self.stats.preemptions += 1

    def _schedule_running(self, budget: int) -> tuple[list[tuple[_Live, int]], int, bool]:
        scheduled: list[tuple[_Live, int]] = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            live = self.running[index]
            count = self._chunk(live.request, budget)
            if self.manager.allocate_slots(live.request, count) is None:
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is live:
                    break
                continue
            scheduled.append((live, count))
            budget -= count
            index += 1
        return scheduled, budget, preempted

    def _admit(self, budget: int) -> list[tuple[_Live, int]]:
        scheduled = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            live = self.waiting[0]
            request = live.request
            hit_blocks, num_hit = self.manager.get_computed_blocks(request)
            request.num_computed_tokens = num_hit
            count = self._chunk(request, budget)
            request.num_computed_tokens = 0
            if self.manager.allocate_slots(request, count, num_hit, hit_blocks) is None:
                break
            request.num_computed_tokens = num_hit
            if live.first_hit is None:
                live.first_hit = num_hit
            self.stats.hit_tokens += num_hit
            self.waiting.popleft()
            self.running.append(live)
            scheduled.append((live, count))
            budget -= count
        return scheduled

    def step(self) -> None:
        self.stats.steps += 1
        self.manager.new_step_starts()
        scheduled, budget, preempted = self._schedule_running(self.budget)
        if not preempted:
            scheduled += self._admit(budget)
        if not scheduled:
            msg = (
                "no request could be scheduled: the cache cannot hold the next step of the "
                "first waiting request; give more memory"
            )
            raise InvalidConfigError(msg)
        decode = [(live, n) for live, n in scheduled if n == 1 and live.request.num_computed_tokens]
        singles = [entry for entry in scheduled if entry not in decode]
        if not (self.batch_decode and len(decode) > 1 and self._run_batch(decode)):
            singles += decode
        for live, count in singles:
            self._run([(live, count)], None)
        for live, count in scheduled:
            self._advance(live, count)

    def _rows(self, batch: Sequence[tuple[_Live, int]]) -> list[StepRow]:
        return [
            StepRow(
                request_id=live.request.request_id,
                start=live.request.num_computed_tokens,
                num_tokens=count,
            )
            for live, count in batch
        ]

    def _forward(
        self, batch: Sequence[tuple[_Live, int]], cache: KVCoreCache, mask: Any
    ) -> torch.Tensor:
        rows = cache.rows
        ids = [
            live.request.all_token_ids[row.start : row.start + row.num_tokens]
            for (live, _), row in zip(batch, rows, strict=True)
        ]
        device = self.paged.device
        input_ids = torch.tensor(ids, dtype=torch.int64, device=device)
        positions = torch.stack(
            [torch.arange(r.start, r.start + r.num_tokens, device=device) for r in rows]
        )
        with torch.no_grad():
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=mask,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        self.stats.forwards += 1
        self.stats.computed_tokens += sum(r.num_tokens for r in rows)
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def _run(self, batch: Sequence[tuple[_Live, int]], mask: Any) -> None:
        self._run_with(batch, KVCoreCache(self.paged, self._rows(batch)), mask)

    def _run_batch(self, batch: Sequence[tuple[_Live, int]]) -> bool:
        """Decode rows in one forward, with explicit masks; ``False`` if the model cannot."""
        cache = KVCoreCache(self.paged, self._rows(batch))
        mask = self._batch_masks(cache)
        if mask is None:
            return False
        self.stats.batched_forwards += 1
        self._run_with(batch, cache, mask)
        return True

    def _run_with(self, batch: Sequence[tuple[_Live, int]], cache: KVCoreCache, mask: Any) -> None:
        logits = self._forward(batch, cache, mask)
        for (live, _), row_logits in zip(batch, logits, strict=True):
            live.last_logits = row_logits

    def _batch_masks(self, cache: KVCoreCache) -> Any:
        """One additive mask per transformers layer type (or one for all); ``None``: cannot."""
        by_type: dict[str, tuple[int, ...] | None] = {}
        for index, slot in self.paged.self_layers.items():
            kind = "all" if self.layer_types is None else self.layer_types[index]
            lengths = None if slot.state else cache._rows.attention(slot).lengths
            if by_type.setdefault(kind, lengths) != lengths:
                return None
        masks = {
            kind: None if lengths is None else self._mask(lengths)
            for kind, lengths in by_type.items()
        }
        if self.layer_types is None:
            return masks.get("all")
        return masks

    def _mask(self, lengths: tuple[int, ...]) -> torch.Tensor:
        device = self.paged.device
        columns = torch.arange(max(lengths), device=device)
        visible = columns[None, :] < torch.tensor(lengths, device=device)[:, None]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=device)
        mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        return mask[:, None, None, :]

    def _advance(self, live: _Live, count: int) -> None:
        request = live.request
        request.num_computed_tokens += count
        logits, live.last_logits = live.last_logits, None
        if request.num_computed_tokens < request.num_tokens:
            return
        assert logits is not None
        token = int(torch.argmax(logits))
        if self.output_logits:
            live.kept.append(logits)
        request.append_output_token_ids(token)
        done = len(request.output_token_ids) >= self.max_new_tokens or token == self.eos_token_id
        if done:
            self.running.remove(live)
            self.manager.free(request)


def generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    memory: int | str | None = None,
    cache: PagedModelCache | None = None,
    max_num_batched_tokens: int = 256,
    max_num_seqs: int = 8,
    eos_token_id: int | None = None,
    output_logits: bool = False,
    batch_decode: bool = True,
    enable_caching: bool = True,
) -> GenerateResult:
    """Greedy generation for many prompts at once, on a kvcore paged cache.

    A continuous-batching loop over a :class:`~kvcore.KVCacheManager`: every
    step serves the running requests (the next prefill chunk or one decode
    token), then admits waiting ones with their prefix-cache hits while the
    token budget lasts; when the pool runs dry the newest running request is
    preempted (freed, recomputed later, usually from its own cached blocks).
    Prefill chunks run one request per forward; decode tokens of all
    running requests run in one forward (explicit position ids and one
    attention mask per layer type), unless ``batch_decode=False``.

    Args:
        model: A transformers decoder model (``...ForCausalLM``), in eval mode.
        prompts: Token ids of each prompt.
        max_new_tokens: Tokens to generate per prompt (fewer if
            ``eos_token_id`` comes first).
        memory: Bytes for a new cache (:meth:`PagedModelCache.for_model`);
            give this or ``cache``.
        cache: A cache built for this model, shared across calls (its
            prefix cache carries over).
        max_num_batched_tokens: Token budget of one step (the prefill chunk).
        max_num_seqs: Most requests running at once.
        eos_token_id: Stop a request when it generates this token.
        output_logits: Keep the logits of every generated token.
        batch_decode: Decode the running requests in one forward.
        enable_caching: Prefix caching (for a new cache).

    Returns:
        The generations, in the order of ``prompts``, and the run's statistics.

    Raises:
        InvalidRequestError: an empty prompt, a prompt too long for the
            cache's ``max_model_len``, a bad ``max_new_tokens``.
        InvalidConfigError: neither or both of ``memory`` and ``cache``; an
            encoder-decoder model; a pool too small for one request's step.
    """
    if (memory is None) == (cache is None):
        msg = "give exactly one of memory= (a new cache) or cache= (a PagedModelCache)"
        raise InvalidConfigError(msg)
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        msg = (
            "generate() serves decoder-only models; drive an encoder-decoder model with "
            "KVCoreCache and KVCoreCrossCache in an EncoderDecoderCache"
        )
        raise InvalidConfigError(msg)
    paged = cache or PagedModelCache.for_model(
        model,
        memory=memory,  # type: ignore[arg-type]
        max_num_batched_tokens=max_num_batched_tokens,
        enable_caching=enable_caching,
    )
    _check_prompts(prompts, max_new_tokens, paged.manager.max_model_len)
    generator = _Generator(
        model,
        paged,
        max_new_tokens=max_new_tokens,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        eos_token_id=eos_token_id,
        output_logits=output_logits,
        batch_decode=batch_decode,
    )
    lives = []
    for index, prompt in enumerate(prompts):
        live = _Live(Request(f"generate-{id(generator)}-{index}", list(prompt)))
        lives.append(live)
        generator.waiting.append(live)
        generator.stats.prompt_tokens += len(prompt)
    while generator.waiting or generator.running:
        generator.step()
    generations = tuple(
        Generation(
            token_ids=tuple(live.request.output_token_ids),
            logits=torch.stack(live.kept) if output_logits else None,
            num_cached_tokens=live.first_hit or 0,
            num_preemptions=live.request.num_preemptions,
        )
        for live in lives
    )
    return GenerateResult(generations=generations, stats=generator.stats)
