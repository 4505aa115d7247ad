"""Which pool a plan is for, and the grid Mamba states are checkpointed on.

``pool="shared"`` is the reference engine's design: one page size for every
group (state pages aligned with attention pages, pages unified, the block
size raised until an attention page holds a state). ``pool="two-level"``
keeps every group's natural block size and page and carves them from large
pages (:mod:`.page_classes`). ``pool="auto"`` (the default) is two-level
exactly when the layers' natural pages differ, so a model whose layers all
have one page plans as it always did.

Under the two-level pool a state's block size is no longer tied to the
attention block: how often a group of states keeps one (a checkpoint every
``mamba_checkpoint`` tokens) is its own choice, a multiple of the attention
block size so that checkpoints fall on block boundaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from kvcore._utils import cdiv
from kvcore.errors import InvalidConfigError
from kvcore.specs import KVCacheSpec

__all__ = [
    "DEFAULT_MAMBA_CHECKPOINT",
    "POOLS",
    "PoolChoice",
    "ResolvedPool",
    "check_pool",
    "check_shared_checkpoint",
    "checkpoint_states",
    "default_mamba_checkpoint",
    "resolve_pool",
]

#: The pool a plan is for: ``"auto"`` (two-level where the layers' pages
#: differ, else shared), ``"shared"`` or ``"two-level"``.
PoolChoice = Literal["auto", "shared", "two-level"]
#: A pool ``"auto"`` resolved to.
ResolvedPool = Literal["shared", "two-level"]
#: The values ``pool`` takes.
POOLS: Final[tuple[PoolChoice, ...]] = ("auto", "shared", "two-level")
#: Tokens between two cached states of a Mamba group under the two-level pool
#: when ``mamba_checkpoint`` is not given (rounded up to a multiple of the
#: attention block size). Provisional: about the 544-token grid the shared
#: pool gives Qwen3-Next, with the state slots a step spans no more than there.
DEFAULT_MAMBA_CHECKPOINT: Final = 512


def check_pool(pool: object) -> None:
    """Refuse a ``pool`` that is not one of :data:`POOLS`, naming them.

    Raises:
        InvalidConfigError: an unknown pool.
    """
    if pool not in POOLS:
        msg = f"pool must be one of {', '.join(POOLS)}, got {pool!r}"
        raise InvalidConfigError(msg)


def resolve_pool(pool: object, layer_specs: Mapping[str, KVCacheSpec]) -> ResolvedPool:
    """``"shared"`` or ``"two-level"``: ``pool``, with ``"auto"`` decided by the layers' pages.

    Raises:
        InvalidConfigError: ``pool`` is not one of :data:`POOLS`.
    """
    check_pool(pool)
    if pool == "auto":
        pages = {spec.page_size_bytes for spec in layer_specs.values()}
        return "two-level" if len(pages) > 1 else "shared"
    return "two-level" if pool == "two-level" else "shared"


def default_mamba_checkpoint(block_size: int) -> int:
    """:data:`DEFAULT_MAMBA_CHECKPOINT` rounded up to a multiple of ``block_size``."""
    return block_size * cdiv(DEFAULT_MAMBA_CHECKPOINT, block_size)


def _checkpointed(layer_specs: Mapping[str, KVCacheSpec], tokens: int) -> dict[str, KVCacheSpec]:
    """The state layers (pages that do not follow the block size) that take a ``tokens`` grid."""
    moved = {}
    for name, spec in layer_specs.items():
        if spec.page_size_follows_block_size:
            continue
        aligned = spec.aligned_to_attention_block_size(tokens)
        if aligned.block_size == tokens:
            moved[name] = aligned
    return moved


def _no_states(model: str) -> InvalidConfigError:
    msg = (
        f"mamba_checkpoint is given, but no layer of {model} keeps recurrent states cached on "
        "a grid (state layers in a cache mode that caches them at block boundaries); leave "
        "it unset"
    )
    return InvalidConfigError(msg)


def checkpoint_states(
    layer_specs: Mapping[str, KVCacheSpec],
    checkpoint: int | None,
    *,
    block_size: int,
    model: str,
) -> tuple[dict[str, KVCacheSpec], int | None]:
    """Give the cached state layers a block of ``checkpoint`` tokens (two-level pool).

    Args:
        layer_specs: Every layer's spec as built.
        checkpoint: Tokens between cached states; ``None``: the default
            (:func:`default_mamba_checkpoint`).
        block_size: The attention block size asked for.
        model: The model's name, for messages.

    Returns:
        The specs with the state layers moved to the grid, and the grid
        (``None`` when no layer keeps states on one).

    Raises:
        InvalidConfigError: ``checkpoint`` is not a positive multiple of
            ``block_size``, or is given for a model without such states.
    """
    if checkpoint is not None and (
        type(checkpoint) is not int or checkpoint <= 0 or checkpoint % block_size
    ):
        msg = (
            f"mamba_checkpoint must be a positive multiple of the attention block size "
            f"({block_size} tokens): {block_size}, {2 * block_size}, {3 * block_size}, ... "
            f"(default {default_mamba_checkpoint(block_size)}); got {checkpoint!r}"
        )
        raise InvalidConfigError(msg)
    tokens = default_mamba_checkpoint(block_size) if checkpoint is None else checkpoint
    moved = _checkpointed(layer_specs, tokens)
    if not moved:
        if checkpoint is not None:
            raise _no_states(model)
        return dict(layer_specs), None
    return {name: moved.get(name, spec) for name, spec in layer_specs.items()}, tokens


def check_shared_checkpoint(
    aligned_specs: Mapping[str, KVCacheSpec], checkpoint: int | None, *, model: str
) -> None:
    """Refuse a ``mamba_checkpoint`` the shared pool cannot give.

    In the shared pool the cached states follow the attention block size
    (raised until a page holds a state), so the only grid is that block size.

    Raises:
        InvalidConfigError: ``checkpoint`` differs from it, or the model keeps
            no states on a grid.
    """
    if checkpoint is None:
        return
    if type(checkpoint) is not int or checkpoint <= 0:
        msg = f"mamba_checkpoint must be a positive number of tokens, got {checkpoint!r}"
        raise InvalidConfigError(msg)
    following = _checkpointed(aligned_specs, checkpoint)
    if not following:
        raise _no_states(model)
    grids = {aligned_specs[name].block_size for name in following}
    if grids != {checkpoint}:
        shared = ", ".join(str(g) for g in sorted(grids))
        msg = (
            f"mamba_checkpoint={checkpoint!r}: under pool='shared' the cached states follow "
            f"the attention block size, {shared} tokens for {model}; give {shared} or leave "
            "mamba_checkpoint unset, or plan with pool='two-level' to checkpoint states on "
            "their own grid"
        )
        raise InvalidConfigError(msg)
