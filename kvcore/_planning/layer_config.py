"""What a plugin's layer-kind builder is told about one layer of a model."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kvcore.errors import InvalidConfigError
from kvcore.specs import non_negative_int, positive_int

__all__ = ["LayerConfig"]

_MISSING = object()


def _read_only(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class LayerConfig:
    """One cache-holding layer of a model, as handed to a layer-kind builder.

    See the :func:`~kvcore.hookspecs.kvcore_layer_kinds` hook.

    Attributes:
        name: The layer's name, e.g. ``"model.layers.5.self_attn"``; the
            planned groups and tensors use it.
        index: Index of the decoder layer the cache belongs to.
        kind: The layer kind (``"full_attention"``, ``"sliding_attention"``,
            ``"mamba"``, ...).
        model: The model's name, for messages.
        config: The model's (text) config, read-only: the ``config.json``
            fields, with a nested ``text_config`` merged over the top level.
        block_size: Tokens per block of attention layers.
        dtype: Element type of the KV cache (canonical name).
        state_dtype: Element type of recurrent states (the model's dtype: a
            KV cache dtype such as fp8 does not apply to them).
        max_model_len: The longest request planned for, in tokens.
        mamba_cache_mode: ``"align"`` (states cached per block, block size of
            the attention layers) or ``"none"`` (one state per request).
    """

    name: str
    index: int = attrs.field(validator=non_negative_int)
    kind: str
    model: str
    config: Mapping[str, Any] = attrs.field(converter=_read_only, eq=False, repr=False)
    block_size: int = attrs.field(validator=positive_int)
    dtype: str
    state_dtype: str
    max_model_len: int = attrs.field(validator=positive_int)
    mamba_cache_mode: str = "align"

    def get(self, *keys: str, default: Any = None) -> Any:
        """The value of the first of ``keys`` present (and not null) in the config."""
        for key in keys:
            value = self.config.get(key)
            if value is not None:
                return value
        return default

    def require(self, *keys: str) -> Any:
        """Like :meth:`get`, but a missing field is an error.

        Raises:
            InvalidConfigError: none of ``keys`` is in the config; the message
                names the model, the layer and the field.
        """
        value = self.get(*keys, default=_MISSING)
        if value is _MISSING:
            names = " or ".join(repr(key) for key in keys)
            msg = (
                f"model {self.model!r}: layer {self.name!r} ({self.kind}) needs {names} in "
                "its config.json; add the field"
            )
            raise InvalidConfigError(msg)
        return value

    @property
    def num_attention_heads(self) -> int:
        """Query heads (``num_attention_heads`` or ``decoder_attention_heads``)."""
        return int(self.require("num_attention_heads", "decoder_attention_heads"))

    @property
    def num_kv_heads(self) -> int:
        """The KV heads, ``num_key_value_heads``, else the query heads."""
        value = self.get("num_key_value_heads")
        return int(value) if value is not None else self.num_attention_heads

    @property
    def head_size(self) -> int:
        """``head_dim``, else the hidden size (``hidden_size``/``d_model``) over the heads."""
        value = self.get("head_dim")
        if value is not None:
            return int(value)
        return int(self.require("hidden_size", "d_model")) // self.num_attention_heads
