"""The mla plugin: full-attention behaviour with the latent page size."""

from __future__ import annotations

import pytest
from kvplugin_helpers import full, make_manager, mla, tokens

import kvcore
from kvcore.errors import InvalidSpecError
from kvcore.testing import admit


def test_page_holds_one_latent_vector_or_packed_record_per_token():
    """bf16 latent of 512 + 64 = 576 elements: 1152 bytes per token, no value part.

    fp8_ds_mla packs 656 bytes per token (512 fp8 latents, 4 fp32 scales,
    64 bf16 rope values): 16 × 656 = 10496 bytes per block of 16.
    """
    assert mla(16).page_size_bytes == 16 * 576 * 2
    assert mla(16, cache_dtype_str="fp8_ds_mla").page_size_bytes == 16 * 656
    assert mla(64, cache_dtype_str="fp8_ds_mla").page_size_bytes == 64 * 656


def test_unknown_packed_format_is_refused():
    with pytest.raises(InvalidSpecError, match=r"cache_dtype_str 'fp4_mystery' is unknown"):
        mla(16, cache_dtype_str="fp4_mystery")


def test_behaves_as_full_attention():
    """The full-attention worked example (block 16, pool 11) gives the same ids.

    A: 55 tokens -> [1, 2, 3, 4]; B shares 48 tokens -> hits [1, 2, 3], new
    [5]; after freeing A then B the queue is [6..10, 4, 5, 3, 2, 1]; C with
    the 48-token prefix revives [1, 2, 3] and gets block 6.
    """
    results = []
    for spec in (full(16), mla(16)):
        manager = make_manager([spec], 11)
        prefix = tokens((0, 16), (1, 16), (2, 16))
        a, b = kvcore.Request("a", [*prefix, 3, 3, 3]), kvcore.Request("b", [*prefix, 9, 9])
        admit(manager, a)
        hit, num_hit = manager.get_computed_blocks(b)
        new = manager.allocate_slots(b, b.num_tokens - num_hit, num_hit, hit)
        manager.free(a)
        manager.free(b)
        queue = manager.block_pool.free_block_ids()
        c = kvcore.Request("c", [*prefix, 7])
        blocks, num_hit_c = admit(manager, c)
        results.append((hit.blocks, new.blocks, queue, num_hit_c, manager.get_block_ids("c")))
    assert results[0] == results[1]
    assert results[1] == (
        ([1, 2, 3],),
        ([5],),
        [6, 7, 8, 9, 10, 4, 5, 3, 2, 1],
        48,
        ([1, 2, 3, 6],),
    )
