"""``kvcore simulate --execute``: the executor attached to the simulator's scheduler."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvcore._exec.executor import Executor, Scheduled
from kvcore._exec.model import ReferenceModel
from kvcore._exec.report import ExecutionReport
from kvcore._exec.tiny import tiny_model_path, tiny_models
from kvcore._kv_cache_manager import KVCacheManager
from kvcore._planning.allocate import allocate_kv_cache
from kvcore._planning.plan import KVCachePlan
from kvcore._request import Request
from kvcore.errors import InvalidConfigError

__all__ = ["MAX_EXECUTE_BYTES", "SimulationExecutor", "default_device", "resolve_model"]

#: Largest cache ``--execute`` allocates: the executor is for tiny models.
MAX_EXECUTE_BYTES = 1 << 30


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_model(model: str) -> str:
    """A tiny model's config path for its name (``tiny-hybrid``), anything else unchanged."""
    return str(tiny_model_path(model)) if model in tiny_models() else model


class SimulationExecutor:
    """Runs every scheduled step of a simulation through an executor.

    Pass :meth:`attach` to :func:`kvcore._sim.simulate.simulate`; once it has
    returned, :meth:`report` checks the recorded outputs.

    Args:
        seed: Seed of the model's weights.
        device: Where the cache lives (default :func:`default_device`).
    """

    def __init__(self, *, seed: int = 0, device: str | None = None) -> None:
        self.seed = seed
        self.device = device or default_device()
        self.executor: Executor | None = None

    def attach(
        self, plan: KVCachePlan, manager: KVCacheManager
    ) -> Callable[[Sequence[tuple[Request, int]]], None]:
        """Allocate the plan's cache, build the model, and return the step callback.

        Raises:
            InvalidConfigError: the cache would be larger than
                :data:`MAX_EXECUTE_BYTES` (give a smaller ``--memory``).
        """
        config = plan.kv_cache_config
        if config.size_bytes > MAX_EXECUTE_BYTES:
            msg = (
                f"--execute allocates the whole KV cache ({config.size_bytes:,} bytes for "
                f"{config.num_blocks:,} blocks), more than {MAX_EXECUTE_BYTES:,}; give a "
                "smaller --memory (a tiny model needs a few MiB)"
            )
            raise InvalidConfigError(msg)
        model = ReferenceModel.from_plan(
            plan, registry=manager.registry, seed=self.seed, device=self.device
        )
        self.executor = Executor(model, manager, allocate_kv_cache(config, device=self.device))
        return self._step

    def _step(self, batch: Sequence[tuple[Request, int]]) -> None:
        assert self.executor is not None
        self.executor.step([Scheduled(request=r, num_tokens=n) for r, n in batch])

    def report(self) -> ExecutionReport:
        """Compare every recorded output with the dense oracle.

        Raises:
            InvalidConfigError: nothing was attached (no simulation ran).
        """
        if self.executor is None:
            msg = "no simulation ran with this executor attached"
            raise InvalidConfigError(msg)
        return self.executor.check()
