"""``check_plugin``: every built-in type and both examples pass; broken variants fail by rule."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import attrs
import pytest
from kvplugin_helpers import chunked, cross, full, hidden, mamba, mla, registry, sink, sw

import kvcore
from kvcore.errors import InvalidSpecError
from kvcore.managers import HitQuery, PrefixManager
from kvcore.specs import KVCacheSpec, PagePart, TokenLimits
from kvcore.testing import ConformanceError, check_plugin
from kvcore_plugins.full_attention import FullAttentionManager, FullAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowManager, SlidingWindowSpec

ALL_RULES = (
    "registered",
    "tokens_read",
    "skipped_tokens",
    "page",
    "grouping_key",
    "hit_search",
    "workload",
    "steady_until",
    "hybrid_workload",
    "two_level_workload",
    "torch_views",
)


@pytest.mark.parametrize(
    "spec",
    [
        full(16),
        sw(40, 16),
        sw(5, 4),
        chunked(64, 16),
        mamba(16),
        mamba(16, spec_blocks=2),
        sink(32, 16),
        mla(16),
        mla(16, cache_dtype_str="fp8_ds_mla"),
        hidden(16),
    ],
    ids=repr,
)
def test_every_builtin_type_passes(spec):
    report = check_plugin(spec, registry=registry(), num_ops=200)
    assert report.passed == ALL_RULES
    assert report.skipped == ()
    assert report.hit_cases == 400
    # Alone, hybrid and in a two-level pool, with EAGLE where the type accepts it
    # (chunked local does not).
    assert report.workload_ops == (3 if spec.kind == "chunked_local" else 6) * 200


def test_cross_attention_passes_what_applies():
    report = check_plugin(cross(16), registry=registry(), num_ops=200)
    assert "hit_search" not in report.passed
    assert ("hit_search", "the type is never prefix-cached") in report.skipped
    assert {"page", "workload", "hybrid_workload", "torch_views"} <= set(report.passed)


def test_the_compressed_example_passes():
    from kvcore_compressed import CompressedAttentionSpec

    spec = CompressedAttentionSpec(
        block_size=16, ratio=4, num_kv_heads=2, head_size=64, dtype="bf16"
    )
    plugins = kvcore.load_registry(only=["compressed", "full_attention"])
    assert check_plugin(spec, registry=plugins, num_ops=200).passed == ALL_RULES


# -- deliberately broken variants ---------------------------------------------------------


def broken_registry(*layer_types: kvcore.LayerType[Any]) -> kvcore.Registry:
    return kvcore.registry.registry_from_layer_types(
        [kvcore.LayerType(FullAttentionSpec, FullAttentionManager), *layer_types]
    )


def window_spec(cls: type[SlidingWindowSpec]) -> SlidingWindowSpec:
    return cls(block_size=16, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=40)


@attrs.frozen(kw_only=True)
class PrefixHitWindow(SlidingWindowSpec):
    kind: ClassVar[str] = "prefix_hit_window"


class PrefixHitManager(PrefixManager[SlidingWindowSpec]):
    """Frees the window correctly but searches hits as full attention does."""

    frees_skipped_blocks: ClassVar[bool] = True

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.spec.sliding_window + 1)


@attrs.frozen(kw_only=True)
class GreedyWindow(SlidingWindowSpec):
    kind: ClassVar[str] = "greedy_window"


class GreedyManager(SlidingWindowManager):
    """Frees one block more than the window allows."""

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.spec.sliding_window + 1 + 16)


@attrs.frozen(kw_only=True)
class SmallBound(SlidingWindowSpec):
    kind: ClassVar[str] = "small_bound"

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        return 2 * self.page_size_bytes


@attrs.frozen(kw_only=True)
class KeylessWindow(SlidingWindowSpec):
    kind: ClassVar[str] = "keyless_window"

    @property
    def uniform_type_key(self) -> Any:
        return type(self)


@attrs.frozen(kw_only=True)
class StuckPage(SlidingWindowSpec):
    kind: ClassVar[str] = "stuck_page"

    def grown_to_page(self, page_size: int) -> KVCacheSpec | None:
        return self


@attrs.frozen(kw_only=True)
class Mispredicting(FullAttentionSpec):
    kind: ClassVar[str] = "mispredicting"


class MispredictingManager(FullAttentionManager):
    def get_num_blocks_to_allocate(self, *args: Any) -> int:
        return super().get_num_blocks_to_allocate(*args) + 1

    def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
        return num_computed_tokens  # every step the full way


@attrs.frozen(kw_only=True)
class TooSteady(FullAttentionSpec):
    kind: ClassVar[str] = "too_steady"


class TooSteadyManager(FullAttentionManager):
    """Counts only the slots its table holds: decode steps that fill a block skip its caching."""

    def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
        table = self.req_to_blocks.get(request_id)
        return len(table) * self.block_size if table else num_computed_tokens


@attrs.frozen(kw_only=True)
class LongHits(FullAttentionSpec):
    kind: ClassVar[str] = "long_hits"


class LongHitManager(FullAttentionManager):
    """Claims one block more than is cached."""

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[Any]) -> tuple[list[int], ...]:
        hits = super().find_longest_cache_hit(query)
        if (len(hits[0]) + 1) * query.spec.block_size <= query.max_length:
            return tuple([*blocks, blocks[-1] if blocks else 1] for blocks in hits)
        return hits


@attrs.frozen(kw_only=True)
class LeakingFirstBlock(FullAttentionSpec):
    kind: ClassVar[str] = "leaking_first_block"


class LeakingManager(FullAttentionManager):
    """Reads every token (hits are prefixes) but frees the first block after 32 tokens."""

    frees_skipped_blocks: ClassVar[bool] = True

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        table = self.req_to_blocks.get(request_id, [])
        if total_computed_tokens > 32 and table and table[0]:
            self.block_pool.free_blocks([table[0]])
            table[0] = kvcore.managers.NULL_BLOCK

    def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
        return num_computed_tokens  # every step the full way


@pytest.mark.parametrize(
    ("spec_cls", "manager_cls", "rule", "detail"),
    [
        (PrefixHitWindow, PrefixHitManager, "hit_search", "the longest usable one by the type's"),
        (GreedyWindow, GreedyManager, "skipped_tokens", "freed blocks would still be read"),
        (SmallBound, SlidingWindowManager, "workload", "more than max_memory_usage_bytes allows"),
        (KeylessWindow, SlidingWindowManager, "grouping_key", "but reads other tokens"),
        (StuckPage, SlidingWindowManager, "page", "must return the page asked for, or None"),
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_a_broken_window_fails_naming_the_rule(spec_cls, manager_cls, rule, detail):
    plugins = broken_registry(kvcore.LayerType(spec_cls, manager_cls))
    with pytest.raises(ConformanceError) as info:
        check_plugin(window_spec(spec_cls), registry=plugins, num_ops=200)
    assert info.value.rule == rule
    message = str(info.value)
    assert message.startswith(f"check_plugin rule {rule!r} failed for {spec_cls.__qualname__} ")
    assert detail in message


@attrs.frozen(kw_only=True)
class NoSuperInit(FullAttentionSpec):
    """Checks its own field and forgets the base class's checks."""

    kind: ClassVar[str] = "no_super_init"

    def __attrs_post_init__(self) -> None:
        if self.head_size > 4096:
            raise InvalidSpecError("head_size too large")


@attrs.frozen(kw_only=True)
class FixedPage(FullAttentionSpec):
    """Keys grow with the block, a 16-token scale table does not."""

    kind: ClassVar[str] = "fixed_page"

    def page_parts(self) -> tuple[PagePart, ...]:
        kv = (self.block_size, self.num_kv_heads, 2 * self.head_size)
        scales = PagePart(name="scales", offset=0, shape=(16, self.num_kv_heads), dtype="float16")
        keys = PagePart(name="kv", offset=scales.end, shape=kv, dtype=self.dtype)
        return (scales, keys)


@attrs.frozen(kw_only=True)
class RaisingHits(FullAttentionSpec):
    kind: ClassVar[str] = "raising_hits"


class RaisingHitManager(FullAttentionManager):
    """A hit search with a bug of its own: a KeyError on some queries."""

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[Any]) -> tuple[list[int], ...]:
        if query.max_length > 64:
            raise KeyError(query.block_hashes[0])
        return super().find_longest_cache_hit(query)


@attrs.frozen(kw_only=True)
class RaisingAllocation(FullAttentionSpec):
    kind: ClassVar[str] = "raising_allocation"


class RaisingAllocationManager(FullAttentionManager):
    """An allocation with a bug of its own: an IndexError on the third call."""

    calls: ClassVar[list[int]] = []

    def allocate_new_blocks(self, *args: Any) -> Any:
        self.calls.append(1)
        if len(self.calls) % 3 == 0:
            raise IndexError("list index out of range")
        return super().allocate_new_blocks(*args)

    def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
        return num_computed_tokens  # every step the full way


@pytest.mark.parametrize(
    ("spec_cls", "manager_cls", "rule", "detail"),
    [
        (NoSuperInit, FullAttentionManager, "page", "does not call super().__attrs_post_init__()"),
        (
            FixedPage,
            FullAttentionManager,
            "page",
            "page part 'scales' is 32 bytes at block_size=16 and 32 at block_size=32",
        ),
        (RaisingHits, RaisingHitManager, "hit_search", "the plugin's code raised KeyError"),
        (
            RaisingAllocation,
            RaisingAllocationManager,
            "workload",
            "the plugin's code raised IndexError",
        ),
        (LongHits, LongHitManager, "hit_search", "the hit is"),
        (TooSteady, TooSteadyManager, "steady_until", "skipped a decode step"),
        (LeakingFirstBlock, LeakingManager, "workload", "but block 0 of its table is freed (null)"),
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_a_broken_full_attention_fails_naming_the_rule(spec_cls, manager_cls, rule, detail):
    plugins = broken_registry(kvcore.LayerType(spec_cls, manager_cls))
    spec = spec_cls(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    with pytest.raises(ConformanceError) as info:
        check_plugin(spec, registry=plugins, num_ops=200)
    assert info.value.rule == rule
    assert detail in str(info.value)


def test_a_manager_predicting_one_block_too_many_fails_the_workload_rule():
    """Every prediction is one more than what is taken, whatever the workload draws."""
    plugins = broken_registry(kvcore.LayerType(Mispredicting, MispredictingManager))
    spec = Mispredicting(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    with pytest.raises(ConformanceError) as info:
        check_plugin(spec, registry=plugins, num_ops=200)
    assert info.value.rule == "workload"
    counts = re.search(r"predicted (\d+) blocks, took (\d+)$", str(info.value))
    assert counts is not None, str(info.value)
    assert int(counts[1]) == int(counts[2]) + 1


def test_an_unregistered_spec_fails_the_first_rule():
    with pytest.raises(ConformanceError, match="rule 'registered' failed"):
        check_plugin(window_spec(PrefixHitWindow), registry=registry())


def test_a_plugins_own_exception_is_chained_to_the_rule_it_broke():
    plugins = broken_registry(kvcore.LayerType(RaisingHits, RaisingHitManager))
    spec = RaisingHits(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    with pytest.raises(ConformanceError) as info:
        check_plugin(spec, registry=plugins, num_ops=50)
    assert info.value.rule == "hit_search"
    assert isinstance(info.value.__cause__, KeyError)
