"""Workloads: the requests a simulation replays, from a trace file or the generator."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import attrs

from kvcore._sim.generator import GeneratorConfig, generate_workload
from kvcore._trace import BadLine, TraceRequest, read_trace, trace_request_to_json
from kvcore.errors import InvalidConfigError, TraceFormatError

__all__ = ["DEFAULT_NUM_REQUESTS", "Workload", "load_workload", "write_workload"]

#: Requests of the built-in workload when no size is given.
DEFAULT_NUM_REQUESTS = 2000


@attrs.frozen(kw_only=True)
class Workload:
    """The requests to replay, sorted by arrival (ties in file order).

    Attributes:
        name: Where the requests come from (a path, or a description of the
            generated workload).
        requests: The requests.
        bad_lines: Lines of the trace skipped as malformed.
        seed: The generator's seed (``None`` for a trace file).
    """

    name: str
    requests: tuple[TraceRequest, ...]
    bad_lines: tuple[BadLine, ...] = ()
    seed: int | None = None


def load_workload(
    trace: str | Path | None = None,
    *,
    limit: int | None = None,
    seed: int | None = None,
    skip_bad_lines: bool = False,
) -> Workload:
    """Read a trace, or generate the built-in workload when ``trace`` is ``None``.

    Args:
        trace: A JSONL trace (Mooncake or explicit-token lines).
        limit: Keep the first ``limit`` requests (of the file; or the number of
            requests to generate, default :data:`DEFAULT_NUM_REQUESTS`).
        seed: Seed of the generator (default 0); not allowed with a trace,
            which is replayed as it is.
        skip_bad_lines: Skip and count malformed trace lines instead of
            stopping at the first one; only with a trace.

    Raises:
        InvalidConfigError: options that do not go together, or a bad limit.
        TraceFormatError: a malformed trace line (file, line number, reason),
            a trace without requests, or one whose every line was skipped.
    """
    if limit is not None and (type(limit) is not int or limit < 1):
        msg = f"--limit must be a positive integer, got {limit!r}"
        raise InvalidConfigError(msg)
    if trace is None:
        if skip_bad_lines:
            msg = "--skip-bad-lines applies to a --trace file; the built-in workload has none"
            raise InvalidConfigError(msg)
        seed = 0 if seed is None else seed
        num_requests = limit or DEFAULT_NUM_REQUESTS
        requests = generate_workload(GeneratorConfig(num_requests=num_requests, seed=seed))
        return Workload(
            name=f"built-in (seed {seed}, {num_requests} requests)",
            requests=tuple(requests),
            seed=seed,
        )
    if seed is not None:
        msg = (
            "--seed applies to the built-in workload; a --trace is replayed as it is "
            "(drop --seed, or write a seeded workload with 'kvcore workload')"
        )
        raise InvalidConfigError(msg)
    read = read_trace(trace, limit=limit, skip_bad_lines=skip_bad_lines)
    if not read.requests:
        if read.bad_lines:
            first = read.bad_lines[0]
            msg = (
                f"every line of {trace} is malformed ({len(read.bad_lines)} skipped); the "
                f"first, line {first.line_no}: {first.reason}"
            )
        else:
            msg = (
                f"{trace} holds no requests; give a JSONL trace with one request per line "
                "(see 'kvcore workload' for the format)"
            )
        raise TraceFormatError(msg)
    requests = sorted(read.requests, key=lambda r: r.arrival_ms)
    return Workload(name=str(trace), requests=tuple(requests), bad_lines=tuple(read.bad_lines))


def write_workload(requests: Iterable[TraceRequest], path: str | Path) -> int:
    """Write requests as JSONL (``"-"``: standard output); returns the number written.

    Raises:
        InvalidConfigError: the file cannot be written.
    """
    count = 0
    if str(path) == "-":
        for request in requests:
            sys.stdout.write(trace_request_to_json(request) + "\n")
            count += 1
        return count
    try:
        with Path(path).open("w", encoding="utf-8") as out:
            for request in requests:
                out.write(trace_request_to_json(request) + "\n")
                count += 1
    except OSError as exc:
        msg = f"cannot write workload to {path}: {exc.strerror or exc}"
        raise InvalidConfigError(msg) from None
    return count
