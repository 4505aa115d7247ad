"""NVFP4 encoding in torch: rows of float64 values to packed E2M1 codes and E4M3 scales.

A row is ``(..., width)`` values; each run of :data:`GROUP` consecutive values
gets one scale, ``amax / 6`` rounded to E4M3 (so the largest magnitude maps
to E2M1's largest, 6), and each value becomes the E2M1 code nearest to
``value / scale``, ties to the even code, magnitudes above 6 saturated to 6.
A group whose scale rounds to zero (all values zero, or too small for E4M3)
encodes as zeros. Decoding multiplies each code's value by its scale, which
is exact in float64, so decoding what was encoded is a pure function of the
input: the paged and the dense paths of the kernel agree bit for bit.

There is no second, per-tensor scale (NVFP4's fp32 tensor scale lives
outside the page; here it is 1): magnitudes up to 6 × 448 = 2,688 are
represented, and a group whose largest magnitude is below about 2⁻¹⁰ × 6
becomes zero.
"""

from __future__ import annotations

from typing import Final

import torch

__all__ = ["E2M1_VALUES", "GROUP", "decode", "encode", "quantize"]

#: Values sharing one scale.
GROUP: Final = 16
#: The magnitudes of the eight E2M1 codes 0-7; code | 8 is the negative.
E2M1_VALUES: Final = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E4M3_MAX: Final = 448.0


def _magnitude_codes(magnitudes: torch.Tensor) -> torch.Tensor:
    """The E2M1 code (0-7) nearest each magnitude in ``[0, 6]``, ties to the even code."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=magnitudes.device)
    midpoints = (values[1:] + values[:-1]) / 2
    # bucketize puts a magnitude equal to a midpoint with the lower code; the
    # tie goes up where the upper code is the even one.
    codes = torch.bucketize(magnitudes, midpoints)
    at_midpoint = magnitudes == midpoints[codes.clamp(max=len(midpoints) - 1)]
    tie_up = at_midpoint & (codes < len(midpoints)) & (codes % 2 == 1)
    return codes + tie_up.to(codes.dtype)


def encode(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of ``rows`` (float64, last axis a multiple of :data:`GROUP`).

    Returns:
        ``codes``: ``(..., width / 2)`` ``uint8``, value ``2j`` in the low
        four bits of byte ``j``, value ``2j + 1`` in the high four bits;
        ``scales``: ``(..., width / GROUP)`` ``float8_e4m3fn``.
    """
    *lead, width = rows.shape
    groups = rows.reshape(*lead, width // GROUP, GROUP)
    amax = groups.abs().amax(-1)
    scales = (amax / 6).clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn)
    scale = scales.to(torch.float64)[..., None]
    nonzero = scale > 0
    ratio = torch.where(nonzero, groups / torch.where(nonzero, scale, 1.0), 0.0)
    magnitude = _magnitude_codes(ratio.abs().clamp(max=E2M1_VALUES[-1]))
    negative = (ratio < 0) & (magnitude > 0)
    codes = (magnitude + 8 * negative.to(magnitude.dtype)).reshape(*lead, width // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return packed.to(torch.uint8), scales


def decode(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float64 values of packed ``codes`` and their ``scales`` (any float dtype).

    Args:
        codes: ``(..., width / 2)`` packed codes (``uint8``, or integers held
            in another dtype, as a float64 read of the cache returns them).
        scales: ``(..., width / GROUP)``.

    Returns:
        ``(..., width)`` float64.
    """
    packed = codes.to(torch.int64)
    unpacked = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)
    values = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=codes.device)
    magnitude = values[unpacked & 7]
    signed = torch.where(unpacked >= 8, -magnitude, magnitude)
    *lead, width = signed.shape
    groups = signed.reshape(*lead, width // GROUP, GROUP)
    return (groups * scales.to(torch.float64)[..., None]).reshape(*lead, width)


def quantize(rows: torch.Tensor) -> torch.Tensor:
    """``decode(*encode(rows))``: what an NVFP4 cache gives back for ``rows``."""
    return decode(*encode(rows))
