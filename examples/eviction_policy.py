"""An eviction policy written against kvcore.eviction, and every call the pool makes to it.

Run it: ``python examples/eviction_policy.py``. The architecture page
(docs/explanation/architecture.rst) walks through its output.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import kvcore
from kvcore.eviction import EvictionPolicy, PoolInfo
from kvcore_plugins.full_attention import FullAttentionSpec


class NewestFirst:
    """Take the most recently freed block first: a toy, to show the protocol.

    Never-allocated blocks go first (they hold nothing). Freed blocks go on a
    stack; a revived block is not looked for in the stack (that would scan
    it) but marked, and skipped when it comes up. Per-block state lives in
    flat arrays indexed by block id.
    """

    def __init__(self, info: PoolInfo) -> None:
        self._num_blocks = info.num_blocks
        self._next_fresh = 0
        self._stack: list[tuple[int, int]] = []  # (block, stamp), newest last
        self._stamp = [0] * info.num_blocks  # bumped when freed: older entries are stale
        self._free = bytearray(info.num_blocks)
        self._holes: set[int] = set()  # never-used blocks a hit took (not to hand out)

    def take(self, n: int) -> list[int]:
        """Never-used blocks first, then the newest freed."""
        out = []
        while len(out) < n:
            if self._next_fresh < self._num_blocks:
                if self._next_fresh not in self._holes:
                    out.append(self._next_fresh)
                self._next_fresh += 1
                continue
            block, stamp = self._stack.pop()
            if self._free[block] and stamp == self._stamp[block]:
                self._free[block] = 0
                out.append(block)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Push freed blocks, the first given on top."""
        for block in reversed(blocks):  # the manager's first block is taken first
            self._stamp[block] += 1
            self._free[block] = 1
            self._stack.append((block, self._stamp[block]))

    def revive(self, block: int) -> None:
        """Mark a revived block; its stack entry is skipped later."""
        self._free[block] = 0
        if block >= self._next_fresh:  # a hit on a block never handed out
            self._holes.add(block)

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        """Ignored: this policy does not look at what blocks hold."""

    def hit(self, blocks: Sequence[int]) -> None:
        """Ignored."""

    def forget(self, blocks: Sequence[int] | None) -> None:
        """Ignored."""

    def __iter__(self) -> Iterator[int]:
        for block in range(self._next_fresh, self._num_blocks):
            if block not in self._holes:
                yield block
        for block, stamp in reversed(self._stack):
            if self._free[block] and stamp == self._stamp[block]:
                yield block


class Logged:
    """Passes every call on to ``inner`` and prints it."""

    def __init__(self, inner: EvictionPolicy) -> None:
        self.inner = inner

    def take(self, n: int) -> list[int]:
        """Print, then pass on."""
        blocks = self.inner.take(n)
        print(f"  take({n}) -> {blocks}")
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Print, then pass on."""
        print(f"  release({list(blocks)})")
        self.inner.release(blocks)

    def revive(self, block: int) -> None:
        """Print, then pass on."""
        print(f"  revive({block})")
        self.inner.revive(block)

    def withdraw(self, block: int) -> None:
        """Print, then pass on."""
        print(f"  withdraw({block})")
        self.inner.withdraw(block)

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        """Print, then pass on."""
        print(
            f"  cached(group={group}, blocks[{start}:{stop}]={list(blocks[start:stop])}, "
            f"num_prompt_tokens={num_prompt_tokens})"
        )
        self.inner.cached(group, blocks, start, stop, block_hashes, num_prompt_tokens)

    def hit(self, blocks: Sequence[int]) -> None:
        """Print, then pass on."""
        print(f"  hit({list(blocks)})")
        self.inner.hit(blocks)

    def forget(self, blocks: Sequence[int] | None) -> None:
        """Print, then pass on."""
        print(f"  forget({None if blocks is None else list(blocks)})")
        self.inner.forget(blocks)

    def __iter__(self) -> Iterator[int]:
        return iter(self.inner)


@kvcore.hookimpl
def kvcore_eviction_policies() -> dict[str, object]:
    """How a plugin would offer the policy by name (``eviction="newest-first"``)."""
    return {"newest-first": NewestFirst}


def main() -> None:
    """Three requests on a six-block pool, every call printed."""
    spec = FullAttentionSpec(block_size=4, num_kv_heads=8, head_size=64, dtype="float16")
    config = kvcore.KVCacheConfig.from_specs(6, [spec])  # block 0 is the null block
    registry = kvcore.load_registry(only=["full_attention"])
    print("the pool is built: the null block is taken first")
    manager = kvcore.KVCacheManager(
        config, 64, registry=registry, eviction=lambda info: Logged(NewestFirst(info))
    )

    def run(request: kvcore.Request) -> None:
        hit, num_hit = manager.get_computed_blocks(request)
        manager.allocate_slots(request, request.num_tokens - num_hit, num_hit, hit)
        request.num_computed_tokens = request.num_tokens

    a = kvcore.Request("a", list(range(1, 11)))
    print("a: 10 tokens, 3 blocks, 2 of them full")
    run(a)
    print("a finishes")
    manager.free(a)
    b = kvcore.Request("b", [*range(1, 9), 50, 51, 52, 53])
    print("b: 12 tokens, the first 8 are a's")
    run(b)
    print("b finishes")
    manager.free(b)
    c = kvcore.Request("c", list(range(100, 109)))
    print("c: 9 new tokens, 3 blocks; one block was never used, the rest are taken")
    run(c)
    print(f"free, next taken first: {manager.block_pool.free_block_ids()}")


if __name__ == "__main__":
    main()
