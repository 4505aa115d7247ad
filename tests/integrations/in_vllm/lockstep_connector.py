"""A KV connector for the lockstep runs: it reports external tokens, loads nothing.

vLLM's scheduler asks a connector, for every request it admits, how many
tokens past the local cache hit the connector can provide
(``get_num_new_matched_tokens``); the manager then allocates blocks for them
(``num_external_computed_tokens``). This connector answers by a fixed rule,
so both schedulers of a lockstep run get the same answers: every third
request (by id) gets half of its remaining full blocks, loaded synchronously.
The worker side is never run (there is no model).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)


class LockstepConnector(KVConnectorBase_V1, SupportsHMA):
    """External tokens by a fixed rule; records what the scheduler told it."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        #: (request id, external tokens, block ids) for every allocation reported.
        self.allocations: list[tuple[str, int, tuple[list[int], ...]]] = []

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if int(request.request_id) % 3:
            return 0, False
        full_blocks = (request.num_tokens - 1) // self.block_size
        computed_blocks = num_computed_tokens // self.block_size
        return (full_blocks - computed_blocks) // 2 * self.block_size, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.allocations.append((request.request_id, num_external_tokens, blocks.get_block_ids()))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        return False, None

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, None]:
        return False, None

    # The worker side: never called, as no model runs.
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        raise NotImplementedError

    def wait_for_save(self) -> None:
        raise NotImplementedError
