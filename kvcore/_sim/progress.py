"""A one-line progress bar on a terminal; nothing when the output is piped."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from kvcore._sim.scheduler import Scheduler

__all__ = ["progress_printer"]


def progress_printer(stream: TextIO | None = None) -> Callable[[Scheduler], None] | None:
    """A progress callback writing to ``stream`` (default stderr), or ``None`` if not a TTY.

    The line shows finished requests, steps, pool usage and the hit rate so
    far; it is rewritten in place and cleared when the run ends.
    """
    stream = stream if stream is not None else sys.stderr
    if not stream.isatty():
        return None
    started = time.monotonic()
    width = 24

    def show(scheduler: Scheduler) -> None:
        total = len(scheduler.requests)
        done = scheduler.num_finished
        if scheduler.done:
            stream.write("\r\x1b[2K")
            stream.flush()
            return
        filled = width * done // total if total else width
        used = 1 - scheduler.manager.num_free_blocks / max(1, scheduler.usable_blocks)
        hits = scheduler.hit_tokens / scheduler.prompt_tokens if scheduler.prompt_tokens else 0.0
        stream.write(
            f"\r\x1b[2Ksimulating [{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} "
            f"requests, step {scheduler.step_count:,}, pool {100 * used:.0f} %, "
            f"hits {100 * hits:.1f} %, {time.monotonic() - started:.0f} s"
        )
        stream.flush()

    return show
