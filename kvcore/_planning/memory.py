"""Memory amounts: parsing ``"80GiB"`` / ``"24GB"`` and printing bytes for people."""

from __future__ import annotations

import re
from typing import Final

from kvcore.errors import InvalidConfigError

__all__ = ["parse_memory"]

_UNITS: Final[dict[str, int]] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_memory(value: int | str) -> int:
    """Return a memory amount in bytes.

    Args:
        value: Bytes as an ``int``, or a string: a number and a unit, ``B``,
            decimal ``KB``/``MB``/``GB``/``TB`` (powers of 1000) or binary
            ``KiB``/``MiB``/``GiB``/``TiB`` (powers of 1024), case-insensitive;
            ``"80GiB"``, ``"24 GB"``, ``"1.5TiB"``. A bare number is bytes.
            Fractions are rounded down to whole bytes.

    Raises:
        InvalidConfigError: the value is negative, not a number with a known
            unit, or a bare unit letter such as ``"80G"`` (ambiguous between
            GB and GiB).
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        msg = f"memory must be bytes (an int) or a string like '80GiB', got {value!r}"
        raise InvalidConfigError(msg)
    if isinstance(value, int):
        if value < 0:
            msg = f"memory must not be negative, got {value} bytes"
            raise InvalidConfigError(msg)
        return value
    match = _PATTERN.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in {"", *_UNITS}:
        hint = ""
        if match is not None and unit in {"k", "m", "g", "t"}:
            hint = (
                f" ('{unit.upper()}' alone is ambiguous: write {unit.upper()}iB or {unit.upper()}B)"
            )
        msg = (
            f"cannot read memory amount {value!r}{hint}; write a number and a unit, "
            "such as '80GiB' (binary), '24GB' (decimal) or '512MiB'"
        )
        raise InvalidConfigError(msg)
    number = float(match.group(1)) if "." in match.group(1) else int(match.group(1))
    return int(number * _UNITS[unit or "b"])
