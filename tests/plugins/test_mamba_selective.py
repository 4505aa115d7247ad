"""Selective prefill states (``MambaSpec.prefill_states="selective"``).

Expected tables are worked out by hand from the rule in the Mamba manager's
docstring: inside the prompt a prefill keeps a state only at the prompt's
last block boundary and at the deepest boundary an earlier prompt also
crossed; every other boundary it crosses gets the null block. Fresh blocks
come out of the pool in id order (1, 2, ...), group 0 (full attention)
before group 1 (Mamba).
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvplugin_helpers import NULL, full, make_manager, mamba, tokens

import kvcore
from kvcore.errors import InvalidSpecError
from kvcore.specs import TokenLimits
from kvcore.testing import admit, check_manager_invariants, snapshot
from kvcore_plugins.mamba import MambaManager
from kvcore_plugins.mamba.crossed import CrossedBoundaries


def selective(block_size: int = 4) -> kvcore.specs.KVCacheSpec:
    return attrs.evolve(mamba(block_size), prefill_states="selective")


def _mamba_group(manager: kvcore.KVCacheManager) -> MambaManager:
    (group,) = [m for m in manager.coordinator.managers if isinstance(m, MambaManager)]
    return group


# A: 22 tokens = boundaries after 4, 8, 12, 16, 20 (positions 0-4) and a
# running state in position 5. B shares A's first 12 tokens, C shares them too.
PROMPT_A = tokens((1, 12), (2, 10))
PROMPT_B = tokens((1, 12), (3, 6))
PROMPT_C = tokens((1, 12), (4, 9))


def test_a_prefill_keeps_only_the_prompts_last_boundary():
    """22 tokens at block 4: positions 0-3 null, 4 (after 20 tokens) kept, 5 running.

    Full attention takes blocks 1-6, Mamba 7 and 8: 8 blocks instead of 12.
    The kept state is cached: a prompt extending A hits its 20 tokens.
    """
    manager = make_manager([full(4), selective(4)], 40)
    free_before = manager.block_pool.get_num_free_blocks()
    a = kvcore.Request("a", PROMPT_A)
    admit(manager, a)
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [NULL] * 4 + [7, 8])
    assert free_before - manager.block_pool.get_num_free_blocks() == 8
    check_manager_invariants(manager)
    hit, num_hit = manager.get_computed_blocks(kvcore.Request("a2", PROMPT_A + [5] * 6))
    assert (num_hit, hit.blocks) == (20, ([1, 2, 3, 4, 5], [NULL] * 4 + [7]))


def test_every_keeps_each_boundary_it_crosses():
    """The reference rule on the same prompt: Mamba takes one block per position (7-12)."""
    manager = make_manager([full(4), mamba(4)], 40)
    admit(manager, kvcore.Request("a", PROMPT_A))
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    hit, num_hit = manager.get_computed_blocks(kvcore.Request("b", PROMPT_B))
    assert (num_hit, hit.blocks) == (12, ([1, 2, 3], [NULL, NULL, 9]))


def test_the_boundary_where_two_prompts_diverge_is_kept_for_the_third():
    """B shares 12 tokens with A, whose state there was not kept: B misses.

    B (18 tokens, positions 0-3 full, running state in 4) crossed positions
    0-2 that A crossed too: the deepest, 2 (12 tokens), is kept, as is its
    last boundary 3 (16 tokens). Full takes 9-13, Mamba 14-16. C then hits
    the 12 shared tokens on B's state.
    """
    manager = make_manager([full(4), selective(4)], 40)
    admit(manager, kvcore.Request("a", PROMPT_A))
    b = kvcore.Request("b", PROMPT_B)
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 0
    admit(manager, b)
    assert manager.get_block_ids("b") == ([9, 10, 11, 12, 13], [NULL, NULL, 14, 15, 16])
    check_manager_invariants(manager)
    hit, num_hit = manager.get_computed_blocks(kvcore.Request("c", PROMPT_C))
    assert (num_hit, hit.blocks) == (12, ([1, 2, 3], [NULL, NULL, 14]))


def test_decode_and_chunked_prefill_keep_their_states():
    """Positions past the prompt and each chunk's running state are kept as under ``every``.

    A's 22 tokens in chunks of 10 and 12. Chunk 1 (10 tokens): positions
    0-1 full, running state in 2; nothing was crossed before and the
    prompt's last boundary (4) lies ahead: 0 and 1 null, Mamba takes 4
    (full takes 1-3). Chunk 2 (10 computed, to 22): only 9 tokens are
    skipped, so position 2 (the state chunk 2 starts from) stays; 3 null,
    4 kept, 5 running: full 5-7, Mamba 8 and 9. The first decode step
    frees 4 and 8 (skipped 21 tokens: positions 0-4). At 25 tokens a
    seventh position is needed in both groups, past the prompt: fresh
    blocks 10 (full) and 11 (Mamba).
    """
    manager = make_manager([full(4), selective(4)], 40)
    a = kvcore.Request("a", PROMPT_A)
    assert manager.allocate_slots(a, 10) is not None
    a.num_computed_tokens = 10
    assert manager.get_block_ids("a") == ([1, 2, 3], [NULL, NULL, 4])
    assert manager.allocate_slots(a, 12) is not None
    a.num_computed_tokens = 22
    assert manager.get_block_ids("a") == ([1, 2, 3, 5, 6, 7], [NULL, NULL, 4, NULL, 8, 9])
    for token in range(3):
        a.append_output_token_ids(token)
        assert manager.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    assert manager.get_block_ids("a") == ([1, 2, 3, 5, 6, 7, 10], [NULL] * 5 + [9, 11])
    check_manager_invariants(manager)


def test_a_failed_allocation_forgets_the_request_and_the_crossed_boundaries():
    """An error after the tables changed undoes the crossed set and the request map too."""
    manager = make_manager([full(4), selective(4)], 40)
    group = _mamba_group(manager)
    a = kvcore.Request("a", PROMPT_A)
    before = snapshot(manager)
    original = group.cache_blocks

    def cache_then_raise(request: kvcore.Request, num_tokens: int) -> None:
        original(request, num_tokens)
        assert len(group._crossed) == 5
        raise RuntimeError("injected after caching")

    group.cache_blocks = cache_then_raise  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="injected"):
        manager.allocate_slots(a, 22)
    assert snapshot(manager) == before
    assert len(group._crossed) == 0
    assert group._requests == {}


def test_freeing_a_request_forgets_it():
    manager = make_manager([full(4), selective(4)], 40)
    group = _mamba_group(manager)
    a = kvcore.Request("a", PROMPT_A)
    admit(manager, a)
    assert group._requests == {"a": a}
    manager.free(a)
    assert group._requests == {}
    assert manager.block_pool.get_num_free_blocks() == 39
    check_manager_invariants(manager)


def test_only_a_cached_align_group_is_selective():
    """Prefix caching off, the group has nothing to keep: it allocates every block."""
    manager = make_manager([full(4), selective(4)], 40, enable_caching=False)
    assert not _mamba_group(manager).selective
    assert manager.coordinator.watching == ()
    admit(manager, kvcore.Request("a", PROMPT_A))
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])


# -- the spec ----------------------------------------------------------------------------------


def test_an_unknown_prefill_states_value_is_refused():
    with pytest.raises(InvalidSpecError, match="prefill_states must be 'every'"):
        attrs.evolve(mamba(4), prefill_states="some")


def test_selective_states_share_no_table_with_every():
    assert selective(4).uniform_type_key != mamba(4).uniform_type_key


def test_a_selective_step_holds_at_most_four_states():
    """64 tokens a step at block 4: 17 slots under ``every``, 4 under ``selective``."""
    limits = TokenLimits(max_model_len=1024, max_num_batched_tokens=64)
    page = mamba(4).page_size_bytes
    assert mamba(4).max_memory_usage_bytes(limits) == 17 * page
    assert selective(4).max_memory_usage_bytes(limits) == 4 * page


# -- the crossed boundaries ----------------------------------------------------------------------


class _Journal:
    def __init__(self) -> None:
        self.steps: list[tuple[object, tuple[object, ...]]] = []

    def record(self, undo: object, *arguments: object) -> None:
        self.steps.append((undo, arguments))

    def roll_back(self) -> None:
        for undo, arguments in reversed(self.steps):
            undo(*arguments)  # type: ignore[operator]
        self.steps.clear()


def test_the_oldest_boundary_is_forgotten_first():
    crossed = CrossedBoundaries(3)
    journal = _Journal()
    crossed.add(["a", "b"], journal.record)
    crossed.add(["b", "c", "d"], journal.record)
    assert [h in crossed for h in "abcd"] == [False, True, True, True]
    assert len(crossed) == 3


@pytest.mark.parametrize("capacity", [0, -1, 2.5, "3"])
def test_the_capacity_must_be_a_positive_integer(capacity):
    with pytest.raises(ValueError, match="capacity must be an integer >= 1"):
        CrossedBoundaries(capacity)


@given(
    capacity=st.integers(1, 6),
    before=st.lists(st.lists(st.integers(0, 9), max_size=5), max_size=4),
    batch=st.lists(st.integers(0, 9), max_size=8),
)
def test_an_undone_add_restores_the_boundaries_and_their_order(capacity, before, batch):
    crossed = CrossedBoundaries(capacity)
    ignored = _Journal()
    for hashes in before:
        crossed.add(hashes, ignored.record)
    remembered = list(crossed._order)
    journal = _Journal()
    crossed.add(batch, journal.record)
    assert len(crossed) <= capacity
    journal.roll_back()
    assert list(crossed._order) == remembered
