"""The cross_attention plugin: encoder-sized static allocation, never prefix-cached.

Behaviour of vLLM 0.14's CrossAttentionManager (the seed), with its
``NotImplementedError`` / ``ValueError`` / assert replaced by
:class:`~kvcore.errors.PrefixCachingNotSupportedError`.
"""

from __future__ import annotations

import pytest
from kvplugin_helpers import cross, full, make_manager

import kvcore
from kvcore.errors import InvalidConfigError, PrefixCachingNotSupportedError
from kvcore.managers import HitQuery
from kvcore_plugins.cross_attention import CrossAttentionManager


def test_blocks_are_allocated_once_from_the_encoder_length():
    """Full attention (decoder) + cross attention, block 16, caching off.

    A 10-token prompt with 100 encoder tokens: the decoder group takes 1
    block, the cross group cdiv(100, 16) = 7 (ids 2-8), predicted = taken.
    Decoding 30 tokens grows the decoder group only (a 2nd block at token 17
    and a 3rd at token 33), whatever num_encoder_tokens says.
    """
    manager = make_manager([full(16), cross(16)], 20, enable_caching=False)
    request = kvcore.Request("a", list(range(10)))
    assert manager.coordinator.get_num_blocks_to_allocate("a", 10, ((), ()), 100, 0) == 8
    assert manager.allocate_slots(request, 10, num_encoder_tokens=100) is not None
    request.num_computed_tokens = 10
    assert manager.get_block_ids("a") == ([1], [2, 3, 4, 5, 6, 7, 8])
    for token in range(30):
        request.append_output_token_ids(token)
        encoder = 100 if token % 2 else 0
        assert manager.allocate_slots(request, 1, num_encoder_tokens=encoder) is not None
        request.num_computed_tokens += 1
    assert manager.get_block_ids("a") == ([1, 9, 10], [2, 3, 4, 5, 6, 7, 8])
    manager.free(request)
    assert manager.num_free_blocks == 19


def test_lookups_and_caching_raise_a_clear_error():
    pool = kvcore.managers.BlockPool(10)
    manager = CrossAttentionManager(cross(16), pool)
    with pytest.raises(
        PrefixCachingNotSupportedError,
        match=r"never prefix-cached.*"
        r"enable_caching=False",
    ):
        CrossAttentionManager.find_longest_cache_hit(
            HitQuery(["h"], 16, [0], pool, cross(16), False, 16)
        )
    with pytest.raises(PrefixCachingNotSupportedError, match="never prefix-cached"):
        manager.cache_blocks(kvcore.Request("a", list(range(32))), 32)
    with pytest.raises(PrefixCachingNotSupportedError, match="never prefix-cached"):
        manager.allocate_new_computed_blocks("a", [3], 16, 0)
    assert manager.req_to_blocks == {}
    assert pool.get_num_free_blocks() == 9


def test_prefix_caching_with_a_cross_attention_group_is_refused():
    with pytest.raises(
        InvalidConfigError,
        match=r"group 1 \(CrossAttentionSpec, managed by CrossAttentionManager\) is never "
        r"cached.*enable_caching=False",
    ):
        make_manager([full(16), cross(16)], 20)
