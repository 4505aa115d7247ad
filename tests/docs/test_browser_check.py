"""The browser check itself: real Chromium, real viewports, pages made to fail and pass."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from docbuild import import_tool

checks = import_tool("browser_check")

if shutil.which("chromium") is None:
    reason = "Chromium is not installed (Debian package chromium)"
    if os.environ.get("KVCORE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}; KVCORE_REQUIRE_BROWSER=1", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

HEAD = '<meta name="viewport" content="width=device-width, initial-scale=1">'
AFFORDANCE = "background-image: linear-gradient(to right, white, transparent)"
WIDE = "x" * 200


def page(folder: Path, name: str, body: str, style: str = "") -> Path:
    path = folder / name
    path.write_text(
        f"<html><head>{HEAD}<style>{style}</style></head>"
        f"<body><article>{body}</article></body></html>"
    )
    return path


def run(folder: Path, *names: str, widths: tuple[int, ...] = (390, 1280)) -> tuple[int, str]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = checks.main([str(folder), *names, "--widths", *map(str, widths)])
    return status, out.getvalue()


def test_a_wide_block_must_scroll_with_a_cue(tmp_path: Path):
    page(tmp_path, "cut.html", f"<pre style='overflow-x: hidden'>{WIDE}</pre>")
    page(tmp_path, "bare.html", f"<pre style='overflow-x: auto'>{WIDE}</pre>")
    page(tmp_path, "good.html", f"<pre style='overflow-x: auto; {AFFORDANCE}'>{WIDE}</pre>")
    status, out = run(tmp_path, "cut.html", "bare.html", "good.html")
    assert status == 1
    assert 'cut.html at 390 px: code block "xxx' in out
    assert "is cut off" in out
    assert "bare.html at 1280 px: code block" in out
    assert "no scroll affordance" in out
    assert "good.html" not in out.replace("pages at", "")


def test_the_phone_width_is_real(tmp_path: Path):
    # 600 px fits a 1280 px laptop but not a 390 px phone; --window-size
    # would lay the phone out at 500 px and miss it.
    page(
        tmp_path,
        "mid.html",
        "<pre style='overflow-x: hidden; width: 100%'>" + "y" * 70 + "</pre>",
        "pre { font: 14px monospace; }",
    )
    status, out = run(tmp_path, "mid.html")
    assert status == 1
    assert "mid.html at 390 px" in out
    assert "mid.html at 1280 px" not in out


def test_a_page_wider_than_the_viewport_and_a_doubled_label_fail(tmp_path: Path):
    page(tmp_path, "wide.html", "<div style='width: 700px'>wide</div>")
    page(
        tmp_path,
        "labels.html",
        "<div class='output'><div class='highlight'><pre>42</pre></div></div>",
        "div.output::before, div.output > div.highlight::before { content: 'output'; }",
    )
    status, out = run(tmp_path, "wide.html", "labels.html", widths=(390,))
    assert status == 1
    assert "wide.html at 390 px: the page is" in out
    assert "labels.html at 390 px: an output block shows its label 2 times" in out
