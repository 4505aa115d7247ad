"""Line charts as SVG text, written by hand so that plots need no plotting library.

:func:`line_chart` draws panels stacked over one shared x axis on a log-2
scale (the values swept are powers of two or close to them), one line per
series with its points marked, and a legend under the last panel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape

__all__ = ["line_chart"]

Series = Mapping[str, Sequence[tuple[float, float]]]

_WIDTH, _PANEL, _LEFT, _RIGHT, _TOP, _GAP = 720, 240, 80, 24, 48, 56
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
_DASHES = ("", "6 3", "2 3", "8 3 2 3")


def _nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (1.0 for 0)."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return next(step * scale for step in (1, 2, 5, 10) if step * scale >= value)


def _text(x: float, y: float, body: str, anchor: str = "middle", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{escape(body)}</text>'


def _panel(
    top: float,
    label: str,
    series: Series,
    place: Callable[[float], float],
    x_ticks: Sequence[float],
) -> list[str]:
    """One panel's frame, grid, y ticks and lines; ``place`` maps an x value to pixels."""
    highest = _nice_top(max((y for points in series.values() for _, y in points), default=0))
    bottom = top + _PANEL

    def y_of(value: float) -> float:
        return bottom - value / highest * _PANEL

    out = [
        f'<rect x="{_LEFT}" y="{top}" width="{_WIDTH - _LEFT - _RIGHT}" height="{_PANEL}" '
        'fill="none" stroke="#333"/>',
        _text(18, top + _PANEL / 2, label, extra=f'transform="rotate(-90 18 {top + _PANEL / 2})"'),
    ]
    for step in range(6):
        value = highest * step / 5
        y = y_of(value)
        out.append(
            f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_WIDTH - _RIGHT}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        out.append(_text(_LEFT - 6, y + 4, f"{value:g}", anchor="end"))
    for tick in x_ticks:
        x = place(tick)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>')
    for number, points in enumerate(series.values()):
        colour, dash = _COLOURS[number % len(_COLOURS)], _DASHES[number % len(_DASHES)]
        path = " ".join(f"{place(x):.1f},{y_of(y):.1f}" for x, y in points)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2" '
            f'stroke-dasharray="{dash}"/>'
        )
        out.extend(
            f'<circle cx="{place(x):.1f}" cy="{y_of(y):.1f}" r="3" fill="{colour}"/>'
            for x, y in points
        )
    return out


def line_chart(
    *,
    title: str,
    x_label: str,
    x_ticks: Sequence[float],
    panels: Sequence[tuple[str, Series]],
) -> str:
    """An SVG document: one panel per ``(y label, series)``, sharing a log-2 x axis.

    Every panel must name the same series (one colour each, told in the
    legend under the last panel); y axes start at 0.
    """
    low, high = math.log2(min(x_ticks)), math.log2(max(x_ticks))
    span = (high - low) or 1.0

    def x_of(value: float) -> float:
        return _LEFT + (math.log2(value) - low) / span * (_WIDTH - _LEFT - _RIGHT)

    names = list(panels[0][1]) if panels else []
    height = _TOP + len(panels) * (_PANEL + _GAP) + 24 * len(names) + 16
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" font-family="sans-serif" font-size="13">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        _text(_WIDTH / 2, 24, title, extra='font-size="15"'),
    ]
    top = float(_TOP)
    for label, series in panels:
        out.extend(_panel(top, label, series, x_of, x_ticks))
        out.extend(_text(x_of(tick), top + _PANEL + 18, f"{tick:g}") for tick in x_ticks)
        top += _PANEL + _GAP
    out.append(_text(_WIDTH / 2, top - _GAP + 38, x_label))
    for number, name in enumerate(names):
        y = top + 8 + 24 * number
        colour, dash = _COLOURS[number % len(_COLOURS)], _DASHES[number % len(_DASHES)]
        out.append(
            f'<line x1="{_LEFT}" y1="{y}" x2="{_LEFT + 40}" y2="{y}" stroke="{colour}" '
            f'stroke-width="2" stroke-dasharray="{dash}"/>'
        )
        out.append(_text(_LEFT + 50, y + 4, name, anchor="start"))
    out.append("</svg>")
    return "\n".join(out) + "\n"
