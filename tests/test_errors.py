"""Bad input gets a clear error naming the field and the fix, and changes nothing."""

from __future__ import annotations

import pytest

import kvcore
from kvcore import Request
from kvcore.errors import (
    InvalidCacheHitError,
    InvalidConfigError,
    InvalidRequestError,
    InvalidSpecError,
    RequestStateError,
    RequestTooLongError,
)
from kvcore.specs import TokenLimits, dtype_name, dtype_size
from kvcore.testing import admit, snapshot
from kvcore_plugins.full_attention import FullAttentionSpec

BASE = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("block_size", 0, "FullAttentionSpec.block_size must be a positive integer, got 0"),
        ("block_size", 16.0, "FullAttentionSpec.block_size must be a positive integer, got 16.0"),
        ("block_size", True, "FullAttentionSpec.block_size must be a positive integer, got True"),
        ("num_kv_heads", -1, "FullAttentionSpec.num_kv_heads must be a positive integer"),
        ("head_size", 0, "FullAttentionSpec.head_size must be a positive integer"),
        ("head_size_v", -2, "FullAttentionSpec.head_size_v must be an integer >= 0"),
        ("dtype", "float13", "FullAttentionSpec.dtype: unknown dtype 'float13'; known dtypes:"),
        ("dtype", 3, "FullAttentionSpec.dtype: expected a dtype name or a torch.dtype, got 3"),
        ("compute_spec", 7, "FullAttentionSpec.compute_spec must be a kvcore spec or None, got 7"),
        ("page_size_padded", 100, r"page_size_padded \(100 bytes\) is smaller than the page"),
    ],
)
def test_invalid_spec_fields_are_named(field, value, message):
    with pytest.raises(InvalidSpecError, match=message):
        FullAttentionSpec(**{**BASE, field: value})


def test_specs_are_immutable_values():
    a = FullAttentionSpec(**BASE)
    assert a == FullAttentionSpec(**BASE)
    assert hash(a) == hash(FullAttentionSpec(**BASE))
    assert a.head_size_v == 128
    # 16 tokens x 8 heads x (128 + 128) x 2 bytes.
    assert a.page_size_bytes == 65536
    assert a.max_memory_usage_bytes(TokenLimits(max_model_len=100)) == 7 * 65536
    with pytest.raises(AttributeError):
        a.block_size = 32  # type: ignore[misc]


def test_dtypes_are_accepted_as_names_aliases_or_torch_dtypes():
    import torch

    assert FullAttentionSpec(**{**BASE, "dtype": torch.bfloat16}).dtype == "bfloat16"
    assert FullAttentionSpec(**{**BASE, "dtype": "bf16"}) == FullAttentionSpec(**BASE)
    assert dtype_name("torch.float8_e4m3fn") == "float8_e4m3fn"
    assert dtype_name("half") == "float16"
    assert dtype_size(torch.float32) == 4
    assert dtype_size("fp8") == 1


def test_token_limits_validate_and_default():
    limits = TokenLimits(max_model_len=4096)
    assert limits.batched_tokens == 4096
    assert TokenLimits(max_model_len=4096, max_num_batched_tokens=512).batched_tokens == 512
    with pytest.raises(InvalidSpecError, match=r"TokenLimits\.max_model_len must be a positive"):
        TokenLimits(max_model_len=0)


def test_config_validation():
    with pytest.raises(
        InvalidConfigError, match=r"KVCacheConfig.num_blocks must be an integer >= 1"
    ):
        kvcore.KVCacheConfig(num_blocks=0, kv_cache_groups=())
    with pytest.raises(InvalidConfigError, match=r"got the string 'layer\.0'"):
        kvcore.KVCacheGroupSpec(layer_names="layer.0", kv_cache_spec=FullAttentionSpec(**BASE))
    with pytest.raises(TypeError):
        kvcore.KVCacheGroupSpec(layer_names=["l"], kv_cache_spec="full")


def test_request_validation():
    with pytest.raises(InvalidRequestError, match="prompt_token_ids is empty"):
        Request("r", [])
    features = [
        kvcore.MultiModalFeature(identifier="b", offset=10, length=2),
        kvcore.MultiModalFeature(identifier="a", offset=0, length=2),
    ]
    with pytest.raises(InvalidRequestError, match="mm_features must be sorted by offset"):
        Request("r", list(range(20)), mm_features=features)


def test_requests_longer_than_the_model_are_refused(make_manager):
    manager = make_manager(num_blocks=20, max_model_len=64)
    too_long = Request("long", list(range(65)))
    with pytest.raises(RequestTooLongError, match=r"has 65 tokens, more than max_model_len=64"):
        manager.get_computed_blocks(too_long)
    with pytest.raises(RequestTooLongError, match="cap num_new_tokens at 64"):
        manager.allocate_slots(too_long, 65)
    assert manager.num_free_blocks == 19
    ok = Request("ok", list(range(60)))
    admit(manager, ok)
    ok.append_output_token_ids([1, 2, 3, 4])
    manager.allocate_slots(ok, 4)
    ok.num_computed_tokens = 64
    ok.append_output_token_ids(5)
    with pytest.raises(RequestTooLongError, match="65 tokens \\(64 computed \\+ 1 new\\)"):
        manager.allocate_slots(ok, 1)
    with pytest.raises(InvalidConfigError, match="max_model_len must be a positive integer"):
        make_manager(max_model_len=0)


def test_nothing_to_allocate_is_an_error(make_manager):
    manager = make_manager()
    with pytest.raises(InvalidRequestError, match="num_new_tokens must be > 0"):
        manager.allocate_slots(Request("r", [1, 2, 3]), 0)


def test_a_second_free_is_a_no_op(make_manager):
    manager = make_manager(num_blocks=20)
    request = Request("r", list(range(40)))
    manager.free(request)  # never allocated (aborted while waiting): ignored
    admit(manager, request)
    manager.free(request)
    before = snapshot(manager)
    manager.free(request)  # preempted, then aborted: nothing left to free
    assert snapshot(manager) == before
    # Preempted then re-admitted, it can be freed again.
    request.num_computed_tokens = 0
    admit(manager, request)
    manager.free(request)
    assert manager.num_free_blocks == 19


def test_hits_with_caching_disabled_are_refused(registry):
    config = kvcore.KVCacheConfig.from_specs(10, [FullAttentionSpec(**BASE)])
    manager = kvcore.KVCacheManager(config, 1024, registry=registry, enable_caching=False)
    group = manager.coordinator.managers[0]
    with pytest.raises(InvalidCacheHitError, match="prefix caching is disabled"):
        group.allocate_new_computed_blocks("r", [3], 16, 0)
    assert group.req_to_blocks == {}


def test_running_requests_cannot_adopt_new_hits(make_manager):
    manager = make_manager(num_blocks=20)
    request = Request("r", list(range(40)))
    admit(manager, request)
    group = manager.coordinator.managers[0]
    with pytest.raises(RequestStateError, match="is running; it cannot adopt new cache hits"):
        group.allocate_new_computed_blocks("r", [5], 16, 0)


def test_caching_a_config_that_can_never_be_cached_is_refused():
    from kvcore_plugins.cross_attention import CrossAttentionSpec

    cross = CrossAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    full = FullAttentionSpec(**BASE)
    alone = kvcore.KVCacheConfig.from_specs(10, [cross])
    with pytest.raises(InvalidConfigError, match="so no block could ever be reused"):
        kvcore.KVCacheManager(alone, 1024)
    mixed = kvcore.KVCacheConfig.from_specs(10, [full, cross])
    with pytest.raises(InvalidConfigError, match="the other groups' KV depends on it"):
        kvcore.KVCacheManager(mixed, 1024)
    assert kvcore.KVCacheManager(mixed, 1024, enable_caching=False).num_free_blocks == 9
