"""What an execution found: positions checked against the oracle, and every mismatch."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["ExecutionReport", "Mismatch", "format_execution"]


@attrs.frozen(kw_only=True)
class Mismatch:
    """A position whose paged output differs from the dense oracle's.

    Attributes:
        step: The executor step that computed it (1-based).
        request_id: The request.
        position: The token position.
        layer: The first layer whose output differs there.
        kind: That layer's attention type (``spec.kind``).
        max_abs_diff: Largest absolute difference at that layer (``nan`` when
            the paged run read a slot nobody wrote).
    """

    step: int
    request_id: str
    position: int
    layer: str
    kind: str
    max_abs_diff: float

    def describe(self) -> str:
        """One line: where, which layer, by how much."""
        return (
            f"step {self.step}, request {self.request_id!r}, position {self.position}: "
            f"layer {self.layer} ({self.kind}) differs by {self.max_abs_diff:.3g}"
        )


@attrs.frozen(kw_only=True)
class ExecutionReport:
    """The paged run of a model compared with its dense run.

    Attributes:
        steps: Steps executed.
        requests: Requests that had positions computed.
        layers: Layers of the model.
        positions_checked: Computed positions compared with the oracle
            (a position recomputed after a preemption counts again).
        positions_discarded: Computed positions not compared: rejected draft
            tokens and the positions after them in their step.
        num_mismatches: Positions whose output differs, at any layer.
        mismatches: The first of them, described.
        null_block_writes: Layers whose page in the null block was written.
        device: Where the run happened.
        step_seconds: Time spent in the paged steps.
        oracle_seconds: Time spent in the dense runs and the comparison.
    """

    steps: int
    requests: int
    layers: int
    positions_checked: int
    positions_discarded: int
    num_mismatches: int
    mismatches: tuple[Mismatch, ...]
    null_block_writes: tuple[str, ...]
    device: str
    step_seconds: float
    oracle_seconds: float

    @property
    def ok(self) -> bool:
        """No mismatch, and the null block untouched."""
        return self.num_mismatches == 0 and not self.null_block_writes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        data = attrs.asdict(self)
        data["ok"] = self.ok
        return data


def format_execution(report: ExecutionReport) -> str:
    """The report as indented lines, to follow ``kvcore simulate``'s report."""
    verdict = (
        "bit-exact against the dense oracle"
        if report.ok
        else f"{report.num_mismatches:,} MISMATCHES against the dense oracle"
    )
    lines = [
        f"  execute      {report.positions_checked:,} positions x {report.layers} layers "
        f"checked ({report.requests:,} requests, {report.steps:,} steps, {report.device}, "
        f"float64): {verdict}",
        f"               paged steps {report.step_seconds:.2f} s (part of the replay time "
        f"above), dense oracle {report.oracle_seconds:.2f} s"
        + (
            f"; {report.positions_discarded:,} draft positions discarded"
            if report.positions_discarded
            else ""
        ),
    ]
    lines.extend(f"               {m.describe()}" for m in report.mismatches)
    if report.num_mismatches > len(report.mismatches):
        lines.append(f"               ... {report.num_mismatches - len(report.mismatches)} more")
    if report.null_block_writes:
        lines.append(f"               null block written by: {', '.join(report.null_block_writes)}")
    return "\n".join(lines)
