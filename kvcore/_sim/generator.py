"""kvcore's seeded workload generator: multi-turn conversations over shared system prompts.

The generated requests are in the Mooncake format (arrival time, prompt and
output lengths, one hash id per 512 prompt tokens), so they are written and
read like a real trace and replay through the same code.

The model of traffic:

* **System prompts**: a handful of shared prompts (log-normal lengths, median
  ~1.5 k tokens), chosen with Zipf-like popularity: every conversation
  starts with one of them.
* **Conversations** arrive as a Poisson process. Each has a geometric number
  of turns (mean ~3.5, capped). Turn *k*'s prompt is the system prompt, all
  earlier user messages and answers, and the new user message; so a turn's
  prompt extends the previous turn's prompt plus its answer.
* **User messages** are log-normal (median ~300 tokens); some carry a
  document (median ~6 k tokens), which makes long contexts.
* **Answers** are log-normal (median ~250 tokens, capped at 2 k).
* The next turn arrives after the answer plus a think time (exponential,
  mean 30 s); the answer's duration is estimated at 25 ms per token.
* A conversation ends when its next prompt plus answer would exceed
  ``max_context`` tokens.

Prompt content and hash ids: a context is a list of 512-token chunks, each
with an id. Appending text fills the last chunk first. A chunk this
conversation created keeps its id when it grows (its first tokens are
unchanged, so a cache can still reuse them); a chunk shared with others (the
tail of a system prompt) is copied under a new id before it grows, since
different conversations continue it differently. Equal ids therefore mean
equal content, as the format requires.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Any

import attrs

from kvcore._trace import MOONCAKE_BLOCK_TOKENS, TraceRequest
from kvcore.errors import InvalidConfigError

__all__ = ["GeneratorConfig", "generate_workload"]


def _positive(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        msg = f"GeneratorConfig.{attribute.name} must be > 0, got {value!r}"
        raise InvalidConfigError(msg)


def _positive_finite(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    _positive(instance, attribute, value)
    if not math.isfinite(value):
        msg = f"GeneratorConfig.{attribute.name} must be a finite number > 0, got {value!r}"
        raise InvalidConfigError(msg)


@attrs.frozen(kw_only=True)
class GeneratorConfig:
    """Parameters of the generated workload (defaults: chat traffic with long documents).

    Attributes:
        num_requests: Requests to generate (turns, over all conversations).
        seed: Random seed; the same seed gives the same workload.
        conversations_per_s: Arrival rate of new conversations.
        num_system_prompts: Distinct shared system prompts.
        max_context: Longest prompt plus answer of a turn, in tokens.
    """

    num_requests: int = attrs.field(default=2000, validator=_positive)
    seed: int = 0
    conversations_per_s: float = attrs.field(default=3.0, validator=_positive_finite)
    num_system_prompts: int = attrs.field(default=8, validator=_positive)
    max_context: int = attrs.field(default=32_768, validator=_positive)


class _Context:
    """A prompt under construction: 512-token chunks, the last maybe partial."""

    __slots__ = ("fill", "ids", "owned_tail")

    def __init__(self, ids: list[int], fill: int, owned_tail: bool) -> None:
        self.ids = ids
        self.fill = fill  # tokens in the last chunk (1..512), or 0 when empty
        self.owned_tail = owned_tail

    @property
    def length(self) -> int:
        if not self.ids:
            return 0
        return (len(self.ids) - 1) * MOONCAKE_BLOCK_TOKENS + self.fill


class _Ids:
    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 0

    def new(self) -> int:
        self.next += 1
        return self.next - 1


def _append(context: _Context, num_tokens: int, ids: _Ids) -> None:
    """Append ``num_tokens`` new tokens of content unique to this context."""
    chunk = MOONCAKE_BLOCK_TOKENS
    if num_tokens <= 0:
        return
    if context.ids and context.fill < chunk:
        if not context.owned_tail:
            context.ids[-1] = ids.new()
        take = min(chunk - context.fill, num_tokens)
        context.fill += take
        num_tokens -= take
    while num_tokens > 0:
        context.ids.append(ids.new())
        context.fill = min(chunk, num_tokens)
        num_tokens -= context.fill
    context.owned_tail = True


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def generate_workload(config: GeneratorConfig | None = None) -> list[TraceRequest]:
    """Generate a multi-turn chat workload, sorted by arrival time.

    Args:
        config: Parameters; default :class:`GeneratorConfig()`.

    Returns:
        ``config.num_requests`` requests in the Mooncake format, request ids
        ``c<conversation>t<turn>``, deterministic for a given config.
    """
    config = config or GeneratorConfig()
    rng = random.Random(config.seed)
    ids = _Ids()
    system_prompts = []
    for _ in range(config.num_system_prompts):
        context = _Context([], 0, True)
        _append(context, _lognormal(rng, 1500, 0.6, 64, 8000), ids)
        context.owned_tail = False
        system_prompts.append(context)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(config.num_system_prompts)]

    # Events: (arrival ms, tie-break, conversation, turn, context). A
    # conversation's next turn is pushed when its current one is emitted, so
    # turns interleave across conversations in arrival order.
    events: list[tuple[float, int, int, int, _Context, int]] = []
    serial = 0
    clock_ms = 0.0
    next_conversation = 0
    requests: list[TraceRequest] = []
    mean_gap_ms = 1000.0 / config.conversations_per_s
    while len(requests) < config.num_requests:
        if not events or clock_ms <= events[0][0]:
            # Start a new conversation (its arrival precedes every pending turn).
            system = rng.choices(system_prompts, weights)[0]
            context = _Context(list(system.ids), system.fill, False)
            turns = min(12, 1 + int(rng.expovariate(1 / 2.5)))
            heapq.heappush(events, (clock_ms, serial, next_conversation, 0, context, turns))
            serial += 1
            next_conversation += 1
            clock_ms += rng.expovariate(1.0) * mean_gap_ms
            continue
        arrival_ms, _, conversation, turn, context, turns = heapq.heappop(events)
        message = _lognormal(rng, 300, 1.0, 8, 4000)
        if rng.random() < 0.15:
            message += _lognormal(rng, 6000, 0.7, 500, 24_000)
        answer = _lognormal(rng, 250, 0.8, 1, 2000)
        if context.length + message + answer > config.max_context:
            continue
        _append(context, message, ids)
        requests.append(
            TraceRequest(
                request_id=f"c{conversation}t{turn}",
                arrival_ms=float(round(arrival_ms)),
                input_length=context.length,
                output_length=answer,
                hash_ids=tuple(context.ids),
            )
        )
        if turn + 1 < turns:
            _append(context, answer, ids)
            think_ms = 25.0 * answer + rng.expovariate(1 / 30_000)
            heapq.heappush(
                events, (arrival_ms + think_ms, serial, conversation, turn + 1, context, turns)
            )
            serial += 1
    requests.sort(key=lambda r: r.arrival_ms)
    return requests
