"""The notes of a plan: one sentence per change planning made to the layers as built."""

from __future__ import annotations

from kvcore._config import KVCacheGroupSpec
from kvcore._planning.pool_choice import default_mamba_checkpoint
from kvcore.specs import KVCacheSpec, TokenLimits

__all__ = ["fitted_note", "shared_notes", "two_level_notes"]


def fitted_note(limits: TokenLimits, model_max_len: int, *, fitted: bool) -> list[str]:
    """The note saying ``max_model_len`` was lowered to fit, if it was."""
    if fitted and limits.max_model_len < model_max_len:
        return [
            f"max_model_len lowered from the model's {model_max_len} to {limits.max_model_len} "
            "tokens, the longest request that fits"
        ]
    return []


def _promoted(
    layer_specs: dict[str, KVCacheSpec], groups: list[KVCacheGroupSpec]
) -> dict[tuple[str, str], int]:
    """``(kind as built, kind allocated as)`` → layers, for layers planning gave another class."""
    promoted: dict[tuple[str, str], int] = {}
    for group in groups:
        for name, spec in group.items():
            if type(spec) is not type(layer_specs[name]):
                key = (layer_specs[name].kind, spec.kind)
                promoted[key] = promoted.get(key, 0) + 1
    return promoted


def shared_notes(
    layer_specs: dict[str, KVCacheSpec],
    aligned: dict[str, KVCacheSpec],
    groups: list[KVCacheGroupSpec],
    limits: TokenLimits,
    model_max_len: int,
    hybrid: bool,
    *,
    fitted: bool,
) -> tuple[str, ...]:
    """One sentence per change planning made to fit the layers into one page size."""
    notes = []
    raised = {
        (spec.block_size, aligned[name].block_size)
        for name, spec in layer_specs.items()
        if spec.page_size_follows_block_size and aligned[name].block_size != spec.block_size
    }
    if raised:
        (before, after), *_ = sorted(raised)
        states = [s for s in aligned.values() if not s.page_size_follows_block_size]
        largest = max(s.real_page_size_bytes for s in states)
        notes.append(
            f"attention block size raised from {before} to {after} tokens so that a page "
            f"holds a {largest}-byte recurrent state"
        )
    final = {name: spec for group in groups for name, spec in group.items()}
    padded: dict[str, int] = {}
    for spec in final.values():
        if spec.page_size_bytes != spec.real_page_size_bytes:
            padded[spec.kind] = padded.get(spec.kind, 0) + 1
    if padded:
        which = ", ".join(f"{count} {kind}" for kind, count in padded.items())
        notes.append(f"pages padded to the common page size: {which} layers")
    promoted = _promoted(layer_specs, groups)
    reason = (
        "the hybrid manager is disabled"
        if not hybrid
        else "their pages cannot be unified with the others (allocation-only fallback)"
    )
    for (kind, as_kind), count in promoted.items():
        notes.append(
            f"{count} {kind} layers allocated as {as_kind} because {reason}; their attention "
            "compute is unchanged, their memory savings are lost"
        )
    notes += fitted_note(limits, model_max_len, fitted=fitted)
    return tuple(notes)


def two_level_notes(
    layer_specs: dict[str, KVCacheSpec],
    groups: list[KVCacheGroupSpec],
    limits: TokenLimits,
    model_max_len: int,
    *,
    checkpoint: int | None,
    block_size: int,
    refused: str | None,
    fitted: bool,
) -> tuple[str, ...]:
    """The notes of a two-level plan: the checkpoint grid, promoted layers, a lowered length.

    ``refused``: why a manager refused the default checkpoint grid, if it did.
    """
    notes = []
    if refused is not None:
        notes.append(
            f"recurrent states cached every {checkpoint} tokens, every attention block, not "
            f"every {default_mamba_checkpoint(block_size)}: with prefix caching on, {refused}"
        )
    elif checkpoint is not None:
        where = "every attention block" if checkpoint == block_size else "not every attention block"
        notes.append(
            f"recurrent states cached every {checkpoint} tokens (mamba_checkpoint), {where}"
        )
    for (kind, as_kind), count in _promoted(layer_specs, groups).items():
        notes.append(
            f"{count} {kind} layers allocated as {as_kind} because the hybrid manager is "
            "disabled; their attention compute is unchanged, their memory savings are lost"
        )
    notes += fitted_note(limits, model_max_len, fitted=fitted)
    return tuple(notes)
