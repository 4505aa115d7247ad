"""The value types plugin hooks return: below the hooks, the registry and planning.

* :class:`LayerType`: an attention type, a spec class and the manager serving
  it (the :func:`~kvcore.hookspecs.kvcore_layer_types` hook).
* :class:`LayerKind`: a layer kind a plugin builds specs for (the
  :func:`~kvcore.hookspecs.kvcore_layer_kinds` hook).
* :class:`PlanOption`: an option a plugin reads while its layers are built
  (the :func:`~kvcore.hookspecs.kvcore_plan_options` hook).
* :class:`ModelLayer`: one cache-holding layer of a model (the
  :func:`~kvcore.hookspecs.kvcore_model_layers` hook).

They import nothing of the plugin system or of planning (what a builder is
given, a ``LayerConfig``, is planning's), so the hooks, the registry and
planning can all use them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeAlias

import attrs

from kvcore.errors import InvalidConfigError
from kvcore.specs import KIND_PATTERN, KVCacheSpec, SpecT

if TYPE_CHECKING:
    from kvcore._planning.layer_config import LayerConfig
    from kvcore.managers import SingleTypeManager

__all__ = ["LayerBuilder", "LayerKind", "LayerType", "ModelLayer", "PlanOption"]


@attrs.frozen
class LayerType(Generic[SpecT]):
    """An attention type a plugin provides: a spec class and the manager serving it.

    Attributes:
        spec: The spec class (a subclass of :class:`kvcore.specs.KVCacheSpec`).
            Lookups use this exact class: a subclass is not served unless it is
            registered too.
        manager: The manager class (a subclass of
            :class:`kvcore.managers.SingleTypeManager`).
    """

    spec: type[SpecT]
    manager: type[SingleTypeManager[SpecT]]


def _names(value: Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _check_name(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    names = value if isinstance(value, tuple) else (value,)
    for name in names:
        if not isinstance(name, str) or not KIND_PATTERN.fullmatch(name):
            msg = (
                f"{type(instance).__name__}.{attribute.name}: {name!r} is not a name of "
                "lowercase words joined by underscores"
            )
            raise InvalidConfigError(msg)


#: Builds the spec of one layer of a kind from its :class:`~kvcore.planning.LayerConfig`.
LayerBuilder: TypeAlias = "Callable[[LayerConfig], KVCacheSpec]"


@attrs.frozen
class LayerKind:
    """A layer kind a plugin builds specs for, from a model's ``config.json``.

    Returned by the :func:`~kvcore.hookspecs.kvcore_layer_kinds` hook.

    Attributes:
        name: The kind's name; for a type with one kind, the type's name
            (its spec's :attr:`~kvcore.specs.KVCacheSpec.kind`). Model configs
            give it in their ``layer_types`` list.
        build: Builds the layer's spec from its :class:`~kvcore.planning.LayerConfig`.
        aliases: Other names model configs use for this kind (Hugging Face's
            ``layer_types`` vocabulary, e.g. ``"sliding_attention"``),
            accepted silently.
        deprecated_aliases: Former kvcore names of this kind, accepted with a
            ``DeprecationWarning``.
        module_name: The layer's module inside a decoder layer, the last part
            of its name (``"model.layers.3.<module_name>"``).
    """

    name: str = attrs.field(validator=_check_name)
    build: LayerBuilder
    aliases: tuple[str, ...] = attrs.field(
        default=(), converter=_names, validator=_check_name, kw_only=True
    )
    deprecated_aliases: tuple[str, ...] = attrs.field(
        default=(), converter=_names, validator=_check_name, kw_only=True
    )
    module_name: str = attrs.field(default="self_attn", kw_only=True)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name of the kind (its name, its aliases, its deprecated aliases)."""
        return (self.name, *self.aliases, *self.deprecated_aliases)


def _choices(value: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if value is None else _names(value)


@attrs.frozen(kw_only=True)
class PlanOption:
    """An option a plugin reads while its layers are built (``LayerConfig.option``).

    Returned by the :func:`~kvcore.hookspecs.kvcore_plan_options` hook. Users
    set it as ``"<plugin>.<name>"``: ``kvcore.plan(model, options={...})`` or
    ``kvcore plan MODEL --option <plugin>.<name>=<value>``. An unknown option
    or a value outside ``choices`` is refused before any layer is built.

    Attributes:
        name: The option's name within the plugin.
        default: Its value when not set.
        choices: The values it accepts (``None``: any string).
        help: One sentence for ``kvcore plugins`` and the documentation.
    """

    name: str = attrs.field(validator=_check_name)
    default: str
    choices: tuple[str, ...] | None = attrs.field(default=None, converter=_choices)
    help: str = ""

    def __attrs_post_init__(self) -> None:
        if self.choices is not None and self.default not in self.choices:
            msg = (
                f"PlanOption {self.name!r}: its default {self.default!r} is not one of its "
                f"choices {list(self.choices)}"
            )
            raise InvalidConfigError(msg)


@attrs.frozen(kw_only=True)
class ModelLayer:
    """One cache-holding layer of a model: its name, decoder layer index and layer kind.

    Attributes:
        name: The layer's name (``"model.layers.5.self_attn"``), used by the
            planned groups and tensors.
        index: Index of the decoder layer it belongs to.
        kind: Its layer kind (see :class:`~kvcore.planning.LayerKind`).
    """

    name: str
    index: int
    kind: str
