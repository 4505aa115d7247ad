"""Helpers of the cluster tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import kvcore
from kvcore.cluster import ClusterIndex, FleetLayout
from kvcore.cluster._wire import EventBatch, decode_batch, encode_batch, merge_removals
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

REGISTRY = kvcore.load_registry(only=["full_attention", "sliding_window", "mamba"])


def full(block_size: int = 4) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype="float32")


def window(block_size: int = 4, sliding_window: int = 4) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=1,
        dtype="float32",
        sliding_window=sliding_window,
    )


def mamba(block_size: int = 4) -> MambaSpec:
    return MambaSpec(
        block_size=block_size, shapes=((4,),), dtypes=("float32",), mamba_cache_mode="align"
    )


LAYOUTS = {
    "full": [full()],
    "full+window": [full(), window()],
    "full+mamba": [full(), mamba()],
}


def config(specs: Sequence[kvcore.specs.KVCacheSpec], num_blocks: int = 40) -> kvcore.KVCacheConfig:
    return kvcore.KVCacheConfig.from_specs(num_blocks, list(specs))


def layout(
    specs: Sequence[kvcore.specs.KVCacheSpec], num_blocks: int = 40, hash_algorithm: str = "fast"
) -> FleetLayout:
    return FleetLayout(
        config=config(specs, num_blocks), registry=REGISTRY, hash_algorithm=hash_algorithm
    )


def manager(
    specs: Sequence[kvcore.specs.KVCacheSpec], num_blocks: int = 40
) -> kvcore.KVCacheManager:
    return kvcore.KVCacheManager(
        config(specs, num_blocks),
        1024,
        registry=REGISTRY,
        hash_algorithm="fast",
        enable_kv_cache_events=True,
    )


def through_the_wire(events: list) -> list:
    """Events as a subscriber sees them: merged, encoded, decoded."""
    return decode_batch(encode_batch(EventBatch(0.0, merge_removals(events)))).events


class Engine:
    """A manager whose events are numbered as a publisher numbers them."""

    def __init__(self, name: str, specs, num_blocks: int = 40) -> None:
        self.name = name
        self.manager = manager(specs, num_blocks)
        self.seq = 0
        self.clock = 0.0
        self.live: list[kvcore.Request] = []
        self.batches: list[tuple[int, float, list]] = []

    def publish(self) -> tuple[int, float, list] | None:
        events = self.manager.take_events()
        if not events:
            return None
        self.clock += 1.0
        batch = (self.seq, self.clock, through_the_wire(events))
        self.seq += 1
        self.batches.append(batch)
        return batch


def prompt_hits(index: ClusterIndex, tokens: Sequence[int]) -> dict[str, int]:
    request = kvcore.Request("probe", list(tokens))
    kvcore.hashing.BlockHasher(index.hash_block_size, "fast").update(request)
    return index.hit_tokens(request.block_hashes, request.num_tokens)


def engine_hit(engine: Engine, tokens: Sequence[int]) -> int:
    return engine.manager.get_computed_blocks(kvcore.Request("probe", list(tokens)))[1]


def random_step(
    engine: Engine, rng: random.Random, bases: Sequence[Sequence[int]], step: int
) -> None:
    """Admit a prompt sharing a prefix with a base, decode a few tokens, or free a request."""
    manager = engine.manager
    if engine.live and rng.random() < 0.4:
        manager.free(engine.live.pop(rng.randrange(len(engine.live))))
        return
    if engine.live and rng.random() < 0.3:
        request = rng.choice(engine.live)
        for _ in range(rng.randrange(1, 6)):
            request.append_output_token_ids(rng.randrange(50))
            if manager.allocate_slots(request, 1) is None:
                break
            request.num_computed_tokens += 1
        return
    base = rng.choice(bases)
    tokens = list(base[: rng.randrange(3, len(base))]) + [rng.randrange(50) for _ in range(3)]
    request = kvcore.Request(f"{engine.name}-{step}", tokens)
    blocks, _ = kvcore.testing.admit(manager, request)
    if blocks is not None:
        engine.live.append(request)
