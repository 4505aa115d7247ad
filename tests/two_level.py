"""Manager-only configs with a two-level pool, built by hand for tests of the core.

Every distinct page size is a class (largest first), the large page their
least common multiple; nothing here comes from planning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from kvcore import KVCacheConfig, PagePool
from kvcore.specs import KVCacheSpec


def two_level_config(specs: Sequence[KVCacheSpec], num_large_pages: int) -> KVCacheConfig:
    """One group per spec; large pages of the LCM of the page sizes."""
    pages = sorted({spec.page_size_bytes for spec in specs}, reverse=True)
    config = KVCacheConfig.from_specs(num_large_pages, list(specs))
    pool = PagePool(
        large_page_bytes=math.lcm(*pages),
        num_large_pages=num_large_pages,
        class_page_bytes=tuple(pages),
        group_classes=tuple(pages.index(spec.page_size_bytes) for spec in specs),
    )
    return attrs.evolve(config, page_pool=pool)
