"""Allocate KV cache for two requests that share a prompt prefix (shown in the docs)."""

from __future__ import annotations

import kvcore
from kvcore_plugins.full_attention import FullAttentionSpec

# One group of full-attention layers: 16 tokens per block, 11 blocks in the
# pool (block 0 is the null block, so 10 are usable).
spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
config = kvcore.KVCacheConfig.from_specs(num_blocks=11, specs=[spec])
manager = kvcore.KVCacheManager(config, max_model_len=4096)

system_prompt = list(range(1000, 1048))  # 48 tokens: three full blocks
first = kvcore.Request("first", [*system_prompt, 1, 2, 3, 4, 5, 6, 7])

# Admission: look the prompt up, then allocate slots for what is not cached.
hit, num_hit = manager.get_computed_blocks(first)
new = manager.allocate_slots(first, first.num_tokens - num_hit, num_hit, hit)
print(f"first:  {num_hit:2d} cached tokens, new blocks {new.get_block_ids()}")
first.num_computed_tokens = first.num_tokens  # the engine ran the prefill

# A second request with the same 48-token prefix reuses its three blocks.
second = kvcore.Request("second", [*system_prompt, 9, 9, 9, 9, 9])
hit, num_hit = manager.get_computed_blocks(second)
new = manager.allocate_slots(second, second.num_tokens - num_hit, num_hit, hit)
print(f"second: {num_hit:2d} cached tokens, new blocks {new.get_block_ids()}")
print(f"second's block table: {manager.get_block_ids('second')}")

# Decoding: one token per step; a new block is taken only when one fills up.
first.append_output_token_ids(42)
manager.allocate_slots(first, 1)
print(f"free blocks: {manager.num_free_blocks}, usage {manager.usage:.0%}")

# Finished requests give their blocks back; cached blocks stay reusable.
manager.free(first)
manager.free(second)
print(f"after free: {manager.num_free_blocks} free blocks")
