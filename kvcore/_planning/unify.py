"""Making layer specs compatible: one page size, or every local layer allocated as full.

Three transformations, each asking the spec classes what their type allows:

* :func:`unify_page_sizes` gives every layer the largest page
  (:meth:`~kvcore.specs.KVCacheSpec.grown_to_page`: attention scales its block
  size by a whole ratio or pads, a state pads, MLA refuses to pad).
* :func:`promote_local_layers` is the unified mode of engines that disable the
  hybrid manager: layers of local types are allocated for every token, as the
  spec class their type names in :attr:`~kvcore.specs.KVCacheSpec.promoted_to`
  (through its :meth:`~kvcore.specs.KVCacheSpec.allocating_for`).
* :func:`full_allocation_fallback` is tried when pages cannot be unified: the
  same promotion, limited to the layers and cases the reference engine allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvcore.errors import InvalidConfigError, InvalidSpecError
from kvcore.specs import ALL_TOKENS_KEY, KVCacheSpec

__all__ = [
    "PageUnificationError",
    "full_allocation_fallback",
    "is_uniform_spec",
    "is_uniform_type",
    "promote_local_layers",
    "unify_page_sizes",
]


class PageUnificationError(InvalidConfigError):
    """A layer's page cannot be grown to the largest page of the model."""


def is_uniform_spec(specs: Sequence[KVCacheSpec]) -> bool:
    """Whether all the specs merge into one (the whole model can be one group).

    Unlike the reference, which lets a ``ValueError`` of ``merge`` (two
    different recorded windows) escape from grouping, any refusal of
    ``merge`` means "not uniform" here.
    """
    if not specs:
        return True
    try:
        type(specs[0]).merge(specs)
    except InvalidSpecError:
        return False
    return True


def is_uniform_type(specs: Sequence[KVCacheSpec]) -> bool:
    """Whether the specs need the same token slots: equal block sizes and type keys.

    Such layers can share one block table although their pages differ.
    """
    if not specs:
        return False
    first = specs[0]
    key = first.uniform_type_key
    return all(
        spec.block_size == first.block_size and spec.uniform_type_key == key for spec in specs
    )


def unify_page_sizes(layer_specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Give every layer the largest page of the model.

    Layers already at the largest page are kept as they are; every other
    layer's spec is asked to grow its page (:meth:`KVCacheSpec.grown_to_page`).

    Raises:
        PageUnificationError: a layer's type cannot take the largest page; the
            message names the layer, both page sizes and what would help.
        InvalidSpecError: a grown spec is invalid (a sink or chunk length the
            scaled block size no longer divides), naming the layer.
    """
    pages = {spec.page_size_bytes for spec in layer_specs.values()}
    if len(pages) <= 1:
        return dict(layer_specs)
    target = max(pages)
    unified: dict[str, KVCacheSpec] = {}
    for name, spec in layer_specs.items():
        if spec.page_size_bytes == target:
            unified[name] = spec
            continue
        try:
            grown = spec.grown_to_page(target)
        except InvalidSpecError as exc:
            msg = f"layer {name!r}: growing its page to {target} bytes gives an invalid spec: {exc}"
            raise InvalidSpecError(msg) from exc
        if grown is None:
            msg = (
                f"layer {name!r} ({type(spec).__name__}, page {spec.page_size_bytes} bytes) "
                f"cannot take the model's largest page ({target} bytes): its type neither "
                f"scales its block size by {target / spec.page_size_bytes:.3g} nor pads its "
                "page. Use a block-outer layout (layout='block_outer', pages of different "
                "sizes packed side by side), or change the block size or dtype of the "
                "layers so that the pages divide each other"
            )
            raise PageUnificationError(msg)
        if grown.page_size_bytes != target:
            msg = (
                f"{type(spec).__name__}.grown_to_page({target}) returned a spec with a "
                f"{grown.page_size_bytes}-byte page for layer {name!r}; it must return the "
                "requested page or None"
            )
            raise InvalidSpecError(msg)
        unified[name] = grown
    return unified


def _promote(layer_specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Allocate local layers for every token when the model has layers that keep every token."""
    specs = dict(layer_specs)
    values = list(specs.values())
    if is_uniform_spec(values) or is_uniform_type(values):
        return specs
    keeps_all = any(spec.attends_to_all_tokens for spec in values)
    local = {name: spec for name, spec in specs.items() if spec.promoted_to is not None}
    if keeps_all and local:
        all_block_sizes = {spec.block_size for spec in values if spec.attends_to_all_tokens}
        common = next(iter(all_block_sizes)) if len(all_block_sizes) == 1 else None
        for name, spec in local.items():
            host = spec.promoted_to
            assert host is not None
            specs[name] = host.allocating_for(spec, common or spec.block_size)
    return specs


def promote_local_layers(layer_specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """The unified mode: every local layer allocated for every token.

    For engines that disable the hybrid manager (one block table for all
    layers). When the model mixes layers that keep every token with layers
    of local types (those naming a :attr:`~kvcore.specs.KVCacheSpec.promoted_to`
    class), each local layer's spec becomes that class's, recording the
    local spec for compute, with the block size of the layers keeping every
    token if they agree on one. Memory savings of windows are lost; windowed
    compute is kept.

    Raises:
        InvalidConfigError: the promoted layers still cannot share one block
            table (no layer keeps every token, or several types are left).
    """
    promoted = _promote(layer_specs)
    values = list(promoted.values())
    if values and not (is_uniform_spec(values) or is_uniform_type(values)):
        kinds = sorted({spec.kind for spec in values})
        msg = (
            "the hybrid KV cache manager is disabled, but the layers "
            f"({', '.join(kinds)}) cannot be allocated as one type: only layers of local "
            "types (promoted_to) in a model with layers that keep every token can be "
            "allocated for every token. Enable the hybrid manager (hybrid=True)"
        )
        raise InvalidConfigError(msg + _all_tokens_hint(values))
    return promoted


def _all_tokens_hint(specs: Sequence[KVCacheSpec]) -> str:
    """A hint for a type that may keep every token but does not share the table key."""
    if not any(spec.uniform_type_key == ALL_TOKENS_KEY for spec in specs):
        return ""
    apart = sorted(
        {
            type(spec).__qualname__
            for spec in specs
            if spec.promoted_to is None and spec.uniform_type_key != ALL_TOKENS_KEY
        }
    )
    if not apart:
        return ""
    return (
        f". If {', '.join(apart)} keeps a slot for every token of a request, as full "
        "attention does, its spec class says so (attends_to_all_tokens = True, and "
        "uniform_type_key returning kvcore.specs.ALL_TOKENS_KEY): layers of such types "
        "share one block table"
    )


def full_allocation_fallback(
    layer_specs: Mapping[str, KVCacheSpec],
) -> tuple[list[str], list[KVCacheSpec]] | None:
    """The allocation-only fallback for pages that cannot be unified, if it applies.

    Applies only when a layer type that enables it is present, a promotable
    local type is present and no type blocks it (see
    :data:`~kvcore.specs.FallbackRole`): the local layers are then allocated
    for every token, and if all layers need the same token slots they form
    one group. Compute stays local.

    Returns:
        The layer names and their promoted specs (one group), or ``None``.
    """
    roles = {spec.full_allocation_fallback for spec in layer_specs.values()}
    if "blocks" in roles or not {"enables", "promotable"} <= roles:
        return None
    promoted = _promote(layer_specs)
    values = list(promoted.values())
    if not is_uniform_type(values):
        return None
    return list(promoted), values
