"""How many layers a KV cache group holds, when layers of several types share pages.

Every group of a uniform-page plan holds the same number of layer slots (its
*group size*): a block id then costs the same bytes whichever group owns it. A
bucket of ``n`` layers of one type becomes ``ceil(n / size)`` groups, and the
slots it leaves empty are *padding*: bytes that are allocated with every block
the bucket's groups own and never used.

Two rules pick the size:

``"reference"``
    The reference engine's rule: the smallest bucket's layer count (the "1" of
    an n:1 layer pattern), or the largest one when it is less than 1.5 times
    the smallest (a draft model's extra layer then pads one slot instead of
    doubling the groups).

``"gcd"``
    kvcore's opt-in rule: the size that wastes the fewest bytes for a request
    of the longest admitted length. Padding in a bucket costs one page per
    padding slot for every block that bucket's groups hold, so each bucket's
    padding is weighted by the blocks one such request needs in it (a
    sliding-window bucket needs few, a full-attention bucket many). Sizes that
    more than double the reference's number of groups are not considered (each
    group is one more block table per request and step). The reference size
    is always a candidate, so this rule never wastes more; when the greatest
    common divisor of the bucket sizes is allowed it wastes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from kvcore._utils import cdiv
from kvcore.errors import InvalidConfigError

__all__ = [
    "GROUP_SIZE_RULES",
    "GroupSizeRule",
    "approximate_gcd",
    "choose_group_size",
    "gcd_group_size",
    "padding_slots",
    "reference_group_size",
]

GroupSizeRule = Literal["reference", "gcd"]
GROUP_SIZE_RULES: Final[tuple[GroupSizeRule, ...]] = ("reference", "gcd")

#: The gcd rule considers group sizes giving at most this many times the
#: reference rule's number of groups.
MAX_GROUP_GROWTH: Final = 2


def reference_group_size(bucket_sizes: Sequence[int]) -> int:
    """The reference rule: the smallest bucket, or the largest if < 1.5 × the smallest."""
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    # Integer form of largest < 1.5 * smallest.
    return largest if 2 * largest < 3 * smallest else smallest


def num_groups(bucket_sizes: Sequence[int], group_size: int) -> int:
    """Groups the buckets split into with ``group_size`` slots per group."""
    return sum(cdiv(size, group_size) for size in bucket_sizes)


def padding_slots(bucket_sizes: Sequence[int], group_size: int) -> list[int]:
    """Empty layer slots per bucket with ``group_size`` slots per group."""
    return [cdiv(size, group_size) * group_size - size for size in bucket_sizes]


def gcd_group_size(bucket_sizes: Sequence[int], weights: Sequence[int] | None = None) -> int:
    """The "gcd" rule: the group size wasting the fewest weighted padding slots.

    Args:
        bucket_sizes: Layers per bucket (layers that can share a group).
        weights: Blocks a longest request holds per group of each bucket;
            ``None`` counts every padding slot once.

    Returns:
        The size minimizing ``Σ padding slots × weight`` among sizes giving at
        most :data:`MAX_GROUP_GROWTH` times the reference's groups; ties go to
        fewer groups, then to the reference size.
    """
    weights = [1] * len(bucket_sizes) if weights is None else list(weights)
    reference = reference_group_size(bucket_sizes)
    budget = MAX_GROUP_GROWTH * num_groups(bucket_sizes, reference)

    def cost(size: int) -> tuple[int, int, bool]:
        waste = sum(
            pad * weight
            for pad, weight in zip(padding_slots(bucket_sizes, size), weights, strict=True)
        )
        return waste, num_groups(bucket_sizes, size), size != reference

    candidates = [
        size for size in range(1, max(bucket_sizes) + 1) if num_groups(bucket_sizes, size) <= budget
    ]
    return min(candidates, key=cost)


def choose_group_size(
    rule: str, bucket_sizes: Sequence[int], weights: Sequence[int] | None = None
) -> int:
    """Apply ``rule`` (``"reference"`` or ``"gcd"``) to the bucket sizes.

    Raises:
        InvalidConfigError: unknown rule.
    """
    if rule == "reference":
        return reference_group_size(bucket_sizes)
    if rule == "gcd":
        return gcd_group_size(bucket_sizes, weights)
    msg = f"group_size_rule must be one of {', '.join(GROUP_SIZE_RULES)}, got {rule!r}"
    raise InvalidConfigError(msg)


def approximate_gcd(values: Sequence[int], *, lower_bound: int = 1) -> int:
    """The divisor in ``[lower_bound, max(values)]`` rounding ``values`` up the least.

    Each value ``x`` is rounded up to a multiple of ``d``; the total added,
    ``Σ (d - x mod d) mod d``, is minimized; ties go to the larger ``d``. A
    lower bound above every value is returned as is.
    """
    low = max(1, lower_bound)
    high = max(values)
    if low > high:
        return low
    return min(range(low, high + 1), key=lambda d: (sum((d - x % d) % d for x in values), -d))
