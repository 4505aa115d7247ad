"""The hidden_state plugin: full-attention behaviour in its own block table."""

from __future__ import annotations

from kvplugin_helpers import full, hidden, make_manager, tokens

import kvcore
from kvcore.testing import admit


def test_page_has_no_value_part():
    assert hidden(16).page_size_bytes == 16 * 1 * 8 * 2


def test_has_its_own_block_table_and_hits_as_full_attention():
    """Full attention + hidden state, block 16, pool 20: two tables per request.

    A 40-token prompt: full [1, 2, 3], hidden state [4, 5, 6]; both cache 2
    blocks. The same 32 tokens + 5: both groups hit 2 blocks (32 tokens).
    Evicting the hidden-state block 5 cuts the hit to 16 tokens in both.
    """
    manager = make_manager([full(16), hidden(16)], 20)
    prompt = tokens((1, 16), (2, 16), (3, 8))
    admit(manager, kvcore.Request("a", prompt))
    assert manager.get_block_ids("a") == ([1, 2, 3], [4, 5, 6])
    b = kvcore.Request("b", prompt[:32] + [8] * 5)
    hit, num_hit = manager.get_computed_blocks(b)
    assert (num_hit, hit.blocks) == (32, ([1, 2], [4, 5]))
    manager.evict_blocks([5])
    hit, num_hit = manager.get_computed_blocks(b)
    assert (num_hit, hit.blocks) == (16, ([1], [4]))
