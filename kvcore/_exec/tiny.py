"""The tiny model configs shipped for the executor (``kvcore simulate --execute``)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from kvcore.errors import InvalidConfigError

__all__ = ["tiny_model_path", "tiny_models"]


def _folder() -> Path:
    return Path(str(importlib.resources.files("kvcore._exec") / "models"))


def tiny_models() -> list[str]:
    """Names of the tiny model configs (``"tiny-hybrid"``, ...)."""
    return sorted(path.stem for path in _folder().glob("*.json"))


def tiny_model_path(name: str) -> Path:
    """The ``config.json`` of a tiny model, to plan with :func:`kvcore.plan`.

    Raises:
        InvalidConfigError: no tiny model has that name (the message lists them).
    """
    path = _folder() / f"{name}.json"
    if not path.is_file():
        msg = f"no tiny model named {name!r}; tiny models: {', '.join(tiny_models())}"
        raise InvalidConfigError(msg)
    return path
