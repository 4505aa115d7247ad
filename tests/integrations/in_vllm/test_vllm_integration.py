"""The pieces of kvcore.integrations.vllm, each against vLLM 0.14's own classes."""

from __future__ import annotations

import pytest
from vllm_env import require_vllm

require_vllm()

import lockstep  # noqa: E402
import torch  # noqa: E402
from vllm.config import SchedulerConfig  # noqa: E402
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored  # noqa: E402
from vllm.v1 import kv_cache_interface as vkv  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as VLLMKVCacheManager  # noqa: E402
from vllm.v1.metrics.stats import PrefixCacheStats  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

import kvcore  # noqa: E402
from kvcore.errors import InvalidConfigError, InvalidSpecError  # noqa: E402
from kvcore.integrations import vllm as integration  # noqa: E402

ATTENTION = {"block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype": torch.bfloat16}
VLLM_SPECS = {
    "full_attention": vkv.FullAttentionSpec(**ATTENTION),
    "mla": vkv.MLAAttentionSpec(**{**ATTENTION, "num_kv_heads": 1, "head_size": 576}),
    "sink_full_attention": vkv.SinkFullAttentionSpec(**ATTENTION, sink_len=32),
    "sliding_window": vkv.SlidingWindowSpec(**ATTENTION, sliding_window=128),
    "chunked_local": vkv.ChunkedLocalAttentionSpec(**ATTENTION, attention_chunk_size=256),
    "cross_attention": vkv.CrossAttentionSpec(**ATTENTION),
    "mamba": vkv.MambaSpec(
        block_size=16, shapes=((3, 128), (8, 16, 64)), dtypes=(torch.bfloat16, torch.float32)
    ),
}


@pytest.mark.parametrize("kind", list(VLLM_SPECS))
def test_every_vllm_spec_type_converts_with_vllms_page_size(kind):
    spec = VLLM_SPECS[kind]
    converted = integration.kv_cache_spec_from_vllm(spec)
    assert converted.kind == kind
    assert converted.block_size == spec.block_size
    # vLLM's own page size is the independent check of every field that sizes it.
    assert converted.page_size_bytes == spec.page_size_bytes


def test_a_padded_page_and_a_local_layer_allocated_as_full_attention():
    padded = vkv.FullAttentionSpec(**ATTENTION, page_size_padded=8192 * 4)
    assert integration.kv_cache_spec_from_vllm(padded).page_size_bytes == padded.page_size_bytes
    local = vkv.FullAttentionSpec(**ATTENTION, sliding_window=64)
    converted = integration.kv_cache_spec_from_vllm(local)
    assert converted.kind == "full_attention"
    assert converted.compute_spec.kind == "sliding_window"
    assert converted.compute_spec.sliding_window == 64


def test_mamba_follows_prefix_caching():
    mamba = VLLM_SPECS["mamba"]
    assert integration.kv_cache_spec_from_vllm(mamba).mamba_cache_mode == "align"
    off = integration.kv_cache_spec_from_vllm(mamba, enable_caching=False)
    assert off.mamba_cache_mode == "none"


def test_a_config_keeps_blocks_groups_and_per_layer_specs():
    uniform = vkv.UniformTypeKVCacheSpecs(
        block_size=16,
        kv_cache_specs={
            "a": vkv.FullAttentionSpec(**ATTENTION),
            "b": vkv.FullAttentionSpec(**{**ATTENTION, "head_size": 128}),
        },
    )
    config = vkv.KVCacheConfig(
        num_blocks=100,
        kv_cache_tensors=[],
        kv_cache_groups=[
            vkv.KVCacheGroupSpec(["a", "b"], uniform),
            vkv.KVCacheGroupSpec(["c"], VLLM_SPECS["sliding_window"]),
        ],
    )
    converted = integration.kv_cache_config_from_vllm(config)
    assert converted.num_blocks == 100
    first, second = converted.kv_cache_groups
    assert first.layer_names == ("a", "b")
    assert [s.head_size for s in first.layer_specs] == [64, 128]
    assert first.bytes_per_block == uniform.page_size_bytes
    assert second.kv_cache_spec.sliding_window == 128


def test_specs_kvcore_cannot_serve_are_refused_naming_the_group():
    encoder_only = vkv.EncoderOnlyAttentionSpec(**ATTENTION)
    config = vkv.KVCacheConfig(
        num_blocks=10,
        kv_cache_tensors=[],
        kv_cache_groups=[
            vkv.KVCacheGroupSpec(["a"], VLLM_SPECS["full_attention"]),
            vkv.KVCacheGroupSpec(["b"], encoder_only),
        ],
    )
    with pytest.raises(
        InvalidSpecError, match=r"kv_cache_groups\[1\]: vLLM EncoderOnlyAttentionSpec"
    ):
        integration.kv_cache_config_from_vllm(config)
    with pytest.raises(InvalidSpecError, match=r"is not a spec of vllm\.v1\.kv_cache_interface"):
        integration.kv_cache_spec_from_vllm(kvcore.KVCacheConfig)
    with pytest.raises(kvcore.errors.UnknownSpecError, match="'mamba' attention type"):
        integration.kv_cache_spec_from_vllm(
            VLLM_SPECS["mamba"], registry=kvcore.load_registry(only=["full_attention"])
        )


def test_the_configuration_line_loads_the_scheduler():
    config = SchedulerConfig(
        scheduler_cls="kvcore.integrations.vllm.KVCoreScheduler",
        max_model_len=4096,
        is_encoder_decoder=False,
    )
    assert config.get_scheduler_cls() is integration.KVCoreScheduler


def test_unsupported_versions_are_refused():
    assert integration.check_vllm_version("0.14.1") == "0.14.1"
    with pytest.raises(integration.UnsupportedVLLMError, match=r"vLLM 0\.15\.0 is installed"):
        integration.check_vllm_version("0.15.0")


def make_manager(setup: lockstep.Setup, **kwargs):
    config = lockstep.kv_cache_config(setup.num_blocks, setup.specs)
    options = {"hash_block_size": 16, "enable_caching": True, "log_stats": True, **kwargs}
    return integration.KVCoreKVCacheManager(config, 4096, **options), VLLMKVCacheManager(
        config, 4096, **options
    )


def admit(manager, request) -> None:
    hit, num_hit = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - num_hit, num_hit, hit) is not None
    request.num_computed_tokens = request.num_tokens


def trace_request(request_id: str, tokens: list[int]):
    return lockstep.vllm_request(lockstep.TraceRequest(request_id, tuple(tokens), 8), 16)


def test_statistics_and_events_are_vllms_classes_with_vllms_values():
    setup = lockstep.Setup(specs=(lockstep.full_spec(16),), num_blocks=20)
    ours, theirs = make_manager(setup, enable_kv_cache_events=True)
    for manager in (ours, theirs):
        admit(manager, trace_request("a", list(range(40))))
        resumed = trace_request("b", list(range(36)))
        resumed.num_preemptions = 1
        admit(manager, resumed)
        manager.free(resumed)
    stats = ours.make_prefix_cache_stats()
    assert isinstance(stats, PrefixCacheStats)
    assert stats == theirs.make_prefix_cache_stats()
    assert (stats.requests, stats.preempted_requests, stats.preempted_hits) == (1, 1, 32)
    events, expected = ours.take_events(), theirs.take_events()
    assert [type(e) for e in events] == [type(e) for e in expected] == [BlockStored]
    # Hash values differ (kvcore encodes canonically); everything else is vLLM's.
    for event, reference in zip(events, expected, strict=True):
        assert len(event.block_hashes) == len(reference.block_hashes) == 2
        assert (event.token_ids, event.block_size, event.medium) == (
            reference.token_ids,
            reference.block_size,
            reference.medium,
        )
        assert all(isinstance(h, int) for h in event.block_hashes)
    assert ours.reset_prefix_cache() is False  # "a" holds blocks
    assert isinstance(integration.vllm_event(kvcore.events.AllBlocksCleared()), AllBlocksCleared)
    removed = integration.vllm_event(kvcore.events.BlockRemoved(block_hashes=[7]))
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == [7]


def test_the_copy_follows_the_request_and_goes_only_when_a_finished_request_is_freed():
    setup = lockstep.Setup(specs=(lockstep.full_spec(16),), num_blocks=20)
    ours, _ = make_manager(setup)
    request = trace_request("a", list(range(20)))
    admit(ours, request)
    copy = ours.requests.get("a")
    request.append_output_token_ids([7, 8])
    assert ours.allocate_slots(request, 1) is not None
    assert copy.all_token_ids == [*range(20), 7, 8]
    assert copy.num_computed_tokens == 20
    request.status = RequestStatus.PREEMPTED
    ours.free(request)  # preempted: the copy (and its hashes) stays
    assert ours.requests.get("a") is copy
    assert ours.get_block_ids("a") == ([],)
    request.num_preemptions = 1
    request.num_computed_tokens = 0
    hit, num_hit = ours.get_computed_blocks(request)
    assert num_hit == 16  # its own first block, still cached
    assert copy.num_preemptions == 1
    request.status = RequestStatus.FINISHED_ABORTED
    ours.free(request)
    assert "a" not in ours.requests


def test_unserved_settings_are_refused():
    setup = lockstep.Setup(specs=(lockstep.full_spec(16),), num_blocks=20)
    with pytest.raises(InvalidConfigError, match=r"context parallelism \(dcp_world_size=2"):
        make_manager(setup, dcp_world_size=2)
    with pytest.raises(InvalidConfigError, match="prefix_caching_hash_algo 'md5' is unknown"):
        integration.KVCoreKVCacheManager(
            lockstep.kv_cache_config(20, setup.specs), 4096, 16, hash_algorithm="md5"
        )


def test_a_hit_with_external_tokens_never_hands_one_block_to_two_groups():
    """kvcore's documented difference, on the case vLLM 0.14 gets wrong.

    Full attention + a window of 8, block 4, 12 usable blocks. Request "1"
    (16 tokens: 4 blocks a group) and then "3" (8 other tokens: 2 a group)
    are admitted and freed, so the free queue is 1's full-attention blocks
    tail first, 1's window blocks tail first, then 3's. Request "2" (1's 16
    tokens + 8) hits 16 tokens and loads 4 more from a connector. vLLM adopts
    group by group: the full-attention group touches its hit, then takes the
    block for the external tokens from the head of the queue, which is 1's
    last window block, the one block of the window group's hit it keeps (the
    window at 20 tokens skips 3 blocks); the window group then adopts that
    block too. kvcore takes every group's hit first, so the external block is
    one no group hits.
    """
    specs = (lockstep.full_spec(4), lockstep.window_spec(4, 8))
    setup = lockstep.Setup(specs=specs, num_blocks=13)
    config = lockstep.kv_cache_config(setup.num_blocks, setup.specs)
    options = {"hash_block_size": 4, "enable_caching": True}
    managers = {
        "vllm": VLLMKVCacheManager(config, 64, **options),
        "kvcore": integration.KVCoreKVCacheManager(config, 64, **options),
    }
    tables = {}
    for name, manager in managers.items():
        first = lockstep.vllm_request(lockstep.TraceRequest("1", tuple(range(16)), 4), 4)
        other = lockstep.vllm_request(lockstep.TraceRequest("3", tuple(range(100, 108)), 4), 4)
        for request in (first, other):
            admit(manager, request)
        for request in (first, other):
            request.status = RequestStatus.FINISHED_STOPPED
            manager.free(request)
        second = lockstep.vllm_request(lockstep.TraceRequest("2", tuple(range(24)), 4), 4)
        hit, num_hit = manager.get_computed_blocks(second)
        assert num_hit == 16
        blocks = manager.allocate_slots(second, 4, num_hit, hit, num_external_computed_tokens=4)
        assert blocks is not None
        tables[name] = manager.get_block_ids("2")
    (v_full, v_window), (k_full, k_window) = tables["vllm"], tables["kvcore"]
    hit_full, external = v_full[:4], v_full[4]
    # vLLM: the external block is the window group's last hit block, held twice.
    assert external == v_window[3] != 0
    # kvcore: the same hits in both groups, the external block hit by no group.
    assert k_full[:4] == hit_full
    assert k_window[:4] == v_window[:4]
    assert k_full[4] not in k_window
    assert k_full[4] not in hit_full
    assert len(k_full) == len(v_full)
    assert len(k_window) == len(v_window)


def test_eagle_on_one_group_hits_one_block_more_on_a_block_aligned_prompt():
    """kvcore's other documented difference, worked by hand (block 16).

    "1" (40 tokens) caches two blocks (tokens 0-31). "2" is those 32 tokens:
    vLLM 0.14 looks up at most 31 tokens (one block) and EAGLE drops it: no
    hit. kvcore looks one block past the limit (two blocks) and drops one:
    16 tokens. A prompt that is not block-aligned hits the same on both.
    """
    setup = lockstep.Setup(specs=(lockstep.full_spec(16),), num_blocks=20)
    ours, theirs = make_manager(setup, use_eagle=True)
    hits = {}
    for name, manager in (("kvcore", ours), ("vllm", theirs)):
        admit(manager, trace_request("1", list(range(40))))
        aligned = manager.get_computed_blocks(trace_request("2", list(range(32))))[1]
        unaligned = manager.get_computed_blocks(trace_request("3", list(range(33))))[1]
        hits[name] = (aligned, unaligned)
    assert hits == {"vllm": (0, 16), "kvcore": (16, 16)}
