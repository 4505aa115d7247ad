r"""Load every built doc page in headless Chromium at real phone and desktop widths.

Run by ``.ci/run`` (Debian's ``chromium`` package)::

    python docs/_tools/browser_check.py docs/_build/html                 # 390 and 1280 px
    python docs/_tools/browser_check.py docs/_build/html --widths 390 \\
        --screenshots /tmp/shots explanation/fleet.html

Chromium's ``--window-size`` still lays a page out at least 500 px wide, so
it cannot show a phone. This check drives Chromium through the DevTools
protocol instead (``--remote-debugging-pipe``: JSON messages on two pipes,
no network port, no extra package) and emulates each viewport with
``Emulation.setDeviceMetricsOverride`` (390 px as a phone: mobile, device
scale 3; 1280 px as a laptop), then measures each page in that layout:

* the page itself must not be wider than the viewport (nothing clipped or
  reachable only by scrolling the whole page sideways);
* every code block (``pre``) and every table wider than its box must scroll
  (``overflow-x`` auto or scroll) and show a scroll affordance (the shadow
  gradients of ``kvcore.css``); one that is cut off, or scrolls with no cue,
  fails;
* the page must show each output block's "output" label once.

Exit status 1 if any page fails, with one line per problem.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: (name, width, height, mobile, device scale factor)
VIEWPORTS = {
    390: ("phone", 390, 844, True, 3),
    1280: ("laptop", 1280, 800, False, 1),
}

MEASURE = r"""
(() => {
  const problems = [];
  const width = __WIDTH__;  // the emulated width: a phone widens innerWidth to fit content
  const page = document.documentElement.scrollWidth;
  if (page > width + 1) {
    problems.push(`the page is ${page} px wide in a ${width} px viewport`);
  }
  const label = (box) => {
    const first = box.tagName === "PRE"
      ? box.textContent.split("\n")[0]
      : (box.querySelector("caption, th, td") || box).textContent.trim();
    const kind = box.tagName === "PRE" ? "code block" : "table";
    return `${kind} ${JSON.stringify(first.slice(0, 60))}`;
  };
  const boxes = [...document.querySelectorAll("article pre, article div.table-wrapper")];
  const wide = boxes.filter((box) => box.scrollWidth > box.clientWidth + 1);
  for (const box of wide) {
    const style = getComputedStyle(box);
    const size = `${box.scrollWidth} px in ${box.clientWidth} px`;
    if (!["auto", "scroll"].includes(style.overflowX)) {
      problems.push(`${label(box)} is cut off (${size}, no scrolling)`);
    } else if (!style.backgroundImage.includes("gradient")) {
      problems.push(`${label(box)} scrolls (${size}) with no scroll affordance`);
    }
  }
  for (const out of document.querySelectorAll("div.output")) {
    const labels = [out, ...out.querySelectorAll("*")].filter(
      (el) => getComputedStyle(el, "::before").content === '"output"');
    if (labels.length !== 1) {
      problems.push(`an output block shows its label ${labels.length} times`);
    }
  }
  return JSON.stringify({problems, wide: wide.length});
})()
"""


class DevTools:
    """One headless Chromium, spoken to through ``--remote-debugging-pipe``."""

    def __init__(self, profile: str) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        command = [
            shutil.which("chromium") or "chromium", "--headless", "--no-sandbox",
            "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--hide-scrollbars",
            "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank",
        ]
        def child_fds() -> None:
            # Chromium reads commands on fd 3 and writes answers on fd 4; move
            # both ends out of the way first, so neither dup2 closes the other.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self._process = subprocess.Popen(
            command, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, process_group=0,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._buffer = b""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events in between are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    msg = f"{method}: {answer['error']}"
                    raise RuntimeError(msg)
                return answer.get("result", {})  # type: ignore[no-any-return]

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the page's session."""
        return self.call(method, self._session, **params)

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                msg = "Chromium closed the DevTools pipe"
                raise RuntimeError(msg)
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop Chromium and every helper process it started."""
        # Its renderer and crash handler outlive the browser process and may
        # still write to the profile while the caller removes it: the whole
        # process group goes.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGTERM)
        self._process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self._process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def measure(tools: DevTools, page: Path, width: int, shot: Path | None) -> dict[str, Any]:
    """Lay ``page`` out at ``width`` and return what :data:`MEASURE` found."""
    _, w, h, mobile, scale = VIEWPORTS[width]
    tools.page("Emulation.setDeviceMetricsOverride", width=w, height=h,
               deviceScaleFactor=scale, mobile=mobile)
    tools.page("Page.navigate", url=page.as_uri())
    deadline = time.monotonic() + 30
    while True:
        state = tools.page("Runtime.evaluate", expression="document.readyState")
        if state["result"].get("value") == "complete" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    script = MEASURE.replace("__WIDTH__", str(w))
    result = tools.page("Runtime.evaluate", expression=script, returnByValue=True)
    found = json.loads(result["result"]["value"])
    if shot is not None:
        import base64

        image = tools.page("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        shot.write_bytes(base64.b64decode(image["data"]))
    return found  # type: ignore[no-any-return]


def pages_of(html: Path, names: list[str]) -> list[Path]:
    """The pages named, or every content page of the build."""
    if names:
        return [html / name for name in names]
    return sorted(
        p for p in html.rglob("*.html")
        if not p.relative_to(html).parts[0].startswith("_")
        and p.name not in ("genindex.html", "search.html", "py-modindex.html")
    )


def main(argv: list[str] | None = None) -> int:
    """Check every page (or the ones named) at every width; print the problems."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path, help="the built HTML folder")
    parser.add_argument("pages", nargs="*", help="pages relative to it (default: all)")
    parser.add_argument("--widths", type=int, nargs="+", default=sorted(VIEWPORTS),
                        choices=sorted(VIEWPORTS))
    parser.add_argument("--screenshots", type=Path, help="save a full-page PNG of each page")
    args = parser.parse_args(argv)
    html = args.html.resolve()
    pages = pages_of(html, args.pages)
    failed = 0
    with tempfile.TemporaryDirectory() as profile:
        tools = DevTools(profile)
        try:
            for width in args.widths:
                bad = 0
                for page in pages:
                    name = page.relative_to(html)
                    shot = None
                    if args.screenshots:
                        args.screenshots.mkdir(parents=True, exist_ok=True)
                        stem = str(name).replace("/", "-").removesuffix(".html")
                        shot = args.screenshots / f"{stem}-{width}.png"
                    found = measure(tools, page, width, shot)
                    for problem in found["problems"]:
                        print(f"{name} at {width} px: {problem}")
                    bad += bool(found["problems"])
                print(f"{len(pages)} pages at {width} px ({VIEWPORTS[width][0]}): "
                      f"{bad} with problems")
                failed += bad
        finally:
            tools.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
