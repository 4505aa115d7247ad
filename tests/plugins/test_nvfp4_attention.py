"""The nvfp4_attention plugin: a page in NVFP4, full attention's behaviour.

The page sizes are worked out by hand from the format (4-bit values, two to
a byte, one one-byte E4M3 scale per 16 values); the hit and workload rules
come from the conformance kit, as for every built-in type.
"""

from __future__ import annotations

import types
from typing import ClassVar

import attrs
import pytest
from kvplugin_helpers import make_manager, registry, tokens

import kvcore
from kvcore.errors import InvalidSpecError
from kvcore.specs import KVFormat, PagePart
from kvcore.testing import ConformanceError, check_plugin
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.nvfp4_attention import NVFP4, NVFP4AttentionManager, NVFP4AttentionSpec


def nvfp4(block_size: int = 16, heads: int = 8, head_size: int = 128) -> NVFP4AttentionSpec:
    return NVFP4AttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype="nvfp4"
    )


def test_the_page_of_8_heads_of_128_by_hand():
    """Per token and head 256 values: 128 bytes of codes and 16 one-byte scales.

    8 heads × 144 = 1,152 bytes per token (bf16: 8 × 256 × 2 = 4,096); a
    16-token page is 18,432 bytes: codes 16 × 8 × 128 = 16,384, then scales
    16 × 8 × 16 = 2,048.
    """
    spec = nvfp4()
    assert spec.dtype is NVFP4
    assert spec.kv_format is NVFP4
    assert spec.page_parts() == (
        PagePart(name="kv", offset=0, shape=(16, 8, 128), dtype="uint8"),
        PagePart(name="kv_scale", offset=16_384, shape=(16, 8, 16), dtype="float8_e4m3fn"),
    )
    assert (spec.bytes_per_token, spec.page_size_bytes) == (1152, 18_432)
    assert NVFP4.bytes_per_token(num_kv_heads=8, head_size=128, head_size_v=128) == 1152


def test_a_plain_dtype_is_refused_and_the_format_can_be_named():
    with pytest.raises(InvalidSpecError, match=r"NVFP4AttentionSpec\.dtype is 'bfloat16'"):
        NVFP4AttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16")
    assert nvfp4() == NVFP4AttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=NVFP4)


def test_a_head_size_that_splits_a_scale_group_is_refused():
    with pytest.raises(InvalidSpecError, match="head_size 24 is not a multiple of 16"):
        nvfp4(head_size=24)


def test_types_that_do_not_declare_the_format_refuse_it():
    with pytest.raises(InvalidSpecError, match="does not store the KV format 'nvfp4'"):
        FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=NVFP4)
    # By name it is not even a dtype for full attention.
    with pytest.raises(InvalidSpecError, match="unknown dtype 'nvfp4'"):
        FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="nvfp4")


def test_an_equal_format_made_elsewhere_is_the_same_format():
    copy = attrs.evolve(NVFP4, description="another description")
    assert copy == NVFP4
    assert NVFP4AttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=copy) == nvfp4()


def test_grown_to_a_bf16_page_it_is_padded():
    """65,536 / 18,432 is not whole: the page is padded, 47,104 bytes of it unused."""
    grown = nvfp4().grown_to_page(65_536)
    assert grown is not None
    assert (grown.block_size, grown.page_size_bytes, grown.real_page_size_bytes) == (
        16,
        65_536,
        18_432,
    )
    doubled = nvfp4().grown_to_page(2 * 18_432)
    assert doubled is not None
    assert (doubled.block_size, doubled.page_size_padded) == (32, None)


def test_hits_are_full_attentions():
    """A 55-token prompt caches 3 blocks; a prompt sharing 48 tokens hits all 3."""
    manager = make_manager([nvfp4(block_size=16, heads=1, head_size=16)], num_blocks=11)
    first = kvcore.Request("a", tokens((0, 16), (1, 16), (2, 16), (3, 7)))
    blocks = manager.allocate_slots(first, first.num_tokens)
    assert blocks is not None
    assert blocks.get_block_ids() == ([1, 2, 3, 4],)
    second = kvcore.Request("b", tokens((0, 16), (1, 16), (2, 16), (9, 5)))
    hit, num_hit = manager.get_computed_blocks(second)
    assert (hit.get_block_ids(), num_hit) == (([1, 2, 3],), 48)
    assert manager.coordinator.managers[0].__class__ is NVFP4AttentionManager


@pytest.mark.parametrize(
    "spec",
    [nvfp4(16, 1, 16), nvfp4(4, 2, 32), nvfp4(16, 8, 128)],
    ids=repr,
)
def test_the_conformance_kit_passes(spec):
    report = check_plugin(spec, registry=registry(), num_ops=200)
    assert report.skipped == ()
    assert "page" in report.passed
    assert "torch_views" in report.passed
    assert "two_level_workload" in report.passed  # beside bf16 pages of another size
    # Alone, hybrid and two-level, each with and without EAGLE.
    assert report.workload_ops == 6 * 200


def test_the_format_is_a_value_checked_when_made():
    with pytest.raises(InvalidSpecError, match="name of a plain dtype"):
        KVFormat(name="fp8", element_dtype="uint8", value_bits=8)
    with pytest.raises(InvalidSpecError, match="3-bit values do not pack into uint8"):
        KVFormat(name="odd", element_dtype="uint8", value_bits=3)
    with pytest.raises(InvalidSpecError, match="but the page holds no scales"):
        KVFormat(name="odd", element_dtype="uint8", value_bits=4, values_per_scale=16)
    with pytest.raises(InvalidSpecError, match="KVFormat: unknown dtype 'float3'"):
        KVFormat(name="odd", element_dtype="float3", value_bits=4)


@attrs.frozen(kw_only=True)
class OpaqueNvfp4Spec(NVFP4AttentionSpec):
    """Claims NVFP4 but describes its page as one opaque byte array of the same size."""

    kind: ClassVar[str] = "opaque_nvfp4"

    def page_parts(self) -> tuple[PagePart, ...]:
        shape = (self.block_size, self.num_kv_heads * 144)
        return (PagePart(name="kv", offset=0, shape=shape, dtype="uint8"),)


class OpaqueManager(NVFP4AttentionManager):
    pass


def test_the_kit_refuses_a_page_that_is_not_the_formats():
    registry = kvcore.load_registry(
        only=["full_attention", "opaque"],
        plugins={
            "opaque": types.SimpleNamespace(
                kvcore_layer_types=kvcore.hookimpl(
                    lambda: [kvcore.LayerType(OpaqueNvfp4Spec, OpaqueManager)]
                )
            )
        },
    )
    spec = OpaqueNvfp4Spec(block_size=16, num_kv_heads=1, head_size=128, dtype="nvfp4")
    assert spec.page_size_bytes == nvfp4(heads=1).page_size_bytes
    with pytest.raises(ConformanceError, match=r"rule 'page' failed .*KV format 'nvfp4', but") as e:
        check_plugin(spec, registry=registry, num_ops=50)
    assert e.value.rule == "page"
