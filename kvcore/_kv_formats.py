"""The KV formats a registry's spec classes declare, and resolving a cache dtype against them.

A spec class lists the quantized formats it stores in
:attr:`~kvcore.specs.AttentionSpec.kv_formats`. When a registry is built,
every declared format is collected here by name: one name, one format (two
plugins declaring *equal* formats share it). Planning then resolves what a
user names as the KV cache dtype (``kvcore plan --dtype``,
``kvcore.plan(dtype=...)``) to a plain dtype or to a declared format, and
refuses anything else, naming the choices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from kvcore._contract import qualname
from kvcore._plugin_calls import how_to_disable
from kvcore.errors import HookImplementationError, InvalidConfigError, PluginConflictError
from kvcore.specs import KVCacheSpec, KVFormat, dtype_name

__all__ = ["DeclaredFormat", "collect_kv_formats", "describe_kv_formats", "resolve_cache_dtype"]


@attrs.frozen
class DeclaredFormat:
    """One KV format of a registry and the spec classes that store it.

    Attributes:
        kv_format: The format.
        owners: ``(spec class, plugin name)`` of every class declaring it,
            in plugin order.
    """

    kv_format: KVFormat
    owners: tuple[tuple[type[KVCacheSpec], str], ...]

    def describe(self) -> str:
        """``name (Class of plugin 'p', ...)``, as messages list a format."""
        stored_by = ", ".join(f"{cls.__name__} of plugin {plugin!r}" for cls, plugin in self.owners)
        return f"{self.kv_format.name} ({stored_by})"


def _conflict(name: str, first: DeclaredFormat, cls: type, plugin: str) -> Exception:
    before, owner = first.owners[0]
    if owner == plugin:
        msg = (
            f"plugin {plugin!r} declares two different KV formats named {name!r} "
            f"({qualname(before)} and {qualname(cls)} in kv_formats); declare one format "
            "object and list it in both classes"
        )
        return HookImplementationError(msg)
    msg = (
        f"KV format {name!r} is declared differently by plugin {owner!r} "
        f"({qualname(before)}) and by plugin {plugin!r} ({qualname(cls)}); one name must mean "
        f"one page layout: disable one of the two plugins ({how_to_disable(plugin)})"
    )
    return PluginConflictError(msg)


def collect_kv_formats(
    spec_classes: Iterable[tuple[type[KVCacheSpec], str]],
) -> dict[str, DeclaredFormat]:
    """Format name → the format and the classes declaring it.

    Args:
        spec_classes: ``(spec class, plugin name)`` of every registered class,
            already checked against the spec contract.

    Raises:
        PluginConflictError: two plugins declare different formats of one name.
        HookImplementationError: one plugin does.
    """
    formats: dict[str, DeclaredFormat] = {}
    for cls, plugin in spec_classes:
        for kv_format in getattr(cls, "kv_formats", ()):
            known = formats.get(kv_format.name)
            if known is None:
                formats[kv_format.name] = DeclaredFormat(kv_format, ((cls, plugin),))
            elif known.kv_format != kv_format:
                raise _conflict(kv_format.name, known, cls, plugin)
            else:
                formats[kv_format.name] = attrs.evolve(known, owners=(*known.owners, (cls, plugin)))
    return formats


def describe_kv_formats(formats: Mapping[str, DeclaredFormat]) -> str:
    """Every declared format with the classes storing it, for messages; ``"none"`` if none."""
    return "; ".join(formats[name].describe() for name in sorted(formats)) or "none"


def resolve_cache_dtype(value: object, formats: Mapping[str, DeclaredFormat]) -> str | KVFormat:
    """What ``value`` names as a KV cache dtype: a plain dtype's canonical name, or a format.

    Args:
        value: A plain dtype (name, alias or ``torch.dtype``), a format's
            name, or a :class:`~kvcore.specs.KVFormat`.
        formats: The registry's declared formats.

    Raises:
        InvalidConfigError: ``value`` is neither a plain dtype nor a format
            of ``formats``; the message lists the plain dtypes and the formats
            with the classes that store them.
    """
    if isinstance(value, KVFormat):
        declared = formats.get(value.name)
        if declared is not None and declared.kv_format == value:
            return value
        msg = (
            f"dtype: KV format {value.name!r} is declared by no selected plugin; KV formats "
            f"the selected plugins declare: {describe_kv_formats(formats)}"
        )
        raise InvalidConfigError(msg)
    if isinstance(value, str) and value in formats:
        return formats[value].kv_format
    try:
        return dtype_name(value)
    except ValueError as exc:
        msg = (
            f"dtype: {exc}; KV formats the selected plugins declare: {describe_kv_formats(formats)}"
        )
        raise InvalidConfigError(msg) from None
