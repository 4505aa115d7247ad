"""What a plan reports per group: pages, blocks per request and wasted bytes.

Waste is memory allocated with a block but used by no layer. Every block
costs the widest group's bytes, so a block owned by a group with fewer layer
slots (a *padding* slot: ``bytes_per_block - group's pages``) or with padded
pages (``page - real page`` per layer) wastes bytes for as long as the group
holds it. The bytes a request wastes are therefore each group's waste per
block times the blocks the request holds in that group.

In a two-level pool a block costs its group's class page in every backing
run: the waste per block is then the class padding (a small page padded to
divide the large page), the runs a layer-outer group with fewer layers leaves
empty (padding slots) and pages smaller than the group's page.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import attrs

from kvcore._config import KVCacheGroupSpec
from kvcore._planning.layout import bytes_per_block
from kvcore._planning.needs import pages_per_request
from kvcore._planning.page_classes import PageClasses
from kvcore._planning.two_level import block_waste
from kvcore.specs import TokenLimits

__all__ = ["GroupReport", "group_reports", "short_layer_list"]


@attrs.frozen(kw_only=True)
class GroupReport:
    """One KV cache group of a plan, with its share of the waste.

    Attributes:
        index: The group id.
        kind: The attention type (the group spec's ``kind``).
        spec_class: Name of the group spec's class.
        layer_names: The group's layers.
        block_size: Tokens per block.
        page_sizes: The distinct page sizes of its layers, in bytes.
        real_page_sizes: The same pages without padding, in bytes.
        bytes_per_block: Bytes one block of this group uses (its pages).
        padding_bytes_per_block: Bytes of each block the group owns that no
            layer of it uses because the widest group needs more (padding
            layer slots).
        padded_page_bytes_per_block: Bytes of each block lost to padded pages
            (pages grown past their contents to match other layers).
        pages_per_request: Blocks one request of ``max_model_len`` tokens
            holds in this group.
        padding_slots: Layer slots left empty, when the group's pages all have
            one size (else 0).
        page_class: The group's page class in a two-level pool (``None``: the
            shared pool).
    """

    index: int
    kind: str
    spec_class: str
    layer_names: tuple[str, ...]
    block_size: int
    page_sizes: tuple[int, ...]
    real_page_sizes: tuple[int, ...]
    bytes_per_block: int
    padding_bytes_per_block: int
    padded_page_bytes_per_block: int
    pages_per_request: int
    padding_slots: int
    page_class: int | None = None

    @property
    def num_layers(self) -> int:
        """Layers in the group."""
        return len(self.layer_names)

    @property
    def wasted_bytes_per_block(self) -> int:
        """Bytes of every block this group owns that hold nothing."""
        return self.padding_bytes_per_block + self.padded_page_bytes_per_block

    @property
    def wasted_bytes_per_request(self) -> int:
        """Bytes one request of ``max_model_len`` tokens wastes in this group."""
        return self.wasted_bytes_per_block * self.pages_per_request

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields and the derived waste."""
        fields = attrs.asdict(self)
        fields["layer_names"] = list(self.layer_names)
        fields["page_sizes"] = list(self.page_sizes)
        fields["real_page_sizes"] = list(self.real_page_sizes)
        fields["num_layers"] = self.num_layers
        fields["wasted_bytes_per_block"] = self.wasted_bytes_per_block
        fields["wasted_bytes_per_request"] = self.wasted_bytes_per_request
        if self.page_class is None:
            del fields["page_class"]
        return fields


def group_reports(
    groups: Sequence[KVCacheGroupSpec],
    limits: TokenLimits,
    classes: PageClasses | None = None,
) -> list[GroupReport]:
    """A :class:`GroupReport` per group, with ``limits`` deciding blocks per request.

    ``classes``: the page classes of a two-level pool (``None``: the shared pool).
    """
    widest = bytes_per_block(groups)
    reports = []
    for index, group in enumerate(groups):
        specs = [spec for _, spec in group.items()]
        pages = sorted({spec.page_size_bytes for spec in specs})
        real = sum(spec.real_page_size_bytes for spec in specs)
        if classes is None:
            padding = widest - group.bytes_per_block
            slots = padding // pages[0] if len(pages) == 1 else 0
            padded = group.bytes_per_block - real
            klass = None
        else:
            klass = classes.group_classes[index]
            slots = classes.num_runs - len(specs) if classes.layout == "layer_outer" else 0
            waste = block_waste(classes, index, group)
            padding = waste["padding layer slots"]
            padded = waste["class padding"] + waste["padded pages"]
        reports.append(
            GroupReport(
                index=index,
                kind=group.kv_cache_spec.kind,
                spec_class=type(group.kv_cache_spec).__name__,
                layer_names=group.layer_names,
                block_size=group.kv_cache_spec.block_size,
                page_sizes=tuple(pages),
                real_page_sizes=tuple(sorted({spec.real_page_size_bytes for spec in specs})),
                bytes_per_block=group.bytes_per_block,
                padding_bytes_per_block=padding,
                padded_page_bytes_per_block=padded,
                pages_per_request=pages_per_request(group, limits),
                padding_slots=slots,
                page_class=klass,
            )
        )
    return reports


_INDEX = re.compile(r"\.(\d+)(?:\.|$)")


def short_layer_list(names: Sequence[str], limit: int = 6) -> str:
    """Layer indices (or names) in a short form: ``"5,11,17,…,59"``."""
    indices = []
    for name in names:
        match = _INDEX.search(name)
        indices.append(match.group(1) if match else name)
    if len(indices) <= limit:
        return ",".join(indices)
    return ",".join([*indices[: limit - 2], "…", indices[-1]])
