"""One-head, one-element specs for tests of the core's bookkeeping.

Block contents do not matter to these tests, only block sizes, windows and
Mamba's extra blocks, so every spec is as small as its type allows.
"""

from __future__ import annotations

from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec


def full(block_size: int = 4) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype="float32")


def sw(window: int, block_size: int = 4) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype="float32", sliding_window=window
    )


def mamba(
    block_size: int = 4, num_speculative_blocks: int = 0, prefill_states: str = "every"
) -> MambaSpec:
    return MambaSpec(
        block_size=block_size,
        shapes=((1, 4),),
        dtypes=("float32",),
        mamba_cache_mode="align",
        num_speculative_blocks=num_speculative_blocks,
        prefill_states=prefill_states,
    )
