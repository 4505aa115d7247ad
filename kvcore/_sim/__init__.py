"""The simulator behind ``kvcore simulate``: workloads, a continuous-batching scheduler, reports.

Private: the CLI is the supported interface. Modules, one job each:

* :mod:`kvcore._trace` reads JSONL traces; :mod:`.generator` makes the
  built-in workload; :mod:`.workload` picks one of the two.
* :mod:`.ceiling` computes a workload's unbounded-cache hit ceiling, without
  kvcore.
* :mod:`.scheduler` drives a ``KVCacheManager`` step by step like an engine.
* :mod:`.metrics` times manager calls and samples usage; :mod:`.report`
  formats the result; :mod:`.plot` draws it (matplotlib, optional);
  :mod:`.progress` shows a progress bar on a terminal.
* :mod:`.simulate` ties them together.
"""

from __future__ import annotations

from kvcore._sim.ceiling import Ceiling, prefix_reuse_ceiling
from kvcore._sim.generator import GeneratorConfig, generate_workload
from kvcore._sim.report import SimulationReport, format_report
from kvcore._sim.scheduler import SchedulerConfig
from kvcore._sim.simulate import DEFAULT_MODEL, SimulationOptions, simulate
from kvcore._sim.workload import Workload, load_workload, write_workload

__all__ = [
    "DEFAULT_MODEL",
    "Ceiling",
    "GeneratorConfig",
    "SchedulerConfig",
    "SimulationOptions",
    "SimulationReport",
    "Workload",
    "format_report",
    "generate_workload",
    "load_workload",
    "prefix_reuse_ceiling",
    "simulate",
    "write_workload",
]
