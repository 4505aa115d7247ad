"""Small arithmetic and formatting helpers shared by the core modules."""

from __future__ import annotations

__all__ = ["cdiv", "format_bytes", "round_down"]


def cdiv(numerator: int, denominator: int) -> int:
    """Return ``ceil(numerator / denominator)`` for integers, without floats."""
    return -(numerator // -denominator)


def round_down(value: int, multiple: int) -> int:
    """Return the largest multiple of ``multiple`` that is at most ``value``."""
    return value - value % multiple


def format_bytes(num_bytes: int, *, round_up: bool = False) -> str:
    """``num_bytes`` in binary units with two decimals: ``"80.00 GiB"``, ``"512 B"``.

    Args:
        num_bytes: The amount.
        round_up: Round the last decimal up instead of to nearest, so that a
            stated minimum is never below the exact amount.
    """
    if abs(num_bytes) < 1024:
        return f"{num_bytes} B"
    scale, unit = 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if abs(num_bytes) < scale * 1024:
            break
        scale, unit = scale * 1024, bigger
    if round_up:
        hundredths = -(-num_bytes * 100 // scale)  # exact ceiling, no float error
        return f"{hundredths // 100}.{hundredths % 100:02d} {unit}"
    return f"{num_bytes / scale:.2f} {unit}"
