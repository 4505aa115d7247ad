"""The result of a simulation: a JSON-ready dict and a human-readable text report."""

from __future__ import annotations

from typing import Any

import attrs

from kvcore._sim.metrics import Sample

__all__ = ["SimulationReport", "format_report"]


@attrs.frozen(kw_only=True)
class SimulationReport:
    """Everything a simulation measured (see :meth:`to_dict` for the fields).

    Times under ``manager`` and ``timing`` vary from run to run; every other
    field is a function of the workload, the plan and the scheduler options.

    Attributes:
        data: The nested report (the JSON output, without the timeline).
        samples: Usage and hit rate over the run (evenly spaced steps).
    """

    data: dict[str, Any]
    samples: tuple[Sample, ...]

    def to_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        """The report as plain JSON-ready values.

        Args:
            timeline: Include ``timeline``: one list per field of
                :class:`~kvcore._sim.metrics.Sample`.
        """
        out = dict(self.data)
        if timeline:
            out["timeline"] = {
                "step": [s.step for s in self.samples],
                "time_s": [round(s.time_s, 3) for s in self.samples],
                "used_blocks": [s.used_blocks for s in self.samples],
                "group_blocks": [list(s.group_blocks) for s in self.samples],
                "running": [s.running for s in self.samples],
                "waiting": [s.waiting for s in self.samples],
                "hit_rate": [round(s.hit_rate, 6) for s in self.samples],
            }
        return out


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def format_report(report: SimulationReport) -> str:
    """The report as aligned lines of text, for a terminal."""
    d = report.data
    wl, plan, sched = d["workload"], d["plan"], d["scheduler"]
    pc, pre, blocks, steps = d["prefix_cache"], d["preemptions"], d["blocks"], d["steps"]
    mgr, timing = d["manager"], d["timing"]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for g in plan["groups"]:
        by_kind.setdefault(g["kind"], []).append(g)
    groups = ", ".join(
        f"{kind} ({sum(g['layers'] for g in gs)} layers, {len(gs)} group"
        f"{'s' if len(gs) > 1 else ''}, block {gs[0]['block_size']})"
        for kind, gs in by_kind.items()
    )
    lines = [
        f"kvcore simulate: {d['model']} on {wl['name']}",
        f"  plan         {groups}; {plan['num_blocks']:,} blocks, "
        f"max_model_len {plan['max_model_len']:,}, {plan['memory']}",
        f"  scheduler    {sched['max_num_batched_tokens']:,} tokens/step, "
        f"<= {sched['max_num_seqs']} running, arrivals {sched['arrival']}, step cost "
        f"{sched['step_ms']:g} ms + {sched['token_us']:g} µs/token, "
        + (f"{sched['hash_algorithm']} hash" if sched["prefix_caching"] else "prefix caching off"),
        f"  requests     {d['finished']:,} finished of {wl['requests']:,}; "
        f"{wl['rejected_too_long']} rejected (prompt >= max_model_len), "
        f"{wl['output_capped']} outputs capped, {wl['bad_lines']} bad lines skipped",
        f"  tokens       {wl['prompt_tokens']:,} prompt, {wl['output_tokens']:,} output",
        f"  prefix hits  {_pct(pc['hit_rate'])} of prompt tokens ({pc['hit_tokens']:,}); "
        f"unbounded-cache ceiling {_pct(pc['ceiling_rate'])} at {pc['ceiling_block_size']}-token "
        f"blocks ({_pct(pc['fraction_of_ceiling'])} of it reached)",
        f"  preemptions  {pre['count']:,} ({pre['requests']:,} requests); {pre['lost_tokens']:,} "
        f"computed tokens dropped, {pre['resume_hit_tokens']:,} found again in the cache",
        f"  blocks       pool of {blocks['usable']:,}: peak {blocks['peak']:,} "
        f"({_pct(blocks['peak_usage'])}), mean {blocks['mean']:,.0f} "
        f"({_pct(blocks['mean_usage'])})",
    ]
    lines.extend(
        f"               group {g['group']} {g['kind']}: peak {g['peak']:,}, "
        f"mean {g['mean']:,.0f} blocks held"
        for g in blocks["groups"]
    )
    lines += [
        f"               (per group: {blocks['samples']} samples, one every "
        f"{blocks['sample_interval_steps']} steps)",
        f"  steps        {steps['count']:,} ({steps['with_prefill']:,} with prefill), "
        f"{steps['simulated_s']:,.1f} s simulated, {steps['mean_running']:.1f} running on average",
        f"  manager      {mgr['total_s']:.3f} s in kvcore; per step p50 "
        f"{mgr['per_step_p50_us']:.1f} µs, p99 {mgr['per_step_p99_us']:.1f} µs, "
        f"mean {mgr['per_step_mean_us']:.1f} µs",
    ]
    for kind, op in mgr["ops"].items():
        if op["count"]:
            lines.append(
                f"               {kind:<8} {op['count']:>10,} calls, mean {op['mean_us']:8.2f} µs, "
                f"p50 {op['p50_us']:8.2f} µs, p99 {op['p99_us']:9.2f} µs"
            )
    lines.append(
        f"  wall time    {timing['total_s']:.2f} s: setup {timing['setup_s']:.2f} s, replay "
        f"{timing['replay_s']:.2f} s (kvcore {mgr['total_s']:.2f} s, simulator "
        f"{timing['simulator_overhead_s']:.2f} s)"
    )
    return "\n".join(lines)
