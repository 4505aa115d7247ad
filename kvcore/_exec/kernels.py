"""Collecting the plugins' reference kernels (the ``kvcore_reference_kernels`` hook)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import pluggy

from kvcore import hookspecs
from kvcore._registry import Registry
from kvcore.errors import HookImplementationError, PluginConflictError, UnknownSpecError
from kvcore.reference import ReferenceKernel
from kvcore.specs import KVCacheSpec

__all__ = ["kernel_for", "reference_kernels"]


def _plugin_object(module: str) -> object:
    """The object a plugin's entry point names (``package.module`` or ``module:attr``)."""
    module_name, _, attribute = module.partition(":")
    target: object = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        target = getattr(target, part)
    return target


def reference_kernels(registry: Registry) -> dict[type[KVCacheSpec], ReferenceKernel]:
    """Spec class → reference kernel, from the registry's plugins.

    Each selected plugin's :func:`~kvcore.hookspecs.kvcore_reference_kernels`
    is called once. A plugin object that is not importable by its module name
    (an in-process object) provides no kernels.

    Raises:
        PluginConflictError: two plugins provide a kernel for one spec class.
        HookImplementationError: a plugin returns something other than a
            mapping of spec classes to :class:`~kvcore.reference.ReferenceKernel`
            instances.
    """
    # The registry keeps no plugin objects; this re-imports them by module
    # name, as planning does for kvcore_layer_kinds.
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    kernels: dict[type[KVCacheSpec], ReferenceKernel] = {}
    owners: dict[type[KVCacheSpec], str] = {}
    for info in registry.plugins:
        try:
            plugin = _plugin_object(info.module)
        except (ImportError, AttributeError):
            continue
        if not hasattr(plugin, "kvcore_reference_kernels"):
            continue
        manager.register(plugin, name=info.name)
        call = manager.subset_hook_caller(
            "kvcore_reference_kernels",
            remove_plugins=[p for p in manager.get_plugins() if p is not plugin],
        )
        for provided in call():
            _check(provided, info.name)
            for spec_class, kernel in provided.items():
                if spec_class in kernels:
                    msg = (
                        f"{spec_class.__qualname__} has a reference kernel from plugin "
                        f"{owners[spec_class]!r} and from plugin {info.name!r}; disable one "
                        "of the two plugins"
                    )
                    raise PluginConflictError(msg)
                kernels[spec_class] = kernel
                owners[spec_class] = info.name
    return kernels


def _check(provided: object, plugin: str) -> None:
    ok = isinstance(provided, Mapping) and all(
        isinstance(spec, type)
        and issubclass(spec, KVCacheSpec)
        and isinstance(kernel, ReferenceKernel)
        for spec, kernel in provided.items()
    )
    if not ok:
        msg = (
            f"plugin {plugin!r}: kvcore_reference_kernels must return a mapping of spec "
            f"classes to kvcore.reference.ReferenceKernel instances, got {provided!r}"
        )
        raise HookImplementationError(msg)


def kernel_for(
    kernels: Mapping[type[KVCacheSpec], ReferenceKernel],
    spec: KVCacheSpec,
    registry: Registry,
    layer: str,
) -> ReferenceKernel:
    """The kernel of ``spec``'s exact class.

    Raises:
        UnknownSpecError: no selected plugin provides one; the message names
            the layer, the spec class and the plugin serving it.
    """
    kernel = kernels.get(type(spec))
    if kernel is not None:
        return kernel
    spec_type = type(spec)
    provided = ", ".join(sorted(t.__name__ for t in kernels)) or "none"
    if spec_type in registry:
        why = (
            f"plugin {registry.plugin_for(spec_type).name!r} serves it but does not implement "
            "the kvcore_reference_kernels hook"
        )
    else:
        why = "no selected plugin serves it"
    msg = (
        f"layer {layer!r}: no reference kernel for {spec_type.__qualname__} ({why}), so the "
        f"executor cannot run this model. Kernels provided: {provided}"
    )
    raise UnknownSpecError(msg)
