"""The plugin contract is checked when a registry is built: every former silent no-op is an error.

Each test builds a small, deliberately broken attention type and expects the
registry to refuse it with a message naming the plugin, the class and the
missing piece.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import pytest

import kvcore
from kvcore.errors import HookImplementationError, PluginConflictError, UnknownSpecError
from kvcore.managers import HitQuery, PrefixManager, SingleTypeManager
from kvcore.specs import AttentionSpec, KVCacheSpec, PagePart, TokenLimits, positive_int
from kvcore.testing import admit
from kvcore_plugins.full_attention import FullAttentionManager, FullAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowManager, SlidingWindowSpec


@attrs.frozen(kw_only=True)
class ToySpec(AttentionSpec):
    kind: ClassVar[str] = "toy"

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes


class ToyManager(PrefixManager[ToySpec]):
    pass


def toy(**fields: Any) -> ToySpec:
    return ToySpec(block_size=4, num_kv_heads=1, head_size=2, dtype="float32", **fields)


def registry_of(spec: type[KVCacheSpec], manager: type[SingleTypeManager[Any]]) -> kvcore.Registry:
    return kvcore.registry.registry_from_layer_types(
        [kvcore.LayerType(spec, manager)], name="broken"
    )


def refused(spec: type[KVCacheSpec], manager: type[SingleTypeManager[Any]]) -> str:
    with pytest.raises(HookImplementationError) as info:
        registry_of(spec, manager)
    return str(info.value)


# -- spec classes -----------------------------------------------------------------------


def test_a_spec_without_kind_is_refused_not_called_abstract():
    @attrs.frozen(kw_only=True)
    class NoKind(AttentionSpec):
        def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
            return 0

    message = refused(NoKind, ToyManager)
    assert message.startswith("plugin 'broken': test_contract.")
    assert "NoKind has kind None; set the class attribute kind" in message


def test_a_kind_must_be_a_lowercase_name():
    @attrs.frozen(kw_only=True)
    class Shouting(ToySpec):
        kind: ClassVar[str] = "Full Attention"

    assert "has kind 'Full Attention'" in refused(Shouting, ToyManager)


def test_two_classes_may_not_share_one_kind():
    @attrs.frozen(kw_only=True)
    class SameKind(ToySpec):
        pass  # inherits kind "toy"

    with pytest.raises(PluginConflictError) as info:
        kvcore.registry.registry_from_layer_types(
            [kvcore.LayerType(ToySpec, ToyManager), kvcore.LayerType(SameKind, ToyManager)]
        )
    message = str(info.value)
    assert "kind 'toy' is used by test_contract.ToySpec (plugin 'inline')" in message
    assert "SameKind (plugin 'inline'); give each spec class its own kind" in message


def test_a_spec_class_must_be_an_attrs_class_itself():
    class Undecorated(ToySpec):
        kind: ClassVar[str] = "undecorated"

    assert "is not decorated with @attrs.frozen(kw_only=True) itself" in refused(
        Undecorated, ToyManager
    )


def test_a_spec_must_implement_its_memory_bound():
    @attrs.frozen(kw_only=True)
    class NoBound(AttentionSpec):
        kind: ClassVar[str] = "no_bound"

    assert "NoBound does not implement max_memory_usage_bytes()" in refused(NoBound, ToyManager)


def test_a_page_size_declared_beside_the_page_parts_is_refused():
    """The documented example used to override only real_page_size_bytes (issue 9)."""

    @attrs.frozen(kw_only=True)
    class Declared(ToySpec):
        kind: ClassVar[str] = "declared"

        @property
        def real_page_size_bytes(self) -> int:  # type: ignore[override]
            return 128

    message = refused(Declared, ToyManager)
    assert "Declared overrides real_page_size_bytes" in message
    assert "derived from page_parts(), so describe the page there instead" in message


def test_the_removed_as_full_attention_hook_is_refused_with_its_replacement():
    @attrs.frozen(kw_only=True)
    class OldStyle(ToySpec):
        kind: ClassVar[str] = "old_style"

        def as_full_attention(self, block_size: int) -> KVCacheSpec:
            return self

    assert "replaced: name the spec class that allocates its layers in promoted_to" in refused(
        OldStyle, ToyManager
    )


def test_promotion_needs_a_class_that_allocates_for_others():
    @attrs.frozen(kw_only=True)
    class Local(ToySpec):
        kind: ClassVar[str] = "local"
        promoted_to: ClassVar[type[KVCacheSpec] | None] = ToySpec

    assert "is promoted to test_contract.ToySpec, which does not implement allocating_for" in (
        refused(Local, ToyManager)
    )


def test_promotion_to_a_class_no_plugin_serves_is_refused_when_the_registry_is_built():
    with pytest.raises(UnknownSpecError) as info:
        kvcore.registry.registry_from_layer_types(
            [kvcore.LayerType(SlidingWindowSpec, SlidingWindowManager)]
        )
    message = str(info.value)
    assert "plugin 'inline' needs the plugin serving" in message
    assert "kvcore_plugins.full_attention.spec.FullAttentionSpec" in message
    registry = kvcore.registry.registry_from_layer_types(
        [
            kvcore.LayerType(SlidingWindowSpec, SlidingWindowManager),
            kvcore.LayerType(FullAttentionSpec, FullAttentionManager),
        ]
    )
    assert registry.manager_class(SlidingWindowSpec) is SlidingWindowManager


def test_a_forgotten_uniform_type_key_keeps_different_windows_apart():
    """Formerly windows 64 and 4096 shared one group, managed with the first window."""

    @attrs.frozen(kw_only=True)
    class Window(ToySpec):
        kind: ClassVar[str] = "window"
        window: int = attrs.field(validator=positive_int)

    small = Window(block_size=4, num_kv_heads=1, head_size=2, dtype="float32", window=64)
    large = attrs.evolve(small, window=4096)
    assert small.uniform_type_key != large.uniform_type_key
    # Head sizes change only the page: still one table.
    assert attrs.evolve(small, head_size=8).uniform_type_key == small.uniform_type_key
    groups = kvcore.planning.get_kv_cache_groups({"a": small, "b": large})
    assert [g.layer_names for g in groups] == [("a",), ("b",)]


# -- manager classes --------------------------------------------------------------------


def test_a_manager_without_a_hit_search_is_refused_at_registry_build_not_first_lookup():
    class NoSearch(SingleTypeManager[ToySpec]):
        pass

    message = refused(ToySpec, NoSearch)
    assert "NoSearch does not implement find_longest_cache_hit(cls, query)" in message
    assert "or set supports_prefix_caching = False" in message


def test_a_hit_search_with_the_old_seven_parameters_is_refused():
    class OldSignature(SingleTypeManager[ToySpec]):
        @classmethod
        def find_longest_cache_hit(  # type: ignore[override]
            cls, block_hashes, max_length, group_ids, pool, spec, use_eagle, alignment
        ):
            return ([],)

    message = refused(ToySpec, OldSignature)
    assert "parameters (block_hashes, max_length, group_ids, pool, spec, use_eagle, alignment)" in (
        message
    )
    assert "def find_longest_cache_hit(cls, query)" in message


def test_a_hit_search_that_is_not_a_classmethod_is_refused():
    class Plain(SingleTypeManager[ToySpec]):
        def find_longest_cache_hit(self, query):  # type: ignore[override]
            return ([],)

    assert "defines find_longest_cache_hit in test_contract." in refused(ToySpec, Plain)


def test_overriding_remove_skipped_blocks_without_declaring_it_is_refused():
    """Formerly a no-op: the coordinator only called it for managers overriding another method."""

    class Quiet(ToyManager):
        def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
            pass

    message = refused(ToySpec, Quiet)
    assert "Quiet overrides remove_skipped_blocks but does not set frees_skipped_blocks" in message


def test_overriding_get_num_skipped_tokens_without_declaring_it_is_refused():
    class Quiet(ToyManager):
        def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
            return num_computed_tokens

    assert "overrides get_num_skipped_tokens but does not set frees_skipped_blocks" in refused(
        ToySpec, Quiet
    )


def test_declaring_freeing_without_saying_what_to_free_is_refused():
    class Vague(ToyManager):
        frees_skipped_blocks: ClassVar[bool] = True

    assert "sets frees_skipped_blocks = True but says nothing about what to free" in refused(
        ToySpec, Vague
    )


def test_a_flag_that_is_not_a_bool_is_refused():
    class Truthy(ToyManager):
        downward_closed_hits = 1  # type: ignore[assignment]

    assert "sets downward_closed_hits = 1; it must be True or False" in refused(ToySpec, Truthy)


def test_a_declared_remove_skipped_blocks_is_called_for_every_allocation():
    """Freeing is driven by the declaration alone: a custom pattern (the gap after a sink)."""
    calls = []

    class Gap(ToyManager):
        frees_skipped_blocks: ClassVar[bool] = True

        def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
            calls.append((request_id, total_computed_tokens))
            table = self.req_to_blocks.get(request_id, [])
            if total_computed_tokens >= 12 and len(table) > 1 and table[1]:
                self.block_pool.free_blocks([table[1]])
                table[1] = kvcore.managers.NULL_BLOCK

        def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
            return num_computed_tokens  # every step the full way

    registry = registry_of(ToySpec, Gap)
    manager = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(10, [toy()]), 64, registry=registry
    )
    request = kvcore.Request("r", list(range(12)))
    admit(manager, request)
    assert calls == [("r", 0)]
    assert manager.get_block_ids("r") == ([1, 2, 3],)
    request.append_output_token_ids(99)
    manager.allocate_slots(request, 1)
    assert calls[-1] == ("r", 12)
    assert manager.get_block_ids("r") == ([1, 0, 3, 4],)


# -- hit search through the query object -----------------------------------------------


def test_the_query_object_is_immutable_and_read_by_name():
    query: HitQuery[ToySpec] = HitQuery(["a"], 8, [0], kvcore.managers.BlockPool(2), toy())
    assert (query.use_eagle, query.alignment_tokens) == (False, 1)
    assert query.no_hit() == ([],)
    with pytest.raises(AttributeError):
        query.max_length = 4  # type: ignore[misc]


def test_every_hit_search_runs_against_a_lookup_that_is_not_a_pool():
    """The cluster index of another engine implements the two lookup methods, nothing else."""

    class Remote(kvcore.managers.CachedBlockLookup):
        def __init__(self) -> None:
            self.blocks = {"h0": 7, "h1": 8, "h2": 9}
            self.asked: list[str] = []

        def get_cached_block(self, block_hash, kv_cache_group_ids):
            self.asked.append(block_hash)
            block = self.blocks.get(block_hash)
            return None if block is None else [block] * len(kv_cache_group_ids)

    hashes = ["h0", "h1", "h2", "h3"]
    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=2, dtype="float32")
    remote = Remote()
    hit = FullAttentionManager.find_longest_cache_hit(HitQuery(hashes, 16, [0], remote, full))
    # match_prefix comes from the protocol, written with get_cached_block: stops at h3.
    assert hit == ([7, 8, 9],)
    assert remote.asked == ["h0", "h1", "h2", "h3"]
    window = SlidingWindowSpec(
        block_size=4, num_kv_heads=1, head_size=2, dtype="float32", sliding_window=5
    )
    # Window 5 at block 4: a hit of 12 tokens needs tokens 8-11, block 2 only.
    hit = SlidingWindowManager.find_longest_cache_hit(HitQuery(hashes, 12, [0], Remote(), window))
    assert hit == ([0, 0, 9],)


def test_a_pool_and_a_plain_lookup_give_the_same_hits():
    pool = kvcore.managers.BlockPool(6)
    request = kvcore.Request("r", list(range(16)))
    request.block_hashes.extend(["a", "b", "c", "d"])
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(request, blocks, 0, 4, 4, 0)

    class Plain(kvcore.managers.CachedBlockLookup):
        def get_cached_block(self, block_hash, kv_cache_group_ids):
            return pool.get_cached_block(block_hash, kv_cache_group_ids)

    for stop in range(5):
        assert Plain().match_prefix(["a", "b", "x", "d"], 0, stop, [0]) == pool.match_prefix(
            ["a", "b", "x", "d"], 0, stop, [0]
        )


# -- the page: one source --------------------------------------------------------------


def test_the_page_size_is_derived_from_the_page_parts():
    @attrs.frozen(kw_only=True)
    class TwoParts(KVCacheSpec):
        kind: ClassVar[str] = "two_parts"

        def page_parts(self) -> tuple[PagePart, ...]:
            return (
                PagePart(name="a", offset=0, shape=(self.block_size, 3), dtype="float16"),
                PagePart(name="b", offset=64, shape=(2,), dtype="int32"),
            )

        def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
            return self.page_size_bytes

    spec = TwoParts(block_size=8)  # part a: 8 x 3 x 2 = 48 bytes; part b ends at 64 + 8
    assert (spec.real_page_size_bytes, spec.page_size_bytes) == (72, 72)
    assert TwoParts(block_size=8, page_size_padded=80).page_size_bytes == 80
    with pytest.raises(
        kvcore.errors.InvalidSpecError, match=r"page_size_padded \(70 bytes\) is smaller"
    ):
        TwoParts(block_size=8, page_size_padded=70)
    overlap = r"part 'b' \(bytes 64-72\) overlaps part 'a'"
    with pytest.raises(kvcore.errors.InvalidSpecError, match=overlap):
        TwoParts(block_size=40)  # part a now ends at byte 240


def test_an_attention_page_must_grow_by_whole_bytes_per_token():
    @attrs.frozen(kw_only=True)
    class Odd(ToySpec):
        kind: ClassVar[str] = "odd"

        def page_parts(self) -> tuple[PagePart, ...]:
            return (PagePart(name="kv", offset=0, shape=(self.block_size + 1,), dtype="uint8"),)

    with pytest.raises(
        kvcore.errors.InvalidSpecError, match="not a whole number of bytes for each of"
    ):
        Odd(block_size=4, num_kv_heads=1, head_size=2, dtype="float32")


def test_bytes_per_token_follows_the_page():
    spec = toy()  # 4 tokens x 1 head x (2 + 2) x 4 bytes
    assert (spec.page_size_bytes, spec.bytes_per_token) == (64, 16)
