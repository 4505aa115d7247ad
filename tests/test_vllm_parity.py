"""Where an engine switching from vLLM 0.14's KV cache manager would trip.

vLLM behaviour checked against its 0.14 sources: ``free`` of a request that
holds nothing does nothing; ``log_stats=False`` leaves ``prefix_cache_stats``
``None``; prompt embeddings enter the block hashes; ``max_model_len=-1``
asks planning for the longest length that fits.
"""

from __future__ import annotations

import pytest

import kvcore
from kvcore import KVCacheConfig, KVCacheManager, Request
from kvcore.specs import TokenLimits
from kvcore.testing import admit
from kvcore_plugins.full_attention import FullAttentionSpec


def full(block_size: int = 4) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype="float32")


def make(registry, **kwargs) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig.from_specs(20, [full()]), 64, registry=registry, **kwargs)


def test_statistics_can_be_switched_off(registry):
    manager = make(registry, log_stats=False)
    assert manager.prefix_cache_stats is None
    admit(manager, Request("a", list(range(12))))
    assert manager.get_computed_blocks(Request("b", list(range(13))))[1] == 12
    assert manager.make_prefix_cache_stats() is None
    assert manager.reset_prefix_cache() is False  # a holds blocks
    on = make(registry)
    admit(on, Request("a", list(range(12))))
    assert on.make_prefix_cache_stats().requests == 1


def test_pending_events_can_be_read_without_taking_them(registry):
    manager = make(registry, enable_kv_cache_events=True)
    admit(manager, Request("a", list(range(8))))
    pending = manager.peek_events()
    assert len(pending) == 1
    assert isinstance(pending[0], kvcore.events.BlockStored)
    assert len(pending[0].block_hashes) == 2
    assert manager.peek_events() == pending
    assert manager.take_events() == list(pending)
    assert manager.peek_events() == ()
    assert make(registry).peek_events() == ()  # events off


def test_prompt_embeddings_enter_the_block_hashes(registry):
    np = pytest.importorskip("numpy")
    manager = make(registry)
    embeds = np.arange(12 * 3, dtype=np.float32).reshape(12, 3)
    placeholder = [0] * 12
    admit(manager, Request("a", placeholder, prompt_embeds=embeds))
    # The same embeddings hit; other embeddings (same token ids) do not.
    same = Request(
        "b", [*placeholder, 1], prompt_embeds=np.vstack([embeds, np.ones((1, 3), np.float32)])
    )
    assert manager.get_computed_blocks(same)[1] == 12
    changed = embeds.copy()
    changed[5, 1] = -1.0
    other = Request(
        "c", [*placeholder, 1], prompt_embeds=np.vstack([changed, np.ones((1, 3), np.float32)])
    )
    # Block 0 (tokens 0-3) is unchanged; block 1 holds token 5.
    assert manager.get_computed_blocks(other)[1] == 4
    plain = Request("d", [*placeholder, 1])
    assert manager.get_computed_blocks(plain)[1] == 0


def test_prompt_embeddings_cover_the_prompt(registry):
    np = pytest.importorskip("numpy")
    with pytest.raises(
        kvcore.errors.InvalidRequestError,
        match=r"request 'a': prompt_embeds has 11 rows for 12 prompt tokens",
    ):
        Request("a", [0] * 12, prompt_embeds=np.zeros((11, 3), dtype=np.float32))


def test_prompt_embedding_digests_are_computed_once_per_block(registry):
    np = pytest.importorskip("numpy")

    class Counting(np.ndarray):
        slices = 0

        def __getitem__(self, index):
            if isinstance(index, slice):
                Counting.slices += 1
            return super().__getitem__(index)

    embeds = np.zeros((12, 2), dtype=np.float16).view(Counting)
    request = Request("a", [0] * 12, prompt_embeds=embeds)
    manager = make(registry)
    manager.get_computed_blocks(request)
    manager.get_computed_blocks(request)
    admit(manager, request)
    assert Counting.slices == 3  # one per full block, whatever the number of calls


def test_max_model_len_minus_one_fits_the_longest_length():
    """Notes §9.7 #101: block 16, memory for 64 blocks: 63 usable × 16 = 1008 tokens."""
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="float32")
    groups = kvcore.planning.get_kv_cache_groups(
        {"l1": spec}, limits=TokenLimits(max_model_len=4096)
    )
    memory = 64 * spec.page_size_bytes
    assert (
        kvcore.planning.fit_max_model_len(groups, memory, TokenLimits(max_model_len=4096)) == 1008
    )
    config = kvcore.planning.get_kv_cache_config(groups, memory)
    assert kvcore.planning.max_concurrency(config, TokenLimits(max_model_len=1008)) == 64 / 63
    fitted = kvcore.plan("llama-3-8b", memory="512MiB", max_model_len=-1)
    assert fitted.max_model_len == kvcore.plan("llama-3-8b", memory="512MiB").max_model_len
    assert fitted.max_model_len < fitted.model_max_len
    with pytest.raises(
        kvcore.errors.InvalidConfigError,
        match=r"max_model_len must be a positive "
        r"integer, or -1 to fit the longest that fits, got -2",
    ):
        kvcore.plan("llama-3-8b", memory="512MiB", max_model_len=-2)
