"""The executor: scheduled steps through the paged cache, every output recorded and checked."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import attrs
import torch

from kvcore._exec.model import DEFAULT_HIDDEN_SIZE, ReferenceLayer, ReferenceModel
from kvcore._exec.oracle import dense_outputs
from kvcore._exec.report import ExecutionReport, Mismatch
from kvcore._kv_cache_manager import KVCacheManager
from kvcore._planning.allocate import KVCacheBuffers, allocate_kv_cache
from kvcore._planning.plan import KVCachePlan
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._request import Request
from kvcore.errors import InvalidConfigError, InvalidRequestError
from kvcore.reference import CacheLayer, StepInput

__all__ = ["Executor", "Scheduled", "single_threaded"]

#: Most mismatches described one by one in a report (all are counted).
MAX_REPORTED_MISMATCHES = 20


def _optional_tokens(tokens: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if tokens is None else tuple(tokens)


@attrs.frozen(kw_only=True)
class Scheduled:
    """One request's share of a step, as the scheduler decided it.

    The step computes positions ``[start, start + num_tokens)`` where
    ``start`` is the request's ``num_computed_tokens`` when
    :meth:`Executor.step` is called (after ``allocate_slots``, before the
    engine advances it).

    Attributes:
        request: The request (its block tables are read from the manager).
        num_tokens: Positions computed in this step.
        token_ids: The tokens at those positions; default the request's own.
            Give them for speculative positions past the request's tokens
            (draft tokens, which the engine may reject afterwards).
        num_encoder_tokens: The request's encoder tokens (0: decoder-only).
    """

    request: Request
    num_tokens: int
    token_ids: tuple[int, ...] | None = attrs.field(default=None, converter=_optional_tokens)
    num_encoder_tokens: int = 0


@attrs.frozen
class _Record:
    step: int
    request_id: str
    start: int
    token_ids: tuple[int, ...]
    outputs: torch.Tensor  # (layers, n, hidden), on the CPU


@attrs.frozen
class _Layer:
    model: ReferenceLayer  # what the layer computes: its spec, kernel and weights
    cache: CacheLayer  # where its data lives: the planned spec and the views


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch on one thread inside the block (restored after).

    The executor's tensors are tiny; torch's thread pool only adds overhead
    to them (ten times the run time on a loaded machine).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Executor:
    """Runs a :class:`ReferenceModel` through the paged cache a manager hands out.

    Each :meth:`step` embeds the scheduled tokens and runs every layer over
    the whole batch, through the block tables the manager holds for each
    request at that moment: first every request's write phase, then every
    request's read phase (see :class:`~kvcore.reference.ReferenceKernel`).
    Every position's hidden state after every layer is recorded;
    :meth:`check` compares them with the dense run of the same model over
    each request's final tokens.

    The cache buffer is filled with ``0xFF`` bytes first (NaN in every float
    dtype), so reading a slot nobody wrote gives NaN, which never equals the
    oracle.

    Args:
        model: The model (:meth:`ReferenceModel.from_plan` of the plan the
            buffers were allocated for).
        manager: The manager whose block tables the steps read.
        buffers: The allocated cache (:func:`kvcore.allocate_kv_cache` of
            ``manager.kv_cache_config``).

    Raises:
        InvalidConfigError: the model, the manager and the buffers do not
            describe the same layers and config.
    """

    def __init__(
        self, model: ReferenceModel, manager: KVCacheManager, buffers: KVCacheBuffers
    ) -> None:
        config = buffers.config
        if manager.kv_cache_config != config:
            msg = (
                "the buffers were allocated for another KVCacheConfig than the manager's; "
                "allocate manager.kv_cache_config"
            )
            raise InvalidConfigError(msg)
        planned = {name for group in config.kv_cache_groups for name in group.layer_names}
        modelled = {layer.name for layer in model.layers}
        if planned != modelled:
            missing = sorted(planned ^ modelled)
            msg = (
                f"the model's layers and the config's layers differ ({', '.join(missing[:5])}); "
                "build the model from the plan whose config the manager serves"
            )
            raise InvalidConfigError(msg)
        self.model = model
        self.manager = manager
        self.buffers = buffers
        managers = manager.coordinator.managers
        layers = []
        for model_layer in model.layers:
            name = model_layer.name
            group_id = config.group_of(name)
            cache = CacheLayer(
                name=name,
                spec=config.layer_spec(name),
                views=buffers.views[name],
                group_id=group_id,
                manager=managers[group_id],
            )
            layers.append(_Layer(model_layer, cache))
        self._layers = tuple(layers)
        self._records: list[_Record] = []
        self._requests: dict[str, Request] = {}
        self._encoder_tokens: dict[str, int] = {}
        self.num_steps = 0
        self.step_seconds = 0.0
        buffers.buffer.fill_(0xFF)
        with single_threaded():
            for layer in self._layers:
                layer.model.kernel.setup(layer.model.spec, layer.model.params, layer.cache)

    @classmethod
    def from_plan(
        cls,
        plan: KVCachePlan,
        *,
        registry: Registry | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        hash_algorithm: str = "fast",
        enable_kv_cache_events: bool = True,
        seed: int = 0,
        hidden_size: int = DEFAULT_HIDDEN_SIZE,
        device: torch.device | str = "cpu",
    ) -> Executor:
        """A manager, the allocated cache and a tiny model for ``plan``, ready to step.

        Args:
            plan: The plan (:func:`kvcore.plan`).
            registry: The plugins (default: every installed plugin).
            enable_caching: Prefix caching on.
            use_eagle: EAGLE speculative decoding (the manager drops the last
                block of every hit).
            hash_algorithm: The manager's block hash.
            enable_kv_cache_events: Queue KV cache events (the engine loop
                counts evictions from them).
            seed: Seed of the model's weights.
            hidden_size: Width of the model's hidden state.
            device: Where the cache lives and the model computes.
        """
        registry = load_registry() if registry is None else registry
        config = plan.kv_cache_config
        manager = KVCacheManager(
            config,
            plan.max_model_len,
            registry=registry,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            hash_algorithm=hash_algorithm,
            enable_kv_cache_events=enable_kv_cache_events,
        )
        model = ReferenceModel.from_plan(
            plan, registry=registry, seed=seed, hidden_size=hidden_size, device=device
        )
        return cls(model, manager, allocate_kv_cache(config, device=device))

    @property
    def device(self) -> torch.device:
        """Where the cache and the computation live."""
        return self.buffers.buffer.device

    def step(self, batch: Sequence[Scheduled]) -> None:
        """Run one step: every layer over every scheduled request.

        Call it after the step's ``allocate_slots`` calls and before
        advancing the requests' ``num_computed_tokens``.

        Raises:
            PagedAccessError: a kernel needed a slot the block tables do not
                give (a null block, or a position past a table).
            InvalidRequestError: a scheduled entry contradicts its request.
        """
        if not batch:
            return
        started = time.perf_counter()
        model = self.model
        inputs = []
        encoder_tokens = dict(self._encoder_tokens)
        for entry in batch:
            request = entry.request
            request_id = request.request_id
            start = request.num_computed_tokens
            if entry.token_ids is None:
                tokens = tuple(request.all_token_ids[start : start + entry.num_tokens])
            else:
                tokens = entry.token_ids
            if entry.num_tokens < 1 or len(tokens) != entry.num_tokens:
                msg = (
                    f"request {request_id!r}: {entry.num_tokens} positions scheduled from "
                    f"{start}, but {len(tokens)} token ids for them"
                )
                raise InvalidRequestError(msg)
            known = encoder_tokens.setdefault(request_id, entry.num_encoder_tokens)
            if known != entry.num_encoder_tokens:
                msg = (
                    f"request {request_id!r} was scheduled with {known} encoder tokens, now "
                    f"{entry.num_encoder_tokens}"
                )
                raise InvalidRequestError(msg)
            tables = self.manager.get_block_ids(request_id)
            encoder = model.encoder_states(request_id, entry.num_encoder_tokens)
            inputs.append((request_id, start, tokens, tables, encoder))
        # Every entry is valid: only now does the executor's state change.
        self.num_steps += 1
        self._encoder_tokens = encoder_tokens
        self._requests.update((entry.request.request_id, entry.request) for entry in batch)
        with single_threaded():
            hidden = [model.embed(tokens) for _, _, tokens, _, _ in inputs]
            outputs: list[list[torch.Tensor]] = [[] for _ in inputs]
            for layer in self._layers:
                kernel, spec, params = layer.model.kernel, layer.model.spec, layer.model.params
                steps = [
                    StepInput(
                        request_id=request_id,
                        start=start,
                        x=x,
                        block_table=tuple(tables[layer.cache.group_id]),
                        encoder_states=encoder,
                    )
                    for (request_id, start, _, tables, encoder), x in zip(
                        inputs, hidden, strict=True
                    )
                ]
                carries = [kernel.begin(spec, params, layer.cache, s) for s in steps]
                for index, (s, carry) in enumerate(zip(steps, carries, strict=True)):
                    out = kernel.finish(spec, params, layer.cache, s, carry)
                    hidden[index] = hidden[index] + out
                    outputs[index].append(hidden[index])
            for (request_id, start, tokens, _, _), per_layer in zip(inputs, outputs, strict=True):
                self._records.append(
                    _Record(self.num_steps, request_id, start, tokens, torch.stack(per_layer).cpu())
                )
        self.step_seconds += time.perf_counter() - started

    def _null_block_writes(self) -> tuple[str, ...]:
        written = []
        for layer in self._layers:
            for view in layer.cache.views:
                if view.is_floating_point() and not bool(torch.isnan(view[0]).all()):
                    written.append(layer.cache.name)
                    break
        return tuple(written)

    def check(self) -> ExecutionReport:
        """Compare every recorded output with the dense run over the requests' final tokens.

        A position is compared when the tokens the step used, from the
        step's first position up to it, are the request's final tokens (a
        rejected draft token, and every position after it in its step, is
        not: the engine threw those outputs away). Outputs are compared for
        exact equality; NaN never equals anything.
        """
        started = time.perf_counter()
        by_request: dict[str, list[_Record]] = {}
        for record in self._records:
            by_request.setdefault(record.request_id, []).append(record)
        checked = discarded = 0
        mismatches: list[Mismatch] = []
        num_mismatches = 0
        with single_threaded():
            for request_id, records in by_request.items():
                final = self._requests[request_id].all_token_ids
                valid = [_num_valid(record, final) for record in records]
                needed = max(r.start + v for r, v in zip(records, valid, strict=True))
                if needed == 0:
                    continue
                encoder = self.model.encoder_states(request_id, self._encoder_tokens[request_id])
                oracle = dense_outputs(self.model, final[:needed], encoder).cpu()
                for record, count in zip(records, valid, strict=True):
                    checked += count
                    discarded += len(record.token_ids) - count
                    if not count:
                        continue
                    got = record.outputs[:, :count]
                    want = oracle[:, record.start : record.start + count]
                    same = (got == want).all(dim=-1)  # (layers, count)
                    for offset in torch.nonzero(~same.all(dim=0)).flatten().tolist():
                        num_mismatches += 1
                        if len(mismatches) < MAX_REPORTED_MISMATCHES:
                            layer = int(torch.nonzero(~same[:, offset])[0])
                            diff = (got[layer, offset] - want[layer, offset]).abs().max()
                            mismatches.append(
                                Mismatch(
                                    step=record.step,
                                    request_id=request_id,
                                    position=record.start + offset,
                                    layer=self._layers[layer].model.name,
                                    kind=self._layers[layer].model.spec.kind,
                                    max_abs_diff=float(diff),
                                )
                            )
        return ExecutionReport(
            steps=self.num_steps,
            requests=len(by_request),
            layers=len(self._layers),
            positions_checked=checked,
            positions_discarded=discarded,
            num_mismatches=num_mismatches,
            mismatches=tuple(mismatches),
            null_block_writes=self._null_block_writes(),
            device=str(self.device),
            step_seconds=self.step_seconds,
            oracle_seconds=time.perf_counter() - started,
        )


def _num_valid(record: _Record, final: Sequence[int]) -> int:
    """Leading positions of a record whose tokens are the request's final ones."""
    count = 0
    for offset, token in enumerate(record.token_ids):
        position = record.start + offset
        if position >= len(final) or final[position] != token:
            break
        count += 1
    return count
