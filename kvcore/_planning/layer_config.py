"""What planning tells plugins about a layer: :class:`LayerConfig`, handed to a kind's builder.

What plugins tell planning (layer kinds, plan options) are the hook value
types of :mod:`kvcore._plugin_types`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kvcore._planning.fields import ConfigFields
from kvcore.errors import InvalidConfigError
from kvcore.specs import KVFormat, non_negative_int, positive_int

__all__ = ["LayerConfig"]


def _read_only(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class LayerConfig(ConfigFields):
    """One cache-holding layer of a model, as handed to a layer-kind builder.

    See the :func:`~kvcore.hookspecs.kvcore_layer_kinds` hook. Read config
    fields with the :class:`~kvcore.planning.ConfigFields` readers (``require_int``,
    ``get_int``, ``require``, ``get``): their errors name the model, the file,
    the layer and the field, so a builder never needs its own checks for a
    missing or malformed field.

    Attributes:
        name: The layer's name, e.g. ``"model.layers.5.self_attn"``; the
            planned groups and tensors use it.
        index: Index of the decoder layer the cache belongs to.
        kind: The layer kind (``"full_attention"``, ``"sliding_window"``,
            ``"mamba"``, ...).
        model: The model's name, for messages.
        source: The config file the fields come from, for messages.
        config: The model's (text) config, read-only: the ``config.json``
            fields, with a nested ``text_config`` merged over the top level.
        block_size: Tokens per block of attention layers.
        dtype: Element type of the KV cache: a plain dtype's canonical name,
            or the :class:`~kvcore.specs.KVFormat` the user planned with
            (attention specs take either as their ``dtype``; a type that does
            not store the format refuses it).
        state_dtype: Element type of recurrent states (the model's dtype: a
            KV cache dtype such as fp8 does not apply to them).
        max_model_len: The longest request planned for, in tokens.
        options: The values of the options of the plugin claiming the kind
            (:class:`PlanOption`, by option name), defaults filled in.
    """

    name: str
    index: int = attrs.field(validator=non_negative_int)
    kind: str
    model: str
    source: str = ""
    config: Mapping[str, Any] = attrs.field(converter=_read_only, eq=False, repr=False)
    block_size: int = attrs.field(validator=positive_int)
    dtype: str | KVFormat
    state_dtype: str
    max_model_len: int = attrs.field(validator=positive_int)
    options: Mapping[str, str] = attrs.field(factory=dict, converter=_read_only)

    def _where(self) -> str:
        source = f" ({self.source})" if self.source else ""
        return f"model {self.model!r}{source}: layer {self.name!r} ({self.kind})"

    def option(self, name: str) -> str:
        """The value of this plugin's plan option ``name``.

        Raises:
            InvalidConfigError: the plugin declares no such option (a typo in
                the plugin: declare it in ``kvcore_plan_options``).
        """
        try:
            return self.options[name]
        except KeyError:
            known = ", ".join(sorted(self.options)) or "none"
            msg = (
                f"layer kind {self.kind!r} reads plan option {name!r}, which its plugin does "
                f"not declare (declared: {known}); declare it in kvcore_plan_options"
            )
            raise InvalidConfigError(msg) from None

    @property
    def num_attention_heads(self) -> int:
        """Query heads (``num_attention_heads`` or ``decoder_attention_heads``), at least 1."""
        return self.require_int("num_attention_heads", "decoder_attention_heads")

    @property
    def num_kv_heads(self) -> int:
        """The KV heads, ``num_key_value_heads``, else the query heads."""
        return self.get_int("num_key_value_heads", default=0) or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """``head_dim``, else the hidden size (``hidden_size``/``d_model``) over the heads.

        Raises:
            InvalidConfigError: a field is missing or not a positive integer,
                or the hidden size is not a multiple of the heads.
        """
        value = self.get_int("head_dim", default=0)
        if value:
            return value
        hidden = self.require_int("hidden_size", "d_model")
        heads = self.num_attention_heads
        if hidden % heads:
            msg = (
                f"{self._where()}: the hidden size ({hidden}) is not a multiple of "
                f"num_attention_heads ({heads}), so the head size is not a whole number; "
                "give head_dim in the config.json"
            )
            raise InvalidConfigError(msg)
        return hidden // heads
