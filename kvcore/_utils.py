"""Small arithmetic helpers shared by the core modules."""

from __future__ import annotations

__all__ = ["cdiv", "round_down"]


def cdiv(numerator: int, denominator: int) -> int:
    """Return ``ceil(numerator / denominator)`` for integers, without floats."""
    return -(numerator // -denominator)


def round_down(value: int, multiple: int) -> int:
    """Return the largest multiple of ``multiple`` that is at most ``value``."""
    return value - value % multiple
