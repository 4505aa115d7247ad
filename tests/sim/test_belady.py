"""The offline optimum: the oracle's knowledge of the future and the order it evicts in."""

from __future__ import annotations

from simhelpers import explicit

import kvcore
from kvcore import Request
from kvcore._hashing import BlockHasher
from kvcore._sim import SimulationOptions, load_workload, simulate
from kvcore._sim.belady import NEVER, BeladyPolicy, FutureUses
from kvcore._sim.ceiling import prefix_reuse_hits
from kvcore.eviction import GroupInfo
from kvcore.testing import admit
from kvcore_plugins.full_attention import FullAttentionSpec

A = list(range(100, 108))  # two blocks of 4
B = list(range(200, 208))
C = list(range(300, 308))


def hashes(tokens):
    request = Request("h", tokens)
    BlockHasher(4, "fast").update(request)
    return request.block_hashes


def test_future_uses_are_the_blocks_each_unbounded_hit_reads():
    requests = [
        explicit("r0", [*A, 1], 1),
        explicit("r1", [*A, 2], 1),
        explicit("r2", [*B, 3], 1),
        explicit("r3", [*A, 4], 1),
    ]
    hits = prefix_reuse_hits(requests, 4)
    assert hits == [0, 8, 0, 8]
    groups = (
        GroupInfo(block_size=4),  # reads the whole prefix
        GroupInfo(block_size=4, tokens_read=lambda e: (range(e - 1, e),)),  # one state
    )
    uses = FutureUses(requests, hits, groups, 4, "fast")
    first, second = hashes(A)
    # Before any lookup: both prefix blocks are read first by r1.
    assert [uses.next_use(0, first), uses.next_use(0, second)] == [1, 1]
    # The state group reads only the block ending at the hit (token 8).
    assert [uses.next_use(1, first), uses.next_use(1, second)] == [NEVER, 1]
    uses.now = 1
    assert uses.next_use(0, first) == 3
    uses.now = 3
    assert uses.next_use(0, first) == NEVER
    assert uses.next_use(0, hashes(B)[0]) == NEVER


def test_belady_evicts_the_block_used_farthest_in_the_future():
    # Six usable blocks, three per request (two full, one partial): A, B, C, A.
    # LRU takes A's blocks for C (freed first) and misses A again; Belady takes
    # the partial blocks, then B's (never read again), deepest first, and keeps A.
    requests = [explicit(f"r{i}", [*t, 90 + i], 1) for i, t in enumerate((A, B, C, A))]
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype="float16")
    config = kvcore.KVCacheConfig.from_specs(7, [spec])
    registry = kvcore.load_registry(only=["full_attention"])
    outcomes = {}
    for name in ("lru", "belady"):
        policies = []

        def factory(info, policies=policies):
            policies.append(BeladyPolicy(info))
            return policies[-1]

        manager = kvcore.KVCacheManager(
            config,
            64,
            registry=registry,
            hash_algorithm="fast",
            eviction=factory if name == "belady" else "lru",
        )
        if policies:
            policies[0].uses = FutureUses(
                requests, prefix_reuse_hits(requests, 4), policies[0].groups, 4, "fast"
            )
        hit_lengths = []
        taken = []
        for index, trace in enumerate(requests):
            if policies:
                policies[0].uses.now = index
            request = Request(trace.request_id, trace.prompt_token_ids)
            blocks, num_hit = admit(manager, request)
            hit_lengths.append(num_hit)
            taken.append(blocks.get_block_ids()[0])
            manager.free(request)
        outcomes[name] = (hit_lengths, taken)
    assert outcomes["lru"] == ([0, 0, 0, 0], [[1, 2, 3], [4, 5, 6], [3, 2, 1], [6, 5, 4]])
    # Belady, for C: the hashless partial blocks 3 and 6, then B's deeper block 5;
    # for the last A: C's hashless partial block, 5 again.
    assert outcomes["belady"] == ([0, 0, 0, 8], [[1, 2, 3], [4, 5, 6], [3, 6, 5], [5]])


def test_with_belady_reports_the_oracle_next_to_the_policy():
    workload = load_workload(limit=120)
    options = SimulationOptions(memory="1GiB", max_model_len=32768)
    report = simulate(workload, SimulationOptions(**{**_fields(options), "with_belady": True}))
    oracle = simulate(workload, SimulationOptions(**{**_fields(options), "eviction": "belady"}))
    assert report.eviction.policy == "lru"
    assert oracle.eviction.policy == "belady"
    assert report.eviction.belady_hit_tokens == oracle.prefix_cache.hit_tokens
    assert report.belady_rate == oracle.prefix_cache.hit_rate
    assert oracle.prefix_cache.hit_tokens <= oracle.prefix_cache.ceiling_tokens
    assert report.to_dict()["eviction"]["belady_hit_rate"] == report.belady_rate


def _fields(options):
    import attrs

    return attrs.asdict(options, recurse=False)


class _View:
    """A pool view over a dict of block hashes, every block in group 0."""

    def __init__(self, hashes: dict[int, object]) -> None:
        self.hashes = hashes

    def block_hash(self, block):
        return self.hashes.get(block)

    def block_group(self, block):
        return 0


def test_a_page_class_oracle_starts_empty_and_skips_blocks_its_page_took_back():
    # A two-level pool's class: nothing free at the start; blocks come free by
    # release and leave by revive when their large page goes to another class,
    # hashless ones included.
    view = _View({})
    info = kvcore.eviction.PoolInfo(num_blocks=5, view=view, free_at_start=False)
    oracle = BeladyPolicy(info, FutureUses([], [], info.groups, 4, "fast"))
    assert list(oracle) == []
    oracle.release([1, 2, 3])  # hashless: worthless, in release order
    assert list(oracle) == [1, 2, 3]
    oracle.revive(1)  # block 1's page left the class
    oracle.revive(2)
    assert list(oracle) == [3]
    assert oracle.take(1) == [3]
    oracle.release([2])  # block 2 is carved and freed again
    assert oracle.take(1) == [2]
    assert list(oracle) == []
