"""The exceptions kvcore raises: one class per kind of fault.

Every error kvcore raises derives from :class:`KVCoreError`, and also from the
standard exception that fits (``ValueError``, ``LookupError``, ``ImportError``,
``RuntimeError``) so that callers who do not know kvcore can still catch it.
Messages name what was wrong (the plugin, the field, the request) and what
would fix it. A call that raises one of them has changed nothing.

The families, by who has to act:

* :class:`PluginError` — the plugins installed or selected (fix the
  environment or the selection).
* :class:`InvalidSpecError`, :class:`InvalidConfigError` — how the cache was
  described or configured (fix the code or the options that build it).
* :class:`InvalidRequestError` — one call about one request (an engine can
  drop that request and carry on serving the others).
* :class:`InvalidBlockError`, :class:`DoubleFreeError`,
  :class:`OutOfBlocksError` — direct use of the :class:`~kvcore.managers.BlockPool`
  (plugin managers, tools); the engine-facing manager never lets them out.

The errors page of the documentation lists when each is raised.
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
    "UnknownEvictionPolicyError",
    "InvalidSpecError",
    "InvalidConfigError",
    "InsufficientMemoryError",
    "PoolTooLargeError",
    "InvalidRequestError",
    "RequestTooLongError",
    "RequestStateError",
    "InvalidCacheHitError",
    "InvalidBlockError",
    "DoubleFreeError",
    "OutOfBlocksError",
    "ConcurrentUseError",
    "PrefixCachingNotSupportedError",
    "TraceFormatError",
    "PagedAccessError",
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


class UnknownEvictionPolicyError(KVCoreError, LookupError):
    """An eviction policy was asked for by a name no built-in or plugin provides."""


class InvalidSpecError(KVCoreError, ValueError):
    """A spec field has a value the spec cannot work with."""


class InvalidConfigError(KVCoreError, ValueError):
    """A KV cache config, or an option given with it, is inconsistent."""


class InsufficientMemoryError(InvalidConfigError):
    """The memory cannot hold one request of ``max_model_len`` tokens."""


class PoolTooLargeError(InvalidConfigError):
    """A plan or pool larger than block ids can address, or than the host can track.

    Block tables hold ``int32`` ids, and the pool keeps a few machine words
    per block in host memory: a pool of billions of blocks is refused (by
    planning, or when the pool is built) before any of that memory is taken.
    """


class InvalidRequestError(KVCoreError, ValueError):
    """A call about a request has arguments that contradict each other or its state.

    The base of every per-request fault: an engine that catches it can
    abandon the one request and keep serving the others.
    """


class RequestTooLongError(InvalidRequestError):
    """A request needs more tokens than the model's ``max_model_len``."""


class RequestStateError(InvalidRequestError):
    """The call does not fit where the request is in its life.

    Another live :class:`~kvcore.Request` object has the same id; the request
    holds blocks of another :class:`~kvcore.KVCacheManager` (or was hashed by
    one); a running request is given cache hits or external tokens (adopted
    once, at admission); blocks are cached for a request holding none.
    """


class InvalidCacheHitError(InvalidRequestError):
    """The cache-hit blocks passed to ``allocate_slots`` are not this request's hit.

    Each hit block must be cached, in its group, under the hash its position
    implies for this request (as :meth:`~kvcore.KVCacheManager.get_computed_blocks`
    returned it, and still cached); the hit length must be what the blocks
    cover; there must be one list per group.
    """


class InvalidBlockError(KVCoreError, ValueError):
    """A block id, group id or block count given to the block pool is not valid for it."""


class DoubleFreeError(KVCoreError, RuntimeError):
    """A block's reference count would go below zero (freed more often than taken).

    Freeing a *request* that holds no blocks is not an error (it is a no-op,
    as for a request preempted and then aborted).
    """


class OutOfBlocksError(KVCoreError, RuntimeError):
    """The block pool was asked for more blocks than it has free.

    ``KVCacheManager.allocate_slots`` never raises this: it checks capacity
    first and returns ``None``. Calling the pool directly can raise it.
    """


class ConcurrentUseError(KVCoreError, RuntimeError):
    """Two threads called one :class:`~kvcore.KVCacheManager` at the same time.

    A manager is single-threaded: an engine's scheduler calls it from one
    thread (vLLM's does). The second call is refused before it changes
    anything; the first one completes. Serialise the calls (one scheduler
    thread, or a lock of the engine's own) or give each thread its own
    manager and pool.
    """


class PrefixCachingNotSupportedError(KVCoreError, TypeError):
    """A cache lookup or cache insert was asked of a type that is never cached."""


class TraceFormatError(KVCoreError, ValueError):
    """A trace cannot be read; the message gives the file, the line and the reason."""


class PagedAccessError(KVCoreError, RuntimeError):
    """A read or write through a block table needed a slot the table does not give.

    Raised by :mod:`kvcore.paging` and the reference kernels when a position
    lies in a block past the end of the request's table (the manager
    allocated too few blocks), when its block is the null block (the manager
    freed, or never kept, a block the layer reads; or a padded row of a batch
    table), when a block id lies outside the allocated pool, or when a
    request lacks an input its layer needs (encoder output).
    """
