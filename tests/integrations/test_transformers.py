"""transformers models on kvcore's cache, against transformers' own generate and cache.

Every model is tiny, built from a config with seeded weights in float64
(nothing is downloaded). The expected outputs are transformers' own:
``model.generate()`` with its default cache, greedy, fed the same prefill
chunks (``prefill_chunk_size``) and, for a prefix hit, the prefix computed
by the same forward (a prompt cache passed to ``generate``, transformers'
way of reusing a prefix). ``generate`` returns float32 logits; kvcore's are
compared with them bit for bit after the same cast.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import DynamicCache, EncoderDecoderCache  # noqa: E402
from transformers.modeling_outputs import BaseModelOutput  # noqa: E402

from kvcore._request import Request  # noqa: E402
from kvcore.errors import InvalidConfigError, InvalidRequestError, PagedAccessError  # noqa: E402
from kvcore.integrations.transformers import (  # noqa: E402
    KVCoreCache,
    KVCoreCrossCache,
    PagedModelCache,
    StepRow,
    generate,
    plan_model,
    tiny_model,
)

BLOCK = 16
NEW = 6
DECODERS = ["llama", "mistral", "gemma3", "gpt-oss", "llama4", "qwen3-next", "deepseek-v3"]
#: The kvcore group types each model is planned into, worked out from its config.
GROUP_TYPES = {
    "llama": ["FullAttentionSpec"],
    "mistral": ["SlidingWindowSpec"],
    "gemma3": ["SlidingWindowSpec", "FullAttentionSpec"],
    "gpt-oss": ["SlidingWindowSpec", "FullAttentionSpec"],
    "llama4": ["ChunkedLocalAttentionSpec", "FullAttentionSpec"],
    "qwen3-next": ["MambaSpec", "FullAttentionSpec"],
    "deepseek-v3": ["MLAAttentionSpec"],
}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_MODELS: dict[str, object] = {}


def model_named(name):
    if name not in _MODELS:
        _MODELS[name] = tiny_model(name)
    return _MODELS[name]


def prompts():
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 128, (32,), generator=g).tolist()
    return prefix, prefix + torch.randint(0, 128, (13,), generator=g).tolist()


def hf_generate(model, ids, chunk, cache=None):
    """transformers' greedy generate with its default cache: tokens and float32 logits."""
    kwargs = {"prefill_chunk_size": chunk} if chunk else {}
    if cache is not None:
        kwargs["cache"] = cache
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences[0, len(ids) :].tolist(), torch.stack(out.logits)[:, 0]


def hf_prompt_cache(model, prefix, chunk):
    """The prefix through transformers' own cache, in the chunks kvcore computed it in."""
    cache = DynamicCache(config=model.config)
    step = chunk or len(prefix)
    with torch.no_grad():
        for start in range(0, len(prefix), step):
            model(
                input_ids=torch.tensor([prefix[start : start + step]]), cache=cache, use_cache=True
            )
    return cache


def chunk_for(name, chunked):
    # A forward of a model with recurrent layers ends at each state block boundary (the
    # model hands over the state after its last position only), so its "unchunked" run
    # is one forward per block.
    if chunked:
        return 8
    return BLOCK if name == "qwen3-next" else None


@pytest.mark.parametrize("chunked", [False, True], ids=["unchunked", "chunked"])
@pytest.mark.parametrize("name", DECODERS)
def test_greedy_tokens_and_logits_are_transformers_own(name, chunked):
    model = model_named(name)
    prefix, longer = prompts()
    chunk = chunk_for(name, chunked)
    budget = chunk or 256
    paged = PagedModelCache.for_model(
        model, memory="4MiB", max_num_batched_tokens=budget, block_size=BLOCK
    )
    groups = paged.plan.kv_cache_config.kv_cache_groups
    assert [type(g.kv_cache_spec).__name__ for g in groups] == GROUP_TYPES[name]
    first = generate(
        model,
        [prefix],
        max_new_tokens=NEW,
        cache=paged,
        output_logits=True,
        max_num_batched_tokens=budget,
    ).generations[0]
    second = generate(
        model,
        [longer],
        max_new_tokens=NEW,
        cache=paged,
        output_logits=True,
        max_num_batched_tokens=budget,
    ).generations[0]
    # The 32-token prefix is two whole blocks, cached by the first request: the second
    # finds all of it (a hit is whole blocks, at most prompt length - 1).
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 32
    want_tokens, want_logits = hf_generate(model, prefix, chunk)
    assert list(first.token_ids) == want_tokens
    assert torch.equal(first.logits.float(), want_logits)
    cached = hf_prompt_cache(model, prefix, chunk)
    want_tokens, want_logits = hf_generate(model, longer, chunk, cache=copy.deepcopy(cached))
    assert list(second.token_ids) == want_tokens
    assert torch.equal(second.logits.float(), want_logits)


@pytest.mark.parametrize("name", DECODERS)
def test_corrupting_one_cached_block_changes_the_output(name):
    # Negative control: the hit really reads the cached blocks. The last block of the
    # hit is what every type reads (a window's last positions, a chunk, the state).
    model = model_named(name)
    prefix, longer = prompts()
    chunk = chunk_for(name, chunked=True)
    paged = PagedModelCache.for_model(model, memory="4MiB", max_num_batched_tokens=chunk)
    generate(model, [prefix], max_new_tokens=NEW, cache=paged, max_num_batched_tokens=chunk)
    hit, count = paged.manager.get_computed_blocks(Request("probe", longer))
    assert count == 32
    corrupted = 0
    for slot in paged.self_layers.values():
        block = hit.blocks[slot.group_id][-1]
        if block == 0:
            # Llama 4's chunks are 16 tokens: position 32 starts a chunk, which reads
            # nothing before it, so the chunked group hands over null blocks only.
            assert name == "llama4"
            assert set(hit.blocks[slot.group_id]) == {0}
            continue
        corrupted += 1
        for view in slot.views:
            view[block] += 1.0
    assert corrupted
    clean = generate(
        model,
        [longer],
        max_new_tokens=NEW,
        memory="4MiB",
        output_logits=True,
        max_num_batched_tokens=chunk,
    ).generations[0]
    corrupt = generate(
        model,
        [longer],
        max_new_tokens=NEW,
        cache=paged,
        output_logits=True,
        max_num_batched_tokens=chunk,
    ).generations[0]
    assert corrupt.num_cached_tokens == 32
    assert clean.num_cached_tokens == 0
    assert not torch.equal(clean.logits, corrupt.logits)


@pytest.mark.parametrize("name", ["gemma3", "qwen3-next"])
def test_preemption_and_batched_decode_give_the_same_tokens(name):
    # 8 prompts sharing a prefix in a pool too small for all of them at once: requests
    # are preempted and recomputed (from their own cached blocks), and decode steps run
    # several requests in one forward. Tokens equal transformers' per prompt; logits
    # agree to rounding (a resumed or batched forward sums in another order).
    model = model_named(name)
    prefix, _ = prompts()
    g = torch.Generator().manual_seed(2)
    batch = [
        prefix[: 16 + 3 * i] + torch.randint(0, 128, (5,), generator=g).tolist() for i in range(6)
    ]
    small = PagedModelCache.for_model(
        model, memory="4MiB", num_blocks=13, max_num_batched_tokens=16, max_model_len=64
    )
    result = generate(
        model, batch, max_new_tokens=NEW, cache=small, output_logits=True, max_num_batched_tokens=16
    )
    assert result.stats.preemptions > 0
    assert result.stats.batched_forwards > 0
    for prompt, gen in zip(batch, result.generations, strict=True):
        tokens, logits = hf_generate(model, prompt, 16 if name == "qwen3-next" else None)
        assert list(gen.token_ids) == tokens
        torch.testing.assert_close(gen.logits.float(), logits, rtol=0, atol=1e-5)


def test_batched_decode_matches_one_request_per_forward():
    model = model_named("gpt-oss")
    prefix, longer = prompts()
    batch = [prefix[:20], longer, prefix[:9]]
    one = generate(
        model, batch, max_new_tokens=NEW, memory="4MiB", batch_decode=False, output_logits=True
    )
    many = generate(model, batch, max_new_tokens=NEW, memory="4MiB", output_logits=True)
    assert one.stats.batched_forwards == 0
    assert many.stats.batched_forwards >= NEW - 1
    assert many.stats.forwards < one.stats.forwards
    for a, b in zip(one.generations, many.generations, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-12)


def test_whisper_cross_attention_in_kvcore_blocks():
    # Encoder keys and values in the cross-attention group's blocks, decoder keys and
    # values in the full-attention group's; transformers reuses the encoder's after the
    # first step (reading them back from the blocks). Against its own default cache.
    model = model_named("whisper")
    features = torch.randn(
        1, 8, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    prompt = [1, 5, 9, 17]
    with torch.no_grad():
        encoded = BaseModelOutput(last_hidden_state=model.model.encoder(features).last_hidden_state)
        want = _greedy_whisper(model, encoded, prompt, None)
        paged = PagedModelCache.for_model(model, memory="2MiB", enable_caching=False)
        got = _greedy_whisper(model, encoded, prompt, paged)
    groups = paged.plan.kv_cache_config.kv_cache_groups
    assert [type(g.kv_cache_spec).__name__ for g in groups] == [
        "FullAttentionSpec",
        "CrossAttentionSpec",
    ]
    assert got[0] == want[0]
    assert torch.equal(got[1], want[1])


def _greedy_whisper(model, encoded, prompt, paged):
    request = Request("w", prompt)
    encoder_tokens = encoded.last_hidden_state.shape[1]
    default = EncoderDecoderCache(
        DynamicCache(config=model.config), DynamicCache(config=model.config)
    )
    tokens, logits = [], []
    while len(tokens) < NEW:
        start = request.num_computed_tokens
        count = request.num_tokens - start
        if paged is None:
            cache = default
        else:
            assert paged.manager.allocate_slots(request, count, num_encoder_tokens=encoder_tokens)
            rows = [
                StepRow(
                    request_id="w", start=start, num_tokens=count, num_encoder_tokens=encoder_tokens
                )
            ]
            cache = EncoderDecoderCache(
                KVCoreCache(paged, rows), KVCoreCrossCache(paged, rows, written=start > 0)
            )
        out = model(
            encoder_outputs=encoded,
            decoder_input_ids=torch.tensor([request.all_token_ids[start:]]),
            cache=cache,
            use_cache=True,
        )
        request.num_computed_tokens += count
        logits.append(out.logits[0, -1])
        tokens.append(int(out.logits[0, -1].argmax()))
        request.append_output_token_ids(tokens[-1])
    return tokens, torch.stack(logits)


def test_the_plan_comes_from_the_model_dtype_not_its_config():
    model = tiny_model("llama", dtype=torch.float32)
    model.config.dtype = "bfloat16"  # stale: what the config says is not what the model is
    plan = plan_model(model, memory="1MiB")
    assert plan.kv_cache_config.kv_cache_groups[0].kv_cache_spec.dtype == "float32"


def test_reading_a_position_without_a_block_is_refused():
    model = model_named("llama")
    paged = PagedModelCache.for_model(model, memory="1MiB")
    request = Request("r", list(range(20)))
    assert paged.manager.allocate_slots(request, 16) is not None
    with pytest.raises(PagedAccessError, match="position 16 is in block 1 of its block table"):
        KVCoreCache(paged, [StepRow(request_id="r", start=0, num_tokens=20)]).layers[0].update(
            torch.zeros(1, 2, 20, 8, dtype=torch.float64),
            torch.zeros(1, 2, 20, 8, dtype=torch.float64),
        )


def test_a_hybrid_forward_mixing_fresh_and_continuing_rows_is_refused():
    model = model_named("qwen3-next")
    paged = PagedModelCache.for_model(model, memory="4MiB")
    rows = [
        StepRow(request_id="a", start=0, num_tokens=1),
        StepRow(request_id="b", start=5, num_tokens=1),
    ]
    with pytest.raises(InvalidRequestError, match="one previous-state flag for all rows"):
        KVCoreCache(paged, rows)


def test_generate_checks_its_arguments():
    model = model_named("llama")
    with pytest.raises(InvalidConfigError, match=r"exactly one of memory= .* or cache="):
        generate(model, [[1, 2]], max_new_tokens=2)
    with pytest.raises(InvalidRequestError, match="prompt 1 is empty"):
        generate(model, [[1], []], max_new_tokens=2, memory="1MiB")
    with pytest.raises(InvalidRequestError, match="exceed the cache's max_model_len=1024"):
        generate(model, [[1] * 1020], max_new_tokens=10, memory="1MiB")
    with pytest.raises(InvalidConfigError, match="serves decoder-only models"):
        generate(model_named("whisper"), [[1]], max_new_tokens=2, memory="1MiB")
