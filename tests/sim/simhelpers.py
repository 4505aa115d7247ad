"""Helpers of the simulator tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

import kvcore
from kvcore._sim.scheduler import Scheduler, SchedulerConfig, SimRequest
from kvcore._trace import TraceRequest
from kvcore_plugins.full_attention import FullAttentionSpec


def explicit(request_id: str, tokens: Sequence[int], output: int, at_ms: float = 0.0):
    return TraceRequest(
        request_id=request_id,
        arrival_ms=at_ms,
        input_length=len(tokens),
        output_length=output,
        token_ids=tuple(tokens),
    )


def full_manager(num_blocks: int, block_size: int = 16, max_model_len: int = 4096):
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype="float16")
    config = kvcore.KVCacheConfig.from_specs(num_blocks, [spec])
    registry = kvcore.load_registry(only=["full_attention"])
    return kvcore.KVCacheManager(config, max_model_len, registry=registry, hash_algorithm="fast")


def make_scheduler(manager, requests, **config) -> Scheduler:
    entries = [
        SimRequest(r, min(r.output_length, manager.max_model_len - r.input_length))
        for r in requests
    ]
    return Scheduler(manager, SchedulerConfig(**config), entries)


def assert_refused(main: Callable[[list[str]], int], argv: list[str], message: str, capsys) -> None:
    """``main(argv)`` exits with argparse's status 2 and ``message`` on standard error."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
