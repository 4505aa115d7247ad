"""The exceptions kvcore raises.

Every error kvcore raises derives from :class:`KVCoreError`, and also from the
standard exception that fits (``ValueError``, ``LookupError``, ``ImportError``,
``RuntimeError``) so that callers who do not know kvcore can still catch it.
Messages name what was wrong (the plugin, the field, the request) and what
would fix it.
"""

from __future__ import annotations

__all__ = [
    "KVCoreError",
    "PluginError",
    "PluginLoadError",
    "PluginNotFoundError",
    "PluginConflictError",
    "HookImplementationError",
    "UnknownSpecError",
    "InvalidSpecError",
    "InvalidConfigError",
    "InvalidRequestError",
    "RequestTooLongError",
    "DoubleFreeError",
    "OutOfBlocksError",
    "PrefixCachingNotSupportedError",
]


class KVCoreError(Exception):
    """Base class of every exception raised by kvcore."""


class PluginError(KVCoreError):
    """A plugin could not be loaded, selected or combined with the others."""


class PluginLoadError(PluginError, ImportError):
    """A selected plugin's entry point raised while it was imported."""


class PluginNotFoundError(PluginError, LookupError):
    """A plugin named in a selection (``only``/``disable``) is not installed."""


class PluginConflictError(PluginError):
    """Two plugins claim the same spec type or the same plugin name."""


class HookImplementationError(PluginError):
    """A plugin's hooks or classes break the plugin contract.

    It implements a hook that does not exist, defines a hook function without
    ``@hookimpl``, implements no hook, raises in a hook (or in a function a
    hook returned), returns nothing usable, or registers a spec or manager
    class missing a required piece. The message names the plugin and the
    piece.
    """


class UnknownSpecError(PluginError, LookupError):
    """No selected plugin serves a spec type used by the KV cache config."""


class InvalidSpecError(KVCoreError, ValueError):
    """A spec field has a value the spec cannot work with."""


class InvalidConfigError(KVCoreError, ValueError):
    """A KV cache config, or an option given with it, is inconsistent."""


class InvalidRequestError(KVCoreError, ValueError):
    """A call about a request has arguments that contradict each other or its state."""


class RequestTooLongError(InvalidRequestError):
    """A request needs more tokens than the model's ``max_model_len``."""


class DoubleFreeError(KVCoreError, RuntimeError):
    """A request or block was freed more times than it was allocated."""


class OutOfBlocksError(KVCoreError, RuntimeError):
    """The block pool was asked for more blocks than it has free.

    ``KVCacheManager.allocate_slots`` never raises this: it checks capacity
    first and returns ``None``. Calling the pool directly can raise it.
    """


class PrefixCachingNotSupportedError(KVCoreError, TypeError):
    """A cache lookup or cache insert was asked of a type that is never cached."""
