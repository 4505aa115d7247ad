"""The plugin contract, checked when a registry is built.

What a spec class and a manager class must provide is declared on the base
classes (:class:`~kvcore.specs.KVCacheSpec`,
:class:`~kvcore.managers.SingleTypeManager`); this module checks every
registered pair against it, on the classes alone (no instance is made), so a
broken plugin fails when it is loaded, with a message naming the plugin, the
class and the missing piece, instead of misbehaving silently later.
Behavioural rules (the hit search against a brute-force oracle, the page
parts against torch) are checked by :func:`kvcore.testing.check_plugin`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_args

from kvcore.errors import HookImplementationError
from kvcore.managers import SingleTypeManager
from kvcore.specs import KIND_PATTERN, AttentionSpec, FallbackRole, KVCacheSpec, KVFormat

__all__ = ["check_manager_class", "check_spec_class", "qualname"]

_FALLBACK_ROLES = frozenset(get_args(FallbackRole))
_DERIVED_PAGE_SIZES = ("real_page_size_bytes", "page_size_bytes")
_MANAGER_FLAGS = (
    "downward_closed_hits",
    "supports_prefix_caching",
    "allocates_for_encoder",
    "eagle_drops_last_block",
    "frees_skipped_blocks",
)
#: Steps of a running request's allocation that steady_until must account for.
_STEADY_RULES = (
    "get_num_blocks_to_allocate",
    "allocate_new_blocks",
    "cache_blocks",
    "remove_skipped_blocks",
)
_MANAGER_CLASSMETHODS = ("find_longest_cache_hit", "is_prefix_cacheable", "validate_config")


def qualname(cls: type) -> str:
    """``module.QualName`` of a class, as messages name it."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _defined_by(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO whose body defines ``name``."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass
    return None


def _overrides(cls: type, base: type, name: str) -> bool:
    owner = _defined_by(cls, name)
    return owner is not None and owner is not base and issubclass(owner, base)


def _fail(plugin: str, cls: type, problem: str) -> HookImplementationError:
    return HookImplementationError(f"plugin {plugin!r}: {qualname(cls)} {problem}")


def check_spec_class(plugin: str, cls: type[KVCacheSpec]) -> None:
    """Check one registered spec class against the spec contract.

    Raises:
        HookImplementationError: naming the plugin, the class and what is
            missing or wrong.
    """
    if "__attrs_attrs__" not in cls.__dict__:
        raise _fail(
            plugin,
            cls,
            "is not decorated with @attrs.frozen(kw_only=True) itself; every spec "
            "class must be (specs are immutable values compared by their fields)",
        )
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not KIND_PATTERN.fullmatch(kind):
        raise _fail(
            plugin,
            cls,
            f"has kind {kind!r}; set the class attribute kind to the attention type's "
            'name, lowercase words joined by underscores (kind: ClassVar[str] = "my_type")',
        )
    for name in ("page_parts", "max_memory_usage_bytes"):
        if _defined_by(cls, name) is KVCacheSpec:
            raise _fail(plugin, cls, f"does not implement {name}()")
    for name in _DERIVED_PAGE_SIZES:
        owner = _defined_by(cls, name)
        if owner is not KVCacheSpec:
            raise _fail(
                plugin,
                cls,
                f"overrides {name} (in {qualname(owner or cls)}); the page size is derived "
                "from page_parts(), so describe the page there instead",
            )
    if _defined_by(cls, "as_full_attention") is not None:
        raise _fail(
            plugin,
            cls,
            "defines as_full_attention(), which plugin contract v1 replaced: name the "
            "spec class that allocates its layers in promoted_to (for example "
            "promoted_to = FullAttentionSpec)",
        )
    promoted_to = cls.promoted_to
    if promoted_to is not None:
        if not (isinstance(promoted_to, type) and issubclass(promoted_to, KVCacheSpec)):
            raise _fail(plugin, cls, f"has promoted_to = {promoted_to!r}, not a spec class")
        if _defined_by(promoted_to, "allocating_for") is KVCacheSpec:
            raise _fail(
                plugin,
                cls,
                f"is promoted to {qualname(promoted_to)}, which does not implement "
                "allocating_for(spec, block_size)",
            )
    if cls.full_allocation_fallback not in _FALLBACK_ROLES:
        raise _fail(
            plugin,
            cls,
            f"has full_allocation_fallback = {cls.full_allocation_fallback!r}; use one of "
            f"{', '.join(sorted(_FALLBACK_ROLES))}",
        )
    _check_kv_formats(plugin, cls)


def _check_kv_formats(plugin: str, cls: type[KVCacheSpec]) -> None:
    """``kv_formats``: a tuple of distinct-named formats, on an attention spec only."""
    formats = getattr(cls, "kv_formats", ())
    if not isinstance(formats, tuple) or not all(isinstance(f, KVFormat) for f in formats):
        raise _fail(
            plugin,
            cls,
            f"declares kv_formats = {formats!r}; it must be a tuple of kvcore.specs.KVFormat",
        )
    if formats and not issubclass(cls, AttentionSpec):
        raise _fail(
            plugin,
            cls,
            "declares kv_formats but is not an AttentionSpec; a KV format describes the page "
            "of a layer storing keys and values per token",
        )
    names = [kv_format.name for kv_format in formats]
    if len(set(names)) != len(names):
        raise _fail(plugin, cls, f"declares two KV formats of one name in kv_formats: {names}")


def _hit_search_parameters(method: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(method).parameters)


def check_manager_class(plugin: str, cls: type[SingleTypeManager[Any]]) -> None:
    """Check one registered manager class against the manager contract.

    Raises:
        HookImplementationError: naming the plugin, the class and what is
            missing or wrong.
    """
    for flag in _MANAGER_FLAGS:
        value = getattr(cls, flag)
        if type(value) is not bool:
            raise _fail(plugin, cls, f"sets {flag} = {value!r}; it must be True or False")
    for name in _MANAGER_CLASSMETHODS:
        owner = _defined_by(cls, name)
        if owner is not None and not isinstance(owner.__dict__[name], classmethod):
            raise _fail(
                plugin,
                cls,
                f"defines {name} in {qualname(owner)} as a plain method; it must be a "
                "@classmethod (it is called on the class, before any manager exists)",
            )
    if cls.supports_prefix_caching:
        if _defined_by(cls, "find_longest_cache_hit") is SingleTypeManager:
            raise _fail(
                plugin,
                cls,
                "does not implement find_longest_cache_hit(cls, query); implement it, "
                "subclass PrefixManager, or set supports_prefix_caching = False",
            )
        parameters = _hit_search_parameters(cls.find_longest_cache_hit)
        if len(parameters) != 1:
            raise _fail(
                plugin,
                cls,
                f"defines find_longest_cache_hit with parameters ({', '.join(parameters)}); "
                "plugin contract v1 passes one kvcore.managers.HitQuery: "
                "def find_longest_cache_hit(cls, query)",
            )
    overridden = [
        name
        for name in ("get_num_skipped_tokens", "remove_skipped_blocks")
        if _overrides(cls, SingleTypeManager, name)
    ]
    if overridden and not cls.frees_skipped_blocks:
        raise _fail(
            plugin,
            cls,
            f"overrides {' and '.join(overridden)} but does not set frees_skipped_blocks = "
            "True, so the blocks would never be freed; set it",
        )
    if cls.frees_skipped_blocks and not overridden:
        raise _fail(
            plugin,
            cls,
            "sets frees_skipped_blocks = True but says nothing about what to free; override "
            "get_num_skipped_tokens (a leading run of tokens) or remove_skipped_blocks",
        )
    _check_steady_until(plugin, cls)


def _check_steady_until(plugin: str, cls: type[SingleTypeManager[Any]]) -> None:
    """A class changing a decode step's rules must say when its next change comes."""
    steady_owner = _defined_by(cls, "steady_until") or SingleTypeManager
    for name in _STEADY_RULES:
        owner = _defined_by(cls, name)
        if owner is None or owner is SingleTypeManager or not issubclass(owner, SingleTypeManager):
            continue
        if not issubclass(steady_owner, owner):
            raise _fail(
                plugin,
                cls,
                f"overrides {name} (in {qualname(owner)}) but not steady_until, which tells "
                "the engine-facing manager when a running request's next change in the "
                "group comes (decode steps before it skip the group); override "
                "steady_until in the same class to match your rule (returning "
                "num_computed_tokens is always correct, and sends every step the full way)",
            )
