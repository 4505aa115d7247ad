"""The prefix-reuse ceiling of a workload: what an unbounded cache would hit.

Computed from the workload alone, without kvcore, so that it can judge
kvcore's hit rate: requests are taken in arrival order; each one can reuse
the longest prefix of its prompt that an earlier prompt already contained,
counted in whole blocks of ``block_size`` tokens and at most
``prompt length - 1`` tokens (the last prompt token is always recomputed to
produce the first output token, as in the manager). Only prompts count:
generated tokens are unique to their request, so they never match a later
prompt. A bounded cache can only do worse; the gap is what eviction loses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from kvcore._trace import MOONCAKE_BLOCK_TOKENS, TraceRequest

__all__ = ["Ceiling", "prefix_reuse_ceiling", "prefix_reuse_hits"]


@attrs.frozen
class Ceiling:
    """Prefix reuse of a workload under an unbounded cache.

    Attributes:
        block_size: Granularity in tokens (hits are whole blocks).
        prompt_tokens: Prompt tokens of all requests.
        reusable_tokens: Prompt tokens an unbounded cache would serve.
    """

    block_size: int
    prompt_tokens: int
    reusable_tokens: int

    @property
    def rate(self) -> float:
        """``reusable_tokens / prompt_tokens`` (0.0 for an empty workload)."""
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _cap(matched: int, input_length: int, block_size: int) -> int:
    limit = min(matched, input_length - 1)
    return limit - limit % block_size


def _token_prefix_hits(tokens_per_request: Iterable[Sequence[int]], block_size: int) -> list[int]:
    """Hits by exact block contents: a trie of blocks keyed by (parent node, tokens)."""
    nodes: dict[tuple[int, tuple[int, ...]], int] = {}
    hits = []
    for tokens in tokens_per_request:
        num_full = len(tokens) // block_size
        parent = 0
        matched = 0
        for start in range(0, num_full * block_size, block_size):
            key = (parent, tuple(tokens[start : start + block_size]))
            node = nodes.get(key)
            if node is None:
                node = len(nodes) + 1
                nodes[key] = node
            else:
                if matched == start:
                    matched = start + block_size
            parent = node
        hits.append(_cap(matched, len(tokens), block_size))
    return hits


def _mooncake_prefix_hits(requests: Iterable[TraceRequest], block_size: int) -> list[int]:
    """Hits from hash ids alone: a trie of 512-token chunks with the longest fill seen.

    A chunk's tokens are all ``h``, so two prompts agree on a chunk's
    first ``min(fill_a, fill_b)`` tokens when they share the chunk's id and
    every id before it, and on nothing of it otherwise. This walks ~24 ids
    per request instead of ~750 blocks of tokens.
    """
    chunk = MOONCAKE_BLOCK_TOKENS
    longest: dict[tuple[int, int], list[int]] = {}  # (parent, id) -> [node, longest fill]
    hits = []
    for request in requests:
        input_length = request.input_length
        parent = 0
        matched = 0
        open_prefix = True
        for index, hash_id in enumerate(request.hash_ids or ()):
            fill = min(chunk, input_length - index * chunk)
            if fill <= 0:
                break
            entry = longest.get((parent, hash_id))
            if entry is None:
                entry = [len(longest) + 1, fill]
                longest[parent, hash_id] = entry
                open_prefix = False
            else:
                if open_prefix:
                    shared = min(entry[1], fill)
                    matched += shared
                    open_prefix = shared == chunk
                if fill > entry[1]:
                    entry[1] = fill
            parent = entry[0]
        hits.append(_cap(matched, input_length, block_size))
    return hits


def prefix_reuse_hits(requests: Sequence[TraceRequest], block_size: int) -> list[int]:
    """Per request, the prompt tokens an unbounded prefix cache would serve, in arrival order.

    Each is a multiple of ``block_size`` and at most ``input_length - 1``.
    Uses the hash ids when every request is in the Mooncake format, token ids
    otherwise (both give the same answer).
    """
    if block_size < 1:
        msg = f"block_size must be >= 1, got {block_size}"
        raise ValueError(msg)
    if all(r.hash_ids is not None for r in requests):
        return _mooncake_prefix_hits(requests, block_size)
    return _token_prefix_hits((r.prompt_token_ids for r in requests), block_size)


def prefix_reuse_ceiling(requests: Sequence[TraceRequest], block_size: int) -> Ceiling:
    """The prompt tokens an unbounded prefix cache would serve, in arrival order.

    Args:
        requests: The workload, in the order requests arrive.
        block_size: Hit granularity in tokens (the cache's block size, or the
            least common multiple of its groups' block sizes).

    Returns:
        The ceiling. Uses the hash ids directly when every request is in the
        Mooncake format, token ids otherwise (both give the same answer).
    """
    hits = prefix_reuse_hits(requests, block_size)
    return Ceiling(
        block_size=block_size,
        prompt_tokens=sum(r.input_length for r in requests),
        reusable_tokens=sum(hits),
    )
