"""Draw the picture of large and small pages for the two-level pool's page (an SVG, by hand).

Run from the repository root; it rewrites ``docs/_static/two-level-pool.svg``::

    python docs/_tools/two_level_figure.py

The picture is one backing run of seven large pages in a pool of two page
classes: class 0 with six small pages per large page (attention pages),
class 1 with two (recurrent states). No plotting package: the SVG is
written as text, so the figure needs nothing beyond the standard library.
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parents[1] / "_static" / "two-level-pool.svg"

LARGE_W, LARGE_H = 120, 64  # one large page, in SVG units
LEFT, TOP = 20, 64
GAP = 6
COLOURS = {
    "used": "#3b78c2",
    "cached": "#9cc3ea",
    "spare": "#ffffff",
    "null": "#9a9a9a",
    "free": "#f2f2f2",
}
#: Per large page: (title, class, small pages per large page, state of each small page).
LARGE_PAGES: list[tuple[str, int | None, int, list[str]]] = [
    ("null blocks", None, 1, ["null"]),
    ("class 1", 1, 2, ["used", "cached"]),
    ("class 0", 0, 6, ["used", "used", "used", "cached", "spare", "spare"]),
    ("common pool", None, 1, ["free"]),
    ("class 0, fully free", 0, 6, ["cached"] * 6),
    ("class 1", 1, 2, ["used", "used"]),
    ("common pool", None, 1, ["free"]),
]


def _text(x: float, y: float, words: str, size: int = 12, anchor: str = "middle",
          weight: str = "normal") -> str:
    return (
        f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}" '
        f'font-weight="{weight}">{escape(words)}</text>'
    )


def _rect(x: float, y: float, w: float, h: float, fill: str, stroke: str = "#333",
          width: float = 1) -> str:
    return (
        f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" fill="{fill}" '
        f'stroke="{stroke}" stroke-width="{width:g}"/>'
    )


def _large_page(
    index: int, title: str, klass: int | None, per: int, states: list[str]
) -> list[str]:
    """One large page: its small pages (with their ids), its title and its number."""
    x = LEFT + index * (LARGE_W + GAP)
    parts = [_text(x + LARGE_W / 2, TOP - 26, f"large page {index}", 12, weight="bold"),
             _text(x + LARGE_W / 2, TOP - 10, title, 11)]
    small_w = LARGE_W / per
    for slot, state in enumerate(states):
        sx = x + slot * small_w
        parts.append(_rect(sx, TOP, small_w, LARGE_H, COLOURS[state], "#555", 0.8))
        if klass is not None:
            colour = "#fff" if state == "used" else "#222"
            block = index * per + slot
            parts.append(
                f'<text x="{sx + small_w / 2:g}" y="{TOP + LARGE_H / 2 + 4:g}" font-size="11" '
                f'text-anchor="middle" fill="{colour}">{block}</text>'
            )
    parts.append(_rect(x, TOP, LARGE_W, LARGE_H, "none", "#111", 2))
    return parts


def _legend(y: float) -> list[str]:
    entries = [
        ("used", "in use (held by a request)"),
        ("cached", "free, still cached (a prefix hit)"),
        ("spare", "free, never used since carved"),
        ("free", "large page in the common pool"),
        ("null", "the classes' null blocks"),
    ]
    parts = []
    for row, (state, words) in enumerate(entries):
        column, line = divmod(row, 3)
        x = LEFT + column * 420
        yy = y + line * 20
        parts.append(_rect(x, yy - 11, 14, 14, COLOURS[state], "#555", 0.8))
        parts.append(_text(x + 22, yy, words, 12, anchor="start"))
    return parts


def draw() -> str:
    """The whole SVG document."""
    width = LEFT * 2 + len(LARGE_PAGES) * (LARGE_W + GAP) - GAP
    caption_y = TOP + LARGE_H + 26
    height = caption_y + 110
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" font-family="DejaVu Sans, Arial, sans-serif" '
        'role="img" aria-labelledby="title">',
        '<title id="title">One run of a two-level pool: seven large pages, carved into '
        "six small pages (class 0) or two (class 1), numbered by small-page id</title>",
        _rect(0, 0, width, height, "#ffffff", "none"),
    ]
    for index, (title, klass, per, states) in enumerate(LARGE_PAGES):
        parts.extend(_large_page(index, title, klass, per, states))
    parts.append(_text(
        LEFT, caption_y,
        "Numbers are small-page ids (block ids): small page s of a class with k per large "
        "page lies in large page s // k.", 12, anchor="start",
    ))
    parts.extend(_legend(caption_y + 30))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    """Write the SVG."""
    OUT.write_text(draw())
    print(f"wrote {OUT.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
