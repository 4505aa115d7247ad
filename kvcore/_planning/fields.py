"""Reading ``config.json`` fields with errors that name the file, the field and the fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcore.errors import InvalidConfigError

__all__ = ["MISSING", "ConfigFields"]

#: Marks a field that is absent (or ``null``) in the config.
MISSING: Any = object()


class ConfigFields:
    """Typed reads of a model config's fields, with errors naming the file and the field.

    The base of :class:`~kvcore.planning.ModelFields` (what the
    :func:`~kvcore.hookspecs.kvcore_model_layers` hook sees) and
    :class:`~kvcore.planning.LayerConfig` (what a layer-kind builder sees). Every read
    of a number checks its type, so a word, a fraction or a zero in a count
    is refused with a message naming the model, the file, the field and the
    fix, instead of surfacing as a ``ValueError`` or ``ZeroDivisionError``
    inside a plugin.

    Attributes:
        config: The fields, read-only.
    """

    __slots__ = ()

    config: Mapping[str, Any]

    def _where(self) -> str:
        raise NotImplementedError

    def get(self, *keys: str, default: Any = None) -> Any:
        """The value of the first of ``keys`` present (and not null) in the config.

        The value is as JSON decoded it: a nested section is a plain ``dict``
        (a list a ``list``), whose fields the caller reads and checks itself.
        """
        for key in keys:
            value = self.config.get(key)
            if value is not None:
                return value
        return default

    def _first(self, keys: tuple[str, ...]) -> tuple[str, Any]:
        for key in keys:
            value = self.config.get(key)
            if value is not None:
                return key, value
        return keys[0], MISSING

    def require(self, *keys: str) -> Any:
        """Like :meth:`get`, but a missing field is an error.

        Raises:
            InvalidConfigError: none of ``keys`` is in the config; the message
                names the model, the file (and the layer) and the field.
        """
        _, value = self._first(keys)
        if value is MISSING:
            names = " or ".join(repr(key) for key in keys)
            msg = f"{self._where()} needs {names} in its config.json; add the field"
            raise InvalidConfigError(msg)
        return value

    def _as_int(self, key: str, value: Any, minimum: int) -> int:
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is not int or value < minimum:
            msg = (
                f"{self._where()}: {key} must be an integer >= {minimum}, got {value!r}; "
                f"fix {key} in the config.json"
            )
            raise InvalidConfigError(msg)
        return value

    def require_int(self, *keys: str, minimum: int = 1) -> int:
        """The first of ``keys`` present, as an integer of at least ``minimum``.

        An integral float (``8.0``) is accepted; a fraction, a string, a
        boolean or a smaller number is not.

        Raises:
            InvalidConfigError: the field is missing or not such an integer;
                the message names the model, the file and the field.
        """
        key, value = self._first(keys)
        if value is MISSING:
            self.require(*keys)
        return self._as_int(key, value, minimum)

    def get_int(self, *keys: str, default: int, minimum: int = 1) -> int:
        """Like :meth:`require_int`, with ``default`` when no key is present."""
        key, value = self._first(keys)
        if value is MISSING:
            return default
        return self._as_int(key, value, minimum)
