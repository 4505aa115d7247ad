"""Page classes and the large page of a two-level pool, from the groups' natural pages.

A two-level pool carves large pages into small pages, one size per page
class. Planning decides the classes and the large page; the pool only reads
the result (:class:`~kvcore.PagePool`).

* **A group's page** is what one of its block ids costs in one backing run:
  in the layer-outer layout each layer slot of a group has its own run, so
  the page is the group's largest layer page; in the block-outer layout a
  block holds every layer of the group side by side, so the page is the
  group's bytes per block.
* **Classes** are the distinct group pages, smallest first; each group is
  in the class of its page.
* **The large page** is the least common multiple of the class pages when
  it is at most :data:`MAX_LARGE_PAGE_MULTIPLE` times the largest class
  page: every class then divides it exactly and nothing is padded. When it
  is larger, the large page is the smallest multiple ``m`` of the largest
  class page (``m`` up to the same bound) for which every smaller class can
  be padded up to a divisor of it losing less than :data:`MAX_CLASS_PADDING`
  of each of its small pages (so less than that share of the pool, whatever
  the mix of classes); failing that, the multiple padding the least.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Final

import attrs

from kvcore._config import KVCacheGroupSpec, KVCacheLayout, PagePool
from kvcore._utils import cdiv
from kvcore.specs import DTYPE_SIZES

__all__ = [
    "MAX_CLASS_PADDING",
    "MAX_LARGE_PAGE_MULTIPLE",
    "PageClasses",
    "choose_large_page",
    "page_classes",
]

#: The large page is the lcm of the class pages only while it is at most this
#: many times the largest class page (a larger large page makes memory move
#: between classes in coarser steps, and a request round up to more bytes).
MAX_LARGE_PAGE_MULTIPLE: Final = 64
#: Above that bound, smaller classes are padded to divide a multiple of the
#: largest page; the multiple is chosen so that each class loses less than
#: this share of its small pages.
MAX_CLASS_PADDING: Final = 0.005


@attrs.frozen(kw_only=True)
class PageClasses:
    """How a two-level pool's memory is carved, before the memory is known.

    Attributes:
        natural_page_bytes: Each class's page as its groups need it, in bytes,
            by class (smallest first).
        class_page_bytes: Each class's small page in the pool: the natural
            page, or padded up to divide the large page.
        group_classes: The class of each group, by group id.
        large_page_bytes: Bytes of one large page in one backing run.
        num_runs: Backing runs a large page spans (layer-outer: the most layers
            in a group; block-outer: 1). One large page id costs
            ``num_runs × large_page_bytes`` bytes.
        lcm: Whether the large page is the lcm of the natural pages (nothing
            padded) rather than a padded multiple of the largest.
        layout: The layout the pages are laid out in.
    """

    natural_page_bytes: tuple[int, ...]
    class_page_bytes: tuple[int, ...]
    group_classes: tuple[int, ...]
    large_page_bytes: int
    num_runs: int
    lcm: bool
    layout: KVCacheLayout

    @property
    def num_classes(self) -> int:
        """Page classes."""
        return len(self.class_page_bytes)

    @property
    def bytes_per_large_page(self) -> int:
        """Bytes one large page id costs over every backing run."""
        return self.num_runs * self.large_page_bytes

    def pages_per_large_page(self, klass: int) -> int:
        """Small pages of class ``klass`` in one large page."""
        return self.large_page_bytes // self.class_page_bytes[klass]

    def padding_bytes(self, klass: int) -> int:
        """Bytes each small page of class ``klass`` is padded by."""
        return self.class_page_bytes[klass] - self.natural_page_bytes[klass]

    def groups_of(self, klass: int) -> tuple[int, ...]:
        """The group ids in class ``klass``."""
        return tuple(g for g, c in enumerate(self.group_classes) if c == klass)

    def page_pool(self, num_large_pages: int) -> PagePool:
        """The :class:`~kvcore.PagePool` of ``num_large_pages`` large pages (page 0 included)."""
        return PagePool(
            large_page_bytes=self.large_page_bytes,
            num_large_pages=num_large_pages,
            class_page_bytes=self.class_page_bytes,
            group_classes=self.group_classes,
        )


def group_page_bytes(group: KVCacheGroupSpec, layout: KVCacheLayout) -> int:
    """What one block id of ``group`` costs in one backing run (see the module docstring)."""
    pages = [spec.page_size_bytes for _, spec in group.items()]
    return max(pages) if layout == "layer_outer" else sum(pages)


def _element_alignment(groups: Sequence[KVCacheGroupSpec]) -> int:
    """The largest element size any page part of the groups has (a page must keep it)."""
    return max(
        (DTYPE_SIZES[part.dtype] for g in groups for _, s in g.items() for part in s.page_parts()),
        default=1,
    )


def page_classes(groups: Sequence[KVCacheGroupSpec], layout: KVCacheLayout) -> PageClasses:
    """The page classes and the large page of ``groups`` laid out in ``layout``.

    Args:
        groups: The KV cache groups, each with its natural pages (at least one).
        layout: ``"layer_outer"`` or ``"block_outer"``.
    """
    pages = [group_page_bytes(group, layout) for group in groups]
    natural = tuple(sorted(set(pages)))
    alignments = []
    for page in natural:
        members = [g for g, p in zip(groups, pages, strict=True) if p == page]
        alignments.append(_element_alignment(members))
    # A page whose parts end off their element size is rounded up first, so
    # that every small page of it starts on an element.
    aligned = [cdiv(page, a) * a for page, a in zip(natural, alignments, strict=True)]
    large, padded = choose_large_page(aligned, alignments)
    runs = max(len(group.layer_names) for group in groups) if layout == "layer_outer" else 1
    return PageClasses(
        natural_page_bytes=natural,
        class_page_bytes=padded,
        group_classes=tuple(natural.index(page) for page in pages),
        large_page_bytes=large,
        num_runs=runs,
        lcm=padded == natural,
        layout=layout,
    )


def choose_large_page(
    pages: Sequence[int], alignments: Sequence[int] | None = None
) -> tuple[int, tuple[int, ...]]:
    """The large page for class pages ``pages``, and each class's page in it.

    Args:
        pages: The class pages, in bytes, each a multiple of its alignment.
        alignments: Bytes each class's padded page must stay a multiple of
            (its largest element), by class; default 1.

    Returns:
        ``(large page bytes, class pages)``: the lcm and the pages unchanged
        when the lcm is within :data:`MAX_LARGE_PAGE_MULTIPLE` times the
        largest page; otherwise a multiple of the largest page and the
        pages padded up to divisors of it (see the module docstring).
    """
    align = [1] * len(pages) if alignments is None else list(alignments)
    largest = max(pages)
    lcm = math.lcm(*pages)
    if lcm <= MAX_LARGE_PAGE_MULTIPLE * largest:
        return lcm, tuple(pages)
    best: tuple[float, int, tuple[int, ...]] | None = None
    for multiple in range(1, MAX_LARGE_PAGE_MULTIPLE + 1):
        large = multiple * largest
        divisors = sorted(_divisors(large, multiple, largest))
        padded = tuple(
            _smallest_divisor_at_least(divisors, page, a)
            for page, a in zip(pages, align, strict=True)
        )
        if 0 in padded:
            continue  # a class's elements cannot be aligned in this large page
        worst = max((q - p) / q for p, q in zip(pages, padded, strict=True))
        if worst < MAX_CLASS_PADDING:
            return large, padded
        if best is None or worst < best[0]:
            best = (worst, large, padded)
    if best is None:  # only when even the largest page breaks an alignment
        return lcm, tuple(pages)
    return best[1], best[2]


def _smallest_divisor_at_least(divisors: Sequence[int], page: int, alignment: int) -> int:
    """The smallest of ``divisors`` (sorted) that holds ``page`` and is a multiple of ``alignment``.

    0 when none is.
    """
    return next((d for d in divisors if d >= page and d % alignment == 0), 0)


def _divisors(number: int, multiple: int, largest: int) -> Iterator[int]:
    """Every divisor of ``number`` = ``multiple × largest``, from both factorizations."""
    factors: dict[int, int] = {}
    for part in (multiple, largest):
        for prime, power in _factorize(part).items():
            factors[prime] = factors.get(prime, 0) + power
    divisors = [1]
    for prime, power in factors.items():
        divisors = [d * prime**e for d in divisors for e in range(power + 1)]
    assert math.prod(p**e for p, e in factors.items()) == number
    yield from divisors


def _factorize(number: int) -> dict[int, int]:
    """Prime factors of ``number`` (trial division: pages are at most a few GiB)."""
    factors: dict[int, int] = {}
    candidate = 2
    while candidate * candidate <= number:
        while number % candidate == 0:
            factors[candidate] = factors.get(candidate, 0) + 1
            number //= candidate
        candidate += 1 if candidate == 2 else 2
    if number > 1:
        factors[number] = factors.get(number, 0) + 1
    return factors
