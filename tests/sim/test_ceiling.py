"""The unbounded-cache ceiling, computed without kvcore."""

from __future__ import annotations

from simhelpers import explicit

from kvcore._sim.ceiling import _mooncake_prefix_hits, _token_prefix_hits, prefix_reuse_ceiling
from kvcore._sim.generator import GeneratorConfig, generate_workload
from kvcore._trace import TraceRequest, read_trace


def mooncake(request_id, hash_ids, input_length):
    return TraceRequest(
        request_id=request_id,
        arrival_ms=0.0,
        input_length=input_length,
        output_length=1,
        hash_ids=tuple(hash_ids),
    )


def test_hand_made_mooncake_trace():
    """Block size 256 (two blocks per 512-token hash id).

    * a = [1, 2], 1000 tokens: nothing seen before → 0.
    * b = [1, 3], 700 tokens: id 1 (512 tokens) shared with a; id 3 is new → 512.
    * c = [1, 2], 900 tokens: id 1 shared (512); id 2 was seen by a with 488
      tokens, c has 388 of it → 388 more, 900 in all; capped at 899 (the last
      token is recomputed) and rounded down to 256 → 768.
    * d = [4], 300 tokens: new → 0.
    * e = [4], 200 tokens: d had 300 tokens of id 4, e has 200 → 200, capped
      at 199 → 0 whole blocks.
    * f = [2, 1], 600 tokens: id 2 first, a different chain than [1, 2] → 0.

    Reusable: 512 + 768 = 1280 of 1000 + 700 + 900 + 300 + 200 + 600 = 3700.
    """
    requests = [
        mooncake("a", [1, 2], 1000),
        mooncake("b", [1, 3], 700),
        mooncake("c", [1, 2], 900),
        mooncake("d", [4], 300),
        mooncake("e", [4], 200),
        mooncake("f", [2, 1], 600),
    ]
    ceiling = prefix_reuse_ceiling(requests, 256)
    assert (ceiling.reusable_tokens, ceiling.prompt_tokens) == (1280, 3700)
    assert _mooncake_prefix_hits(requests, 256) == [0, 512, 768, 0, 0, 0]
    token_level = [r.prompt_token_ids for r in requests]
    assert _token_prefix_hits(token_level, 256) == [0, 512, 768, 0, 0, 0]


def test_hand_made_explicit_trace():
    """Block size 4.

    * [0..9]: new → 0.
    * [0..7, 50, 51]: blocks [0..3], [4..7] seen → 8, capped at 9 → 8.
    * [0..3, 9, 9, 9, 9]: block [0..3] seen, [9, 9, 9, 9] not → 4.
    * [0..3]: 4 tokens seen, capped at 3 → 0.

    Reusable 12 of 10 + 10 + 8 + 4 = 32.
    """
    requests = [
        explicit("1", range(10), 1),
        explicit("2", [*range(8), 50, 51], 1),
        explicit("3", [*range(4), 9, 9, 9, 9], 1),
        explicit("4", range(4), 1),
    ]
    ceiling = prefix_reuse_ceiling(requests, 4)
    assert (ceiling.reusable_tokens, ceiling.prompt_tokens) == (12, 32)
    assert ceiling.rate == 12 / 32


def test_both_methods_agree_on_a_generated_workload():
    requests = generate_workload(GeneratorConfig(num_requests=300, seed=5))
    for block_size in (16, 64, 528):
        by_ids = _mooncake_prefix_hits(requests, block_size)
        by_tokens = _token_prefix_hits([r.prompt_token_ids for r in requests], block_size)
        assert by_ids == by_tokens
        assert sum(by_ids) > 0


def test_conversation_trace_matches_the_published_reuse(conversation_trace):
    # data/README.md: 37.4 % of prompt tokens reusable at 512-token granularity.
    # Its figure counts a shared partial last chunk whole; counted exactly: 37.34 %.
    ceiling = prefix_reuse_ceiling(read_trace(conversation_trace).requests, 512)
    assert ceiling.prompt_tokens == 144_793_823
    assert 0.373 < ceiling.rate < 0.375
