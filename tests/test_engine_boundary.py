"""The engine boundary: every bad call raises a named kvcore error and changes nothing.

Each test here reproduces a misuse an engine author can make (found by the
probes of issue 8) and checks two things: the error class and message (it
names the argument or the request and says what to do), and that the pool
and every block table are exactly as before (:func:`kvcore.testing.snapshot`).
"""

from __future__ import annotations

import pytest
from tiny_specs import full, mamba, sw

import kvcore
from kvcore import KVCacheBlocks, Request
from kvcore.errors import (
    InvalidCacheHitError,
    InvalidConfigError,
    InvalidRequestError,
    KVCoreError,
    RequestStateError,
)
from kvcore.testing import admit, check_manager_invariants, snapshot

NULL = kvcore.managers.NULL_BLOCK


@pytest.fixture(scope="module")
def builtin_registry() -> kvcore.Registry:
    return kvcore.load_registry(only=["full_attention", "sliding_window", "mamba"])


@pytest.fixture
def manager(builtin_registry) -> kvcore.KVCacheManager:
    """Full attention, block 4, 19 usable blocks, max_model_len 64."""
    config = kvcore.KVCacheConfig.from_specs(20, [full()])
    return kvcore.KVCacheManager(config, 64, registry=builtin_registry)


@pytest.fixture
def hybrid(builtin_registry) -> kvcore.KVCacheManager:
    """Full + sliding window 4 + Mamba, block 4 everywhere, 39 usable blocks."""
    config = kvcore.KVCacheConfig.from_specs(40, [full(), sw(4), mamba()])
    return kvcore.KVCacheManager(config, 64, registry=builtin_registry)


def refused(manager: kvcore.KVCacheManager, error: type[Exception], match: str, call) -> None:
    """``call`` raises ``error`` (a kvcore error) matching ``match`` and changes nothing."""
    before = snapshot(manager)
    with pytest.raises(error, match=match) as info:
        call()
    assert isinstance(info.value, KVCoreError)
    assert snapshot(manager) == before
    check_manager_invariants(manager)


# -- token counts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        # A float left the pool's counters as floats for ever.
        ({"num_new_tokens": 10.0}, r"num_new_tokens must be an integer >= 0, got 10\.0"),
        ({"num_new_tokens": True}, r"num_new_tokens must be an integer >= 0, got True"),
        # Negative new tokens returned blocks.
        ({"num_new_tokens": -3}, r"num_new_tokens must be an integer >= 0, got -3"),
        # A negative lookahead raised IndexError after taking blocks.
        ({"num_lookahead_tokens": -8}, r"num_lookahead_tokens must be an integer >= 0, got -8"),
        ({"num_lookahead_tokens": 1.5}, r"num_lookahead_tokens must be an integer >= 0"),
        # Negative external tokens allocated blocks for them.
        (
            {"num_external_computed_tokens": -4},
            r"num_external_computed_tokens must be an integer >= 0, got -4",
        ),
        ({"num_new_computed_tokens": -4}, r"num_new_computed_tokens must be an integer >= 0"),
        ({"num_encoder_tokens": -1}, r"num_encoder_tokens must be an integer >= 0, got -1"),
    ],
)
def test_bad_token_counts_are_refused_and_change_nothing(manager, kwargs, match):
    request = Request("r", list(range(10)))
    arguments = {"num_new_tokens": 10, **kwargs}
    num_new_tokens = arguments.pop("num_new_tokens")
    refused(
        manager,
        InvalidRequestError,
        match,
        lambda: manager.allocate_slots(request, num_new_tokens, **arguments),
    )
    assert type(manager.num_free_blocks) is int
    assert manager.num_free_blocks == 19


def test_numpy_integers_are_token_counts(manager):
    np = pytest.importorskip("numpy")
    request = Request("r", list(range(10)))
    blocks = manager.allocate_slots(request, np.int64(10), num_lookahead_tokens=np.int32(2))
    assert blocks.get_block_ids() == ([1, 2, 3],)
    assert type(manager.num_free_blocks) is int


def test_computed_tokens_beyond_the_request_are_refused(manager):
    """A running request's num_computed_tokens (20) is past its 10 tokens."""
    request = Request("r", list(range(10)))
    assert manager.allocate_slots(request, 8) is not None
    request.num_computed_tokens = 20
    refused(
        manager,
        InvalidRequestError,
        r"request 'r' has 10 tokens, fewer than the 20 computed \(num_computed_tokens=20 ",
        lambda: manager.allocate_slots(request, 4),
    )


def test_a_request_holding_no_blocks_with_computed_tokens_is_refused(manager):
    """Stale num_computed_tokens: its blocks would be cached with KV nobody wrote.

    A request admitted with 8 computed tokens but no hit and no external
    tokens would get blocks for its first 8 tokens that nothing ever fills,
    cached under its hashes: a later request sharing the prompt would hit
    them and read garbage. It is refused, and nothing is cached.
    """
    request = Request("r", list(range(10)))
    request.num_computed_tokens = 8
    refused(
        manager,
        InvalidRequestError,
        r"request 'r' holds no blocks but has num_computed_tokens=8.*set num_computed_tokens to 0",
        lambda: manager.allocate_slots(request, 2),
    )
    later = Request("later", list(range(10)))
    assert manager.get_computed_blocks(later)[1] == 0


def test_hit_and_external_tokens_beyond_the_request_are_refused(manager):
    request = Request("r", list(range(10)))
    refused(
        manager,
        InvalidRequestError,
        r"request 'r' has 10 tokens, fewer than the 13 computed",
        lambda: manager.allocate_slots(request, 1, num_external_computed_tokens=13),
    )


# -- cache-hit blocks ---------------------------------------------------------------------


def cached_prefix(manager: kvcore.KVCacheManager) -> tuple[Request, KVCacheBlocks, int]:
    """Admit and finish a 12-token request (blocks 1-3 cached, free), look up a new one."""
    first = Request("a", list(range(12)))
    admit(manager, first)
    manager.free(first)
    second = Request("b", [*range(12), 99])
    hit, num_hit = manager.get_computed_blocks(second)
    assert (hit.get_block_ids(), num_hit) == (([1, 2, 3],), 12)
    return second, hit, num_hit


@pytest.mark.parametrize(
    ("blocks", "match"),
    [
        # A negative id made the free queue a cycle.
        ([-1, 2, 3], r"block -1 at position 0 of group 0 is not a block of this pool"),
        ([1, 2, 99], r"block 99 at position 2 of group 0 is not a block of this pool"),
        ([1, 2.0, 3], r"block 2\.0 at position 1 of group 0 is not a block of this pool"),
        # The null block holds no KV: a full-attention table cannot start with it.
        ([NULL, 2, 3], r"position 0 of group 0 is the null block"),
        # Block 7 was never allocated: it was handed out twice.
        ([1, 2, 7], r"block 7 at position 2 of group 0 is not cached under this request's hash"),
        # Blocks in the wrong order are cached, but not for these positions.
        ([2, 1, 3], r"block 2 at position 0 of group 0 is not cached under this request's hash"),
    ],
)
def test_hit_blocks_that_are_not_the_requests_hits_are_refused(manager, blocks, match):
    request, _, num_hit = cached_prefix(manager)
    refused(
        manager,
        InvalidCacheHitError,
        match,
        lambda: manager.allocate_slots(request, 1, num_hit, KVCacheBlocks((blocks,))),
    )


def test_hits_from_another_requests_lookup_are_refused(manager):
    request, _, _ = cached_prefix(manager)
    other = Request("c", list(range(100, 112)))
    admit(manager, other)  # blocks 4-6
    manager.free(other)
    other_hit, num_other = manager.get_computed_blocks(Request("d", [*range(100, 112), 1]))
    assert other_hit.get_block_ids() == ([4, 5, 6],)
    refused(
        manager,
        InvalidCacheHitError,
        r"block 4 at position 0 of group 0 is not cached under this request's hash",
        lambda: manager.allocate_slots(request, 1, num_other, other_hit),
    )


def test_hits_gone_stale_after_eviction_are_refused(manager):
    request, hit, num_hit = cached_prefix(manager)
    # Other requests take every free block: the fresh ones, then the cached ones.
    assert manager.allocate_slots(Request("hog", list(range(500, 564))), 64) is not None
    assert manager.allocate_slots(Request("hog2", list(range(600, 612))), 12) is not None
    assert manager.num_free_blocks == 0
    refused(
        manager,
        InvalidCacheHitError,
        r"block 1 at position 0 of group 0 is not cached under this request's hash",
        lambda: manager.allocate_slots(request, 1, num_hit, hit),
    )


def test_hits_evicted_by_evict_blocks_are_refused(manager):
    request, hit, num_hit = cached_prefix(manager)
    manager.evict_blocks([2])
    refused(
        manager,
        InvalidCacheHitError,
        r"block 2 at position 1 of group 0 is not cached under this request's hash",
        lambda: manager.allocate_slots(request, 1, num_hit, hit),
    )


def test_hit_length_must_match_the_hit_blocks(manager):
    request, hit, _ = cached_prefix(manager)
    refused(
        manager,
        InvalidCacheHitError,
        r"num_new_computed_tokens=8 but group 0's 3 hit blocks of 4 tokens cover 12",
        lambda: manager.allocate_slots(request, 1, 8, hit),
    )
    refused(
        manager,
        InvalidCacheHitError,
        r"num_new_computed_tokens=12 but group 0's 0 hit blocks of 4 tokens cover 0",
        lambda: manager.allocate_slots(request, 1, 12, None),
    )


def test_hits_with_one_group_too_many_are_refused(manager):
    """The second group's hits used to raise after the first group had adopted its own."""
    request, hit, num_hit = cached_prefix(manager)
    refused(
        manager,
        InvalidCacheHitError,
        r"new_computed_blocks has 2 groups, this manager has 1",
        lambda: manager.allocate_slots(
            request, 1, num_hit, KVCacheBlocks((hit.blocks[0], [4, 5, 6]))
        ),
    )


def test_hits_with_caching_disabled_are_refused(builtin_registry):
    config = kvcore.KVCacheConfig.from_specs(20, [full()])
    manager = kvcore.KVCacheManager(config, 64, registry=builtin_registry, enable_caching=False)
    refused(
        manager,
        InvalidCacheHitError,
        r"cache-hit blocks were given, but prefix caching is disabled",
        lambda: manager.allocate_slots(
            Request("r", list(range(9))), 1, 8, KVCacheBlocks(([1, 2],))
        ),
    )


def test_hybrid_hits_are_checked_in_every_group(hybrid):
    first = Request("a", list(range(12)))
    admit(hybrid, first)
    hybrid.free(first)
    request = Request("b", [*range(12), 7])
    hit, num_hit = hybrid.get_computed_blocks(request)
    # Full: 3 blocks; window 4: only the last block; Mamba: the state after 12 tokens.
    assert hit.get_block_ids() == ([1, 2, 3], [NULL, NULL, 6], [NULL, NULL, 9])
    bad = KVCacheBlocks((hit.blocks[0], [NULL, NULL, 5], hit.blocks[2]))
    refused(
        hybrid,
        InvalidCacheHitError,
        r"block 5 at position 2 of group 1 is not cached under this request's hash",
        lambda: hybrid.allocate_slots(request, 1, num_hit, bad),
    )
    # Blocks the window no longer needs are never adopted: they are not checked.
    skipped = KVCacheBlocks((hit.blocks[0], [123, 456, 6], hit.blocks[2]))
    assert hybrid.allocate_slots(request, 1, num_hit, skipped) is not None
    assert hybrid.get_block_ids("b") == ([1, 2, 3, 10], [NULL, NULL, 6, 11], [NULL, NULL, 9, 12])
    check_manager_invariants(hybrid)


# -- request identity and state ---------------------------------------------------------


def test_a_second_request_with_a_live_id_is_refused(manager):
    """It used to share the first request's block table."""
    admit(manager, Request("a", list(range(12))))
    impostor = Request("a", list(range(50, 62)))
    refused(
        manager,
        RequestStateError,
        r"another Request object with id 'a' holds blocks",
        lambda: manager.allocate_slots(impostor, 12),
    )


def test_free_on_the_wrong_manager_is_refused(manager, builtin_registry):
    """It used to mark the request freed, so its own manager then refused to free it."""
    other = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(20, [full()]), 64, registry=builtin_registry
    )
    request = Request("a", list(range(12)))
    admit(manager, request)
    refused(
        other,
        RequestStateError,
        r"request 'a' holds blocks of another KVCacheManager",
        lambda: other.free(request),
    )
    assert manager.num_free_blocks == 16
    manager.free(request)
    assert manager.num_free_blocks == 19


def test_a_request_allocated_by_another_manager_is_refused(manager, builtin_registry):
    other = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(20, [full()]), 64, registry=builtin_registry
    )
    request = Request("a", list(range(12)))
    admit(manager, request)
    request.append_output_token_ids(1)
    refused(
        other,
        RequestStateError,
        r"request 'a' holds blocks of another KVCacheManager",
        lambda: other.allocate_slots(request, 1),
    )


def test_a_running_request_cannot_adopt_hits_and_nothing_is_freed_first(hybrid):
    """Hit tokens for a running request used to free its window and Mamba state, then raise."""
    first = Request("a", list(range(12)))
    admit(hybrid, first)
    running = Request("r", list(range(12)))
    admit(hybrid, running)
    running.append_output_token_ids(5)
    hit = KVCacheBlocks(([1], [NULL], [NULL]))
    refused(
        hybrid,
        RequestStateError,
        r"request 'r' already holds blocks; cache hits .* are adopted once, when it is admitted",
        lambda: hybrid.allocate_slots(running, 1, 4, hit),
    )
    refused(
        hybrid,
        RequestStateError,
        r"request 'r' already holds blocks; .*external",
        lambda: hybrid.allocate_slots(running, 1, num_external_computed_tokens=4),
    )


def test_freeing_a_request_that_holds_no_blocks_is_a_no_op(manager):
    """vLLM frees an aborted waiting request, even one already freed by a preemption."""
    request = Request("r", list(range(12)))
    manager.free(request)  # never allocated
    admit(manager, request)
    manager.free(request)  # preempted
    before = snapshot(manager)
    manager.free(request)  # then aborted while waiting
    assert snapshot(manager) == before
    assert manager.num_free_blocks == 19


def test_a_block_freed_below_zero_is_still_an_error():
    pool = kvcore.managers.BlockPool(5)
    pool.get_new_blocks(1)
    pool.free_blocks([1])
    with pytest.raises(kvcore.errors.DoubleFreeError, match="block 1 was freed more often"):
        pool.free_blocks([1])


def test_remove_skipped_blocks_with_an_absurd_count_is_refused(hybrid):
    """A count past the request's slots used to free its live window and Mamba state."""
    request = Request("a", list(range(12)))
    admit(hybrid, request)
    refused(
        hybrid,
        InvalidRequestError,
        r"total_computed_tokens=1000000000 is more than the 12 tokens request 'a' has slots",
        lambda: hybrid.remove_skipped_blocks("a", 10**9),
    )
    refused(
        hybrid,
        InvalidRequestError,
        r"total_computed_tokens must be an integer >= 0, got -1",
        lambda: hybrid.remove_skipped_blocks("a", -1),
    )
    hybrid.remove_skipped_blocks("nobody", 12)  # a request holding no blocks: nothing to free


def test_remove_skipped_blocks_takes_the_token_count_vllm_passes_at_finish(hybrid):
    """vLLM 0.14 passes ``request.num_tokens`` when a finished request meets a connector.

    12 prompt tokens (block 4: 3 blocks per group, 12 slots), then the sampled
    token 13, which has no slot. Window 4 at 13 computed tokens: tokens 0-9
    are skipped (13 - 4 + 1), so blocks 0 and 1; Mamba keeps only the state
    after the last token: 12 skipped, blocks 0-2. Full attention keeps all.
    """
    request = Request("a", list(range(12)))
    admit(hybrid, request)
    request.num_computed_tokens = 12
    request.append_output_token_ids(99)
    full_table, sw_table, mamba_table = hybrid.get_block_ids("a")
    hybrid.remove_skipped_blocks("a", 13)
    assert hybrid.get_block_ids("a") == (full_table, [NULL, NULL, sw_table[2]], [NULL] * 3)
    check_manager_invariants(hybrid)
    # Past both the slots and the tokens it is still refused.
    refused(
        hybrid,
        InvalidRequestError,
        r"total_computed_tokens=14 is more than the 12 tokens request 'a' has slots for",
        lambda: hybrid.remove_skipped_blocks("a", 14),
    )


def test_cache_blocks_past_the_requests_tokens_is_a_request_error(manager):
    """It raised InvalidConfigError ("missing hashes") after caching nothing."""
    request = Request("a", list(range(12)))
    assert manager.allocate_slots(request, 12, delay_cache_blocks=True) is not None
    refused(
        manager,
        InvalidRequestError,
        r"num_computed_tokens=20 is more than request 'a''s 12 tokens",
        lambda: manager.cache_blocks(request, 20),
    )
    manager.cache_blocks(request, 12)
    assert [manager.block_pool.block_hash(b) is not None for b in (1, 2, 3)] == [True] * 3


def test_cache_blocks_of_a_request_holding_no_blocks_is_refused(manager):
    refused(
        manager,
        RequestStateError,
        r"request 'a' holds no blocks of this manager",
        lambda: manager.cache_blocks(Request("a", list(range(12))), 8),
    )


# -- token ids ------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sha256", "fast"])
@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (1.0, r"token id at position 5 is 1\.0, not an integer"),
        ("7", r"token id at position 5 is '7', not an integer"),
        (2**63, r"token id at position 5 is 9223372036854775808, outside the signed 64-bit"),
        (-(2**63) - 1, r"token id at position 5 is -9223372036854775809, outside the signed"),
    ],
)
def test_token_ids_must_be_64_bit_integers(builtin_registry, algorithm, bad, match):
    """sha256 raised a raw struct.error; the fast hash made 1 and 1.0 one token."""
    config = kvcore.KVCacheConfig.from_specs(20, [full()])
    manager = kvcore.KVCacheManager(config, 64, registry=builtin_registry, hash_algorithm=algorithm)
    tokens = [1, 2, 3, 4, 5, bad, 7, 8, 9]
    request = Request("r", tokens)
    refused(manager, InvalidRequestError, f"request 'r': {match}", lambda: admit(manager, request))


def test_a_bad_output_token_is_refused_before_anything_is_allocated(manager):
    request = Request("r", list(range(7)))
    admit(manager, request)
    with pytest.raises(InvalidRequestError, match=r"token_ids must be an integer or an iterable"):
        request.append_output_token_ids(0.5)
    request.append_output_token_ids([0.5])
    refused(
        manager,
        InvalidRequestError,
        r"token id at position 7 is 0\.5",
        lambda: manager.allocate_slots(request, 1),
    )


def test_booleans_and_numpy_integers_are_their_integer_value(manager):
    np = pytest.importorskip("numpy")
    admit(manager, Request("a", [1, 0, 1, 1, 5]))
    assert manager.get_computed_blocks(Request("b", [True, False, 1, True, 6]))[1] == 4
    assert manager.get_computed_blocks(Request("c", [np.int64(1), 0, 1, 1, 6]))[1] == 4


# -- error classes --------------------------------------------------------------------------


def test_request_problems_are_request_errors():
    with pytest.raises(InvalidRequestError, match="prompt_token_ids is empty"):
        Request("r", [])
    features = [
        kvcore.MultiModalFeature(identifier="b", offset=10, length=2),
        kvcore.MultiModalFeature(identifier="a", offset=0, length=2),
    ]
    with pytest.raises(InvalidRequestError, match="mm_features must be sorted by offset"):
        Request("r", list(range(20)), mm_features=features)


def test_a_bad_max_model_len_is_a_config_error(builtin_registry):
    config = kvcore.KVCacheConfig.from_specs(20, [full()])
    with pytest.raises(InvalidConfigError, match="max_model_len must be a positive integer") as e:
        kvcore.KVCacheManager(config, 0, registry=builtin_registry)
    assert not isinstance(e.value, InvalidRequestError)


def test_a_request_hashed_by_another_manager_is_a_request_error(builtin_registry):
    small = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(20, [full(4)]), 64, registry=builtin_registry
    )
    large = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(20, [full(8)]), 64, registry=builtin_registry
    )
    request = Request("r", list(range(20)))
    small.get_computed_blocks(request)
    with pytest.raises(RequestStateError, match="a Request belongs to one KVCacheManager"):
        large.get_computed_blocks(request)


def test_an_absurd_skip_count_is_refused_without_windowed_groups_too(manager):
    """Found by the million-step state machine: full attention alone skipped the check."""
    request = Request("a", list(range(12)))
    admit(manager, request)
    refused(
        manager,
        InvalidRequestError,
        r"total_computed_tokens=13 is more than the 12 tokens request 'a' has slots for",
        lambda: manager.remove_skipped_blocks("a", 13),
    )
    manager.remove_skipped_blocks("a", 12)  # nothing to free, and nothing wrong


def test_a_null_block_passes_where_the_type_does_not_read(builtin_registry):
    """Sinks plus a window (the streaming example): the gap between them is null in a hit.

    Block 4, 4 sink tokens, window 8. A 32-token prompt cached; the same
    prompt + 1 token hits 32 tokens: the query at 32 reads tokens 0-3 (block
    0) and 25-31 (blocks 6-7); blocks 1-5 are null. A null block where the
    query reads (block 6) is refused, naming the type's rule.
    """
    streaming = pytest.importorskip("kvcore_streaming")
    spec = streaming.StreamingSpec(
        block_size=4,
        num_kv_heads=1,
        head_size=1,
        dtype="float32",
        sink_tokens=4,
        sliding_window=8,
    )
    registry = kvcore.registry.registry_from_layer_types(
        [kvcore.LayerType(streaming.StreamingSpec, streaming.StreamingManager)]
    )
    manager = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(30, [spec]), 64, registry=registry
    )
    first = Request("a", list(range(32)))
    admit(manager, first)
    manager.free(first)
    request = Request("b", [*range(32), 7])
    hit, num_hit = manager.get_computed_blocks(request)
    assert (hit.get_block_ids(), num_hit) == (([1, 0, 0, 0, 0, 0, 7, 8],), 32)
    bad = KVCacheBlocks(([1, 0, 0, 0, 0, 0, 0, 8],))
    refused(
        manager,
        InvalidCacheHitError,
        r"position 6 of group 0 is the null block, but the group reads those tokens",
        lambda: manager.allocate_slots(request, 1, num_hit, bad),
    )
    assert manager.allocate_slots(request, 1, num_hit, hit) is not None
    check_manager_invariants(manager)
