"""The continuous-batching scheduler, against managers built by hand."""

from __future__ import annotations

import pytest
from simhelpers import explicit, full_manager, make_scheduler

from kvcore._sim.ceiling import prefix_reuse_ceiling
from kvcore._sim.scheduler import SchedulerConfig, UnservableRequestError
from kvcore.errors import InvalidConfigError
from kvcore.testing import check_manager_invariants


def record_allocations(manager):
    """Wrap allocate_slots to log (request id, num_new_tokens, hit tokens) per call."""
    calls = []
    inner = manager.allocate_slots

    def allocate_slots(request, num_new_tokens, num_new_computed_tokens=0, *args, **kwargs):
        calls.append((request.request_id, num_new_tokens, num_new_computed_tokens))
        return inner(request, num_new_tokens, num_new_computed_tokens, *args, **kwargs)

    manager.allocate_slots = allocate_slots
    return calls


HAND_MADE = [
    explicit("r1", range(40), 2),
    explicit("r2", [*range(32), *range(100, 110)], 1),
    explicit("r3", range(40), 1),
    explicit("r4", range(200, 216), 1),
    explicit("r5", [*range(200, 216), *range(16)], 1),
]


def test_hit_rate_on_a_hand_made_trace():
    """Block size 16, a pool large enough to evict nothing, all admitted in step 1.

    * r1 = 0..39 (40 tokens): empty cache → 0 hit. Its allocation caches its
      two full blocks, [0..15] and [16..31].
    * r2 = 0..31, 100..109 (42 tokens): both blocks of r1 → 32.
    * r3 = 0..39 (40): the same two blocks → 32 (at most 39 tokens may hit,
      rounded down to whole blocks).
    * r4 = 200..215 (16): nothing cached; also at most 15 may hit → 0. Its one
      full block is cached.
    * r5 = 200..215, 0..15 (32): r4's block → 16; the next block follows a
      different parent, so it misses although r1 has the same tokens.

    Hit rate: (32 + 32 + 16) / (40 + 42 + 40 + 16 + 32) = 80 / 170.
    """
    manager = full_manager(num_blocks=100)
    calls = record_allocations(manager)
    scheduler = make_scheduler(manager, HAND_MADE, arrival="asap")
    scheduler.run()
    assert (scheduler.hit_tokens, scheduler.prompt_tokens) == (80, 170)
    admissions = [(rid, hit) for rid, _, hit in calls[:5]]
    assert admissions == [("r1", 0), ("r2", 32), ("r3", 32), ("r4", 0), ("r5", 16)]
    # The ceiling agrees: nothing was evicted.
    assert prefix_reuse_ceiling(HAND_MADE, 16).reusable_tokens == 80
    assert scheduler.num_finished == 5


def test_admission_adopts_the_hit_and_allocates_the_rest():
    manager = full_manager(num_blocks=100)
    calls = record_allocations(manager)
    requests = [HAND_MADE[0], explicit("r2", [*range(32), *range(100, 110)], 3)]
    scheduler = make_scheduler(manager, requests, arrival="asap")
    scheduler.step()
    # r2: 32 hit tokens adopted, 10 computed, as an engine calls it.
    assert calls == [("r1", 40, 0), ("r2", 10, 32)]
    r1, r2 = (e.request for e in scheduler.running)
    assert (r1.num_computed_tokens, r1.num_tokens) == (40, 41)  # first output token sampled
    assert (r2.num_computed_tokens, r2.num_tokens) == (42, 43)


def test_chunked_prefill_respects_the_token_budget():
    requests = [explicit(f"r{i}", range(i * 1000, i * 1000 + 300), 5) for i in range(6)]
    manager = full_manager(num_blocks=400)
    calls = record_allocations(manager)
    scheduler = make_scheduler(manager, requests, arrival="asap", max_num_batched_tokens=128)
    per_step = []
    while not scheduler.done:
        start = len(calls)
        scheduler.step()
        per_step.append(sum(n for _, n, _ in calls[start:]))
    assert max(per_step) == 128
    assert all(n <= 128 for n in per_step)
    # A 300-token prompt is computed in chunks: 128 + 128 + 44 for the first request.
    assert [n for rid, n, _ in calls if rid == "r0"][:3] == [128, 128, 44]
    assert scheduler.num_finished == 6


def test_one_decode_token_per_running_request_per_step():
    requests = [explicit(f"r{i}", range(i * 100, i * 100 + 20), 4) for i in range(3)]
    manager = full_manager(num_blocks=50)
    calls = record_allocations(manager)
    scheduler = make_scheduler(manager, requests, arrival="asap")
    scheduler.step()  # three prefills, each samples its first token
    assert [n for _, n, _ in calls] == [20, 20, 20]
    scheduler.step()
    assert calls[3:] == [("r0", 1, 0), ("r1", 1, 0), ("r2", 1, 0)]


def test_decode_steps_are_the_steps_that_only_decoded():
    """Two seats; r0 (4 outputs), r1 (2), r2 (1), 20-token prompts.

    * step 1: r0 and r1 prefill (first outputs);
    * step 2: both decode, r1 finishes and is freed: a decode step;
    * step 3: r0 decodes and r2 is admitted into r1's seat: not one;
    * step 4: r0 decodes its last token and is freed: a decode step.
    """
    requests = [
        explicit("r0", range(20), 4),
        explicit("r1", range(100, 120), 2),
        explicit("r2", range(200, 220), 1),
    ]
    scheduler = make_scheduler(
        full_manager(num_blocks=50), requests, arrival="asap", max_num_seqs=2
    )
    scheduler.run()
    assert scheduler.step_count == 4
    assert scheduler.decode_steps == 2
    step_ns = scheduler.step_manager_ns
    assert scheduler.decode_step_ns == step_ns[1] + step_ns[3]


def test_max_num_seqs_limits_admission():
    requests = [explicit(f"r{i}", range(i * 100, i * 100 + 20), 3) for i in range(5)]
    scheduler = make_scheduler(
        full_manager(num_blocks=50), requests, arrival="asap", max_num_seqs=2
    )
    scheduler.step()
    assert [e.trace.request_id for e in scheduler.running] == ["r0", "r1"]
    assert len(scheduler.waiting) == 3


def test_preemption_by_recompute_and_every_request_finishes():
    # 12 requests of 64 prompt + 64 output tokens need 8 blocks each at the end;
    # a pool of 40 usable blocks holds 5: decode growth must preempt.
    requests = [explicit(f"r{i}", range(i * 1000, i * 1000 + 64), 64) for i in range(12)]
    manager = full_manager(num_blocks=41)
    calls = record_allocations(manager)
    scheduler = make_scheduler(manager, requests, arrival="asap")
    steps = 0
    while not scheduler.done:
        scheduler.step()
        check_manager_invariants(manager)
        steps += 1
    assert scheduler.num_preemptions > 0
    assert scheduler.num_finished == 12
    assert scheduler.lost_tokens > 0
    # A resumed request finds its own blocks again (free but still cached).
    assert scheduler.resume_hit_tokens > 0
    # Resumed requests are admitted again with a lookup: hit tokens adopted.
    resumed = [c for c in calls if c[2] > 0]
    assert resumed
    # Every block is back in the pool once all requests finished.
    assert manager.num_free_blocks == 40
    assert manager.usage == 0.0
    for group in manager.coordinator.managers:
        assert group.req_to_blocks == {}


def test_preempted_request_goes_to_the_front_of_the_queue():
    requests = [explicit(f"r{i}", range(i * 1000, i * 1000 + 64), 64) for i in range(12)]
    manager = full_manager(num_blocks=41)
    scheduler = make_scheduler(manager, requests, arrival="asap")
    while scheduler.num_preemptions == 0:
        scheduler.step()
    head = scheduler.waiting[0]
    assert head.request.num_preemptions == 1
    assert head.request.num_computed_tokens == 0
    assert head.num_output > 0  # its output so far is kept and recomputed


def test_free_on_finish_returns_every_block():
    manager = full_manager(num_blocks=100)
    scheduler = make_scheduler(manager, HAND_MADE, arrival="asap")
    scheduler.step()
    assert manager.num_free_blocks < 99
    scheduler.run()
    assert manager.num_free_blocks == 99
    assert all(e.finished and e.request is None for e in scheduler.requests)


def test_arrivals_by_timestamp_advance_a_simulated_clock():
    requests = [
        explicit("early", range(20), 2, at_ms=0),
        explicit("late", range(100, 120), 2, at_ms=10_000),
    ]
    scheduler = make_scheduler(
        full_manager(num_blocks=50), requests, arrival="timestamp", step_ms=5, token_us=100
    )
    scheduler.step()
    assert [e.trace.request_id for e in scheduler.running] == ["early"]
    assert scheduler.clock_ms == pytest.approx(5 + 20 * 0.1)
    scheduler.run()
    # idle until 10 s, then the late request's steps.
    assert scheduler.clock_ms > 10_000
    assert scheduler.num_finished == 2


def test_a_request_larger_than_the_pool_is_an_error():
    scheduler = make_scheduler(full_manager(num_blocks=5), [explicit("big", range(200), 1)])
    with pytest.raises(UnservableRequestError, match=r"'big' \(200 prompt tokens\).*--memory"):
        scheduler.run()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_num_batched_tokens", 0, "max_num_batched_tokens must be a positive integer"),
        ("max_num_seqs", -1, "max_num_seqs must be a positive integer"),
        ("arrival", "soon", "arrival must be one of timestamp, asap"),
        ("step_ms", -1.0, "step_ms must be a finite number >= 0"),
    ],
)
def test_scheduler_config_is_validated(field, value, message):
    with pytest.raises(InvalidConfigError, match=message):
        SchedulerConfig(**{field: value})


def test_progress_line_on_a_terminal_and_cleared_at_the_end():
    import io

    from kvcore._sim.progress import progress_printer

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert progress_printer(io.StringIO()) is None  # piped: quiet
    stream = Terminal()
    show = progress_printer(stream)
    scheduler = make_scheduler(full_manager(num_blocks=100), HAND_MADE, arrival="asap")
    scheduler.step()
    show(scheduler)
    assert "simulating [" in stream.getvalue()
    assert "/5 requests, step 1, pool" in stream.getvalue()
    scheduler.run(show)
    assert stream.getvalue().endswith("\r\x1b[2K")
