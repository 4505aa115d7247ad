"""Collecting the plugins' reference kernels (the ``kvcore_reference_kernels`` hook)."""

from __future__ import annotations

from collections.abc import Mapping

from kvcore._registry import Registry
from kvcore.errors import HookImplementationError, UnknownSpecError
from kvcore.reference import ReferenceKernel
from kvcore.specs import KVCacheSpec

__all__ = ["kernel_for", "reference_kernels"]


def reference_kernels(registry: Registry) -> dict[type[KVCacheSpec], ReferenceKernel]:
    """Spec class → reference kernel, from the registry's plugins.

    The registry keeps every selected plugin's
    :func:`~kvcore.hookspecs.kvcore_reference_kernels` implementation (not
    called when it is built: kernels import torch); this calls each once.

    Raises:
        PluginConflictError: two plugins provide a kernel for one spec class.
        HookImplementationError: a plugin's hook raises, or returns something
            other than a mapping of spec classes to
            :class:`~kvcore.reference.ReferenceKernel` instances.
    """
    kernels = {}
    for spec_class, claim in registry.gather("kvcore_reference_kernels").items():
        kernel = claim.record[1]
        if not isinstance(kernel, ReferenceKernel):
            msg = (
                f"plugin {claim.plugin.name!r}: kvcore_reference_kernels must return a "
                "non-empty mapping of spec classes to kvcore.reference.ReferenceKernel "
                f"instances, got {kernel!r} for {getattr(spec_class, '__qualname__', spec_class)}"
            )
            raise HookImplementationError(msg)
        if isinstance(spec_class, type):
            kernels[spec_class] = kernel
    return kernels


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
