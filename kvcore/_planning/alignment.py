"""State / attention page alignment, done before grouping (reference: the platform step).

A recurrent state has a fixed page (its spec's
:attr:`~kvcore.specs.KVCacheSpec.page_size_follows_block_size` is false),
usually much larger than an attention page of 16 tokens. For both to share
block ids the attention block size is raised until an attention page holds a
state, and the state page is padded to the attention page:

``block = align × ceil(state page / (align × attention bytes per token))``

where ``align`` is the largest
:attr:`~kvcore.specs.KVCacheSpec.kernel_block_alignment` of the attention
types. Every spec is told the new block size
(:meth:`~kvcore.specs.KVCacheSpec.aligned_to_attention_block_size`): the spec
class decides whether it follows, so nothing here guesses a type's mode.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvcore._utils import cdiv
from kvcore.errors import InvalidSpecError
from kvcore.specs import KVCacheSpec

__all__ = ["align_state_pages", "attention_block_size_for_states"]


def attention_block_size_for_states(
    state_page: int, attention_bytes_per_token: int, alignment: int
) -> int:
    """Smallest multiple of ``alignment`` tokens whose attention page holds ``state_page`` bytes."""
    return alignment * cdiv(state_page, alignment * attention_bytes_per_token)


def align_state_pages(layer_specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Raise the attention block size to hold a state page, and pad the states to match.

    Models without both state layers and attention layers are returned
    unchanged. The attention block size is only ever raised: a block size
    already large enough is kept, and the states are padded up to its page.

    Raises:
        InvalidSpecError: an attention spec does not accept the new block size
            (a chunk or sink length it must divide), naming the layer.
    """
    specs = dict(layer_specs)
    states = {n: s for n, s in specs.items() if not s.page_size_follows_block_size}
    attention = {n: s for n, s in specs.items() if s.page_size_follows_block_size}
    if not states or not attention:
        return specs
    block_sizes = {s.block_size for s in attention.values()}
    current = max(block_sizes)
    per_token = min(s.real_page_size_bytes // s.block_size for s in attention.values())
    alignment = max(s.kernel_block_alignment for s in attention.values())
    state_page = max(s.real_page_size_bytes for s in states.values())
    target = max(current, attention_block_size_for_states(state_page, per_token, alignment))
    for name, spec in attention.items():
        if spec.block_size != target:
            try:
                specs[name] = spec.aligned_to_attention_block_size(target)
            except InvalidSpecError as exc:
                msg = (
                    f"layer {name!r}: the attention block size must grow to {target} tokens "
                    f"so that a page holds a {state_page}-byte state, but: {exc}"
                )
                raise InvalidSpecError(msg) from exc
    attention_page = min(specs[n].page_size_bytes for n in attention)
    for name, spec in states.items():
        aligned = spec.aligned_to_attention_block_size(target)
        grown = aligned.grown_to_page(attention_page)
        specs[name] = grown if grown is not None else aligned
    return specs
