"""What a plugin's ``kvcore_model_layers`` hook is given: a model's ``config.json`` fields.

Below the hooks (:mod:`kvcore.hookspecs` names the type) and above nothing
but the field readers and the plugin record types, so that the hook table
and the config reader both stand on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from kvcore._planning.fields import ConfigFields
from kvcore._plugin_types import ModelLayer
from kvcore.errors import InvalidConfigError

__all__ = ["ModelFields"]

#: Decoder layers a config may declare.
_MAX_LAYERS = 10_000


def _read_only(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class ModelFields(ConfigFields):
    """A model's ``config.json`` fields, as the ``kvcore_model_layers`` hook sees them.

    Read fields with the :class:`~kvcore.planning.ConfigFields` readers
    (``require_int``, ``get_int``, ``require``, ``get``): their errors name
    the model, the file and the field.

    Attributes:
        name: The model's name (shipped name, or the config's directory).
        source: The file the fields were read from.
        config: The fields, read-only; a nested ``text_config`` is merged over
            the top level.
        module_names: Layer kind → the module name of its layers (from the
            registry's :class:`~kvcore.planning.LayerKind` records).
    """

    name: str
    source: str
    config: Mapping[str, Any] = attrs.field(converter=_read_only, eq=False, repr=False)
    module_names: Mapping[str, str] = attrs.field(
        factory=dict, converter=_read_only, eq=False, repr=False
    )

    def _where(self) -> str:
        return f"model {self.name!r} ({self.source})"

    @property
    def num_hidden_layers(self) -> int:
        """Decoder layers (``num_hidden_layers``), from 1 to 10,000.

        Raises:
            InvalidConfigError: missing, not a positive integer, or past
                10,000 (no model has nearly so many; the bound keeps a typo
                from building a billion layers).
        """
        count = self.require_int("num_hidden_layers")
        if count > _MAX_LAYERS:
            msg = (
                f"{self._where()}: num_hidden_layers must be at most {_MAX_LAYERS} (no model has "
                f"nearly so many decoder layers), got {count}; fix num_hidden_layers in the "
                "config.json"
            )
            raise InvalidConfigError(msg)
        return count

    @property
    def layer_types(self) -> list[str] | None:
        """The config's ``layer_types`` list (one layer kind per decoder layer), or ``None``.

        Raises:
            InvalidConfigError: it is not a list of strings with one entry per
                layer.
        """
        value = self.config.get("layer_types")
        if value is None:
            return None
        count = self.num_hidden_layers
        if (
            not isinstance(value, list)
            or len(value) != count
            or not all(isinstance(kind, str) for kind in value)
        ):
            msg = (
                f"{self._where()}: layer_types must list one kind per layer ({count} layers, "
                f"num_hidden_layers), as strings, got {value!r}; fix layer_types"
            )
            raise InvalidConfigError(msg)
        return list(value)

    def decoder_layers(
        self, kinds: Sequence[str], *, prefix: str = "model.layers"
    ) -> tuple[ModelLayer, ...]:
        """One layer per decoder layer, of the given kinds, named ``<prefix>.<i>.<module>``.

        ``<module>`` is the kind's ``module_name`` (:class:`~kvcore.planning.LayerKind`)
        (``"self_attn"`` for a kind no selected plugin claims).
        """
        return tuple(
            ModelLayer(
                name=f"{prefix}.{i}.{self.module_names.get(kind, 'self_attn')}", index=i, kind=kind
            )
            for i, kind in enumerate(kinds)
        )
