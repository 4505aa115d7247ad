"""Dev tool: load built doc pages in headless Chromium and report clipped code blocks.

Not part of CI (CI has no browser). Needs Debian's ``chromium``::

    python docs/_tools/browser_check.py docs/_build/html --width 1280 \
        --screenshots /tmp/kvcore-shots

For every page it reports each ``pre`` whose content is wider than its box
(``scrollWidth > clientWidth``: the reader has to scroll sideways), saying
whether it sits in a table (an HTML table, or a block marked
``:class: wide-table``: benchmark output whose columns are meant to be read
side by side); with ``--screenshots`` it also saves a full-page
PNG of each page at that width. Exit status 1 if a block outside a table is
clipped.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURE = """
<script>
window.addEventListener("load", () => {
  const clipped = [];
  document.querySelectorAll("pre").forEach((pre) => {
    if (pre.scrollWidth > pre.clientWidth + 1) {
      clipped.push({
        first_line: pre.textContent.split("\\n")[0].slice(0, 70),
        scroll_width: pre.scrollWidth,
        client_width: pre.clientWidth,
        in_table: pre.closest("table, .wide-table") !== null,
      });
    }
  });
  const out = document.createElement("div");
  out.id = "kvcore-measure";
  out.textContent = JSON.stringify({clipped, height: document.documentElement.scrollHeight});
  document.body.appendChild(out);
});
</script>
"""

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium(args: list[str], profile: str) -> str:
    """Run headless Chromium once; return what it printed."""
    command = [shutil.which("chromium") or "chromium", *FLAGS, f"--user-data-dir={profile}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    return done.stdout


def measure(page: Path, width: int, profile: str) -> dict[str, object]:
    """Load ``page`` (a copy with the measuring script) and return what the script found."""
    html = page.read_text()
    probe = page.with_name(page.stem + ".kvcore-measure.html")
    probe.write_text(html.replace("</body>", MEASURE + "</body>"))
    try:
        dom = chromium(
            [f"--window-size={width},900", "--virtual-time-budget=3000", "--dump-dom",
             probe.as_uri()],
            profile,
        )
    finally:
        probe.unlink()
    found = re.search(r'<div id="kvcore-measure">(.*?)</div>', dom, re.S)
    if found is None:
        return {"error": "the page did not finish loading"}
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    return json.loads(text.replace("&amp;", "&"))


def main() -> int:
    """Check every page (or the ones named) and print a report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path, help="the built HTML folder")
    parser.add_argument("pages", nargs="*", help="pages relative to it (default: all)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--screenshots", type=Path, help="save a full-page PNG of each page here")
    args = parser.parse_args()
    args.html = args.html.resolve()
    pages = [args.html / p for p in args.pages] or sorted(
        p for p in args.html.rglob("*.html")
        if not p.relative_to(args.html).parts[0].startswith("_")
        and p.name not in ("genindex.html", "search.html", "py-modindex.html")
    )
    failed = 0
    with tempfile.TemporaryDirectory() as profile:
        for page in pages:
            result = measure(page, args.width, profile)
            name = page.relative_to(args.html)
            clipped = result.get("clipped", [])
            outside = [c for c in clipped if not c["in_table"]]
            failed += bool(outside) or "error" in result
            status = "error: " + str(result["error"]) if "error" in result else (
                f"{len(outside)} clipped" + (f", {len(clipped) - len(outside)} in tables"
                                             if len(clipped) > len(outside) else ""))
            print(f"{name}: {status}")
            for block in clipped:
                where = " (in a table)" if block["in_table"] else ""
                print(f"    {block['scroll_width']} > {block['client_width']} px{where}: "
                      f"{block['first_line']!r}")
            if args.screenshots:
                args.screenshots.mkdir(parents=True, exist_ok=True)
                height = min(int(result.get("height", 2000)), 16000)
                stem = str(name).replace("/", "-").removesuffix(".html")
                shot = args.screenshots / f"{stem}.png"
                chromium([f"--window-size={args.width},{height}", f"--screenshot={shot}",
                          page.as_uri()], profile)
    print(f"{len(pages)} pages at {args.width} px: {failed} with clipped code blocks")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
