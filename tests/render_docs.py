"""Render the built documentation site in headless Chromium and report what it cuts off.

Not a test (CI has no browser): the measurement behind tests/test_docs.py's CODE_WIDTH and
TABLE_CELL_WIDTH. Run it after a change to the theme, its fonts or docs/stylesheets/extra.css:

    apt-get install -y chromium        # Debian's package; any Chromium or Chrome will do
    make docs                          # builds site/
    .venv/bin/python tests/render_docs.py [--screenshots DIR] [--width 1280]

It serves site/ on 127.0.0.1, adds a small script to every page it serves, and loads each
page at a 1280x800 window. The script measures, for every ``pre > code`` block, how many
characters of the code font fit in its box and whether the block scrolls (scrollWidth >
clientWidth), and for every table whether it is wider than its container. It prints the
characters that fit in a top-level code block and each block or table that overflows, and
exits 1 if any does. With --screenshots it also saves a PNG of each page's first screen.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Runs once the page's fonts are ready; leaves its findings as JSON in a <script> element,
# which --dump-dom prints with the rest of the DOM.
MEASURE = r"""
<script>
(async () => {
  await document.fonts.ready;
  const at = new URLSearchParams(location.search).get("at");  // --shot PAGE#ANCHOR
  // Headless screenshots are of the top of the page: drop what comes before the anchor.
  // ANCHOR is a heading's id, or table-N / code-N for the page's N-th table or code block.
  const [kind, nth] = (at || "").split("-");
  let el = !at ? null : kind === "table" ? document.querySelectorAll(".md-content table")[+nth]
    : kind === "code" ? document.querySelectorAll(".md-content pre")[+nth] : document.getElementById(at);
  while (el && el.parentElement && !el.parentElement.classList.contains("md-content__inner")) el = el.parentElement;
  while (el && el.previousElementSibling) el.previousElementSibling.remove();
  const out = {viewport: innerWidth, blocks: [], tables: []};
  for (const code of document.querySelectorAll(".md-content pre > code")) {
    const probe = document.createElement("span");
    probe.textContent = "x".repeat(200);
    code.appendChild(probe);
    const charWidth = probe.getBoundingClientRect().width / 200;
    probe.remove();
    const style = getComputedStyle(code);
    const room = code.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const lines = code.textContent.replace(/\n$/, "").split("\n");
    out.blocks.push({
      fits: Math.floor(room / charWidth + 0.01),
      room: room, charWidth: charWidth,
      longest: Math.max(...lines.map((l) => l.length)),
      overflows: code.scrollWidth > code.clientWidth + 1,
      // An overflow the reader sees: a scrollbar that takes room (drawn, not an overlay that
      // hides until scrolled) and the edge shadows of extra.css.
      scrollbar: code.offsetHeight - code.clientHeight,
      shadows: style.backgroundAttachment.includes("local"),
      nested: !!code.closest("li, .admonition, details"),
      first: lines[0].slice(0, 60),
      font: style.fontFamily + " " + style.fontSize,
    });
  }
  const content = document.querySelector(".md-content__inner");
  const right = content.getBoundingClientRect().right;
  for (const table of document.querySelectorAll(".md-content table")) {
    const box = table.closest(".md-typeset__scrollwrap") || table.parentElement;
    const saved = table.style.width;
    table.style.width = "min-content";  // the narrowest it can be, every cell wrapped at its spaces
    const narrowest = table.getBoundingClientRect().width;
    table.style.width = saved;
    out.tables.push({
      narrowest: narrowest,
      room: box.clientWidth,
      overflows: table.scrollWidth > table.clientWidth + 1 || box.scrollWidth > box.clientWidth + 1,
      widerThanPage: table.getBoundingClientRect().right > right + 1,
      header: [...table.querySelectorAll("th")].map((th) => th.textContent.trim()).join(" | ").slice(0, 80),
    });
  }
  const report = document.createElement("script");
  report.type = "application/json";
  report.id = "overflow-report";
  report.textContent = JSON.stringify(out);
  document.body.appendChild(report);
})();
</script>
"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves site/, with the measuring script before each page's </body>."""

    def send_head(self):  # type: ignore[override]
        path = Path(self.translate_path(self.path))
        if path.is_dir():
            path = path / "index.html"
        if path.suffix != ".html" or not path.is_file():
            return super().send_head()
        body = (
            path.read_text(encoding="utf-8")
            .replace("</body>", MEASURE + "</body>")
            .encode()
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, *args: object) -> None:
        pass


def _chromium(width: int, *args: str) -> list[str]:
    binary = (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )
    if binary is None:
        sys.exit("no Chromium: apt-get install -y chromium")
    return [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tempfile.mkdtemp(prefix='render-docs-')}",
        f"--window-size={width},800",
        "--run-all-compositor-stages-before-draw",
        "--virtual-time-budget=5000",
        *args,
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=REPO / "site")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--screenshots", type=Path, help="save a PNG of each page here")
    parser.add_argument(
        "--page", action="append", help="only these pages (paths under the site)"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also list the blocks that scroll visibly",
    )
    parser.add_argument(
        "--shot",
        action="append",
        default=[],
        help="PAGE#ANCHOR: a PNG from that heading (or table-N, code-N) down",
    )
    options = parser.parse_args()
    if not (options.site / "index.html").is_file():
        sys.exit(f"{options.site} has no index.html: run `make docs` first")
    pages = options.page or sorted(
        str(p.parent.relative_to(options.site)) + "/"
        for p in options.site.rglob("index.html")
        if "assets" not in p.parts
    )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(options.site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    if options.screenshots:
        options.screenshots.mkdir(parents=True, exist_ok=True)
    widths: set[int] = set()
    problems = scrolling = 0
    env = {**os.environ, "HOME": tempfile.mkdtemp(prefix="render-docs-home-")}
    for page in pages:
        url = base + ("" if page == "./" else page)
        dom = subprocess.run(
            _chromium(options.width, "--dump-dom", url),
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        ).stdout
        found = re.search(
            r'<script type="application/json" id="overflow-report">(.*?)</script>',
            dom,
            re.DOTALL,
        )
        if found is None:
            print(f"{page}: no report (the page did not finish loading)")
            problems += 1
            continue
        report = json.loads(html.unescape(found.group(1)))
        for block in report["blocks"]:
            if not block["nested"]:
                widths.add(block["fits"])
            if not (block["overflows"] or block["longest"] > block["fits"]):
                continue
            where = f"{page}: code block, {block['longest']} > {block['fits']} chars: {block['first']!r}"
            if block["scrollbar"] > 0 and block["shadows"]:
                scrolling += 1
                if options.verbose:
                    print(f"{where}: scrolls, visibly")
            else:
                problems += 1
                print(f"{where}: cut off")
        for table in report["tables"]:
            if table["overflows"] or table["widerThanPage"]:
                problems += 1
                print(f"{page}: table overflows: {table['header']!r}")
        if options.screenshots:
            name = page.strip("./").replace("/", "-") or "home"
            subprocess.run(
                _chromium(
                    options.width, f"--screenshot={options.screenshots / name}.png", url
                ),
                capture_output=True,
                timeout=120,
                env=env,
                check=False,
            )
    for shot in options.shot:
        page, _, anchor = shot.partition("#")
        name = (page.strip("/").replace("/", "-") or "home") + f"-{anchor}.png"
        out = (options.screenshots or Path(".")) / name
        subprocess.run(
            _chromium(
                options.width, f"--screenshot={out}", f"{base}{page}?at={anchor}"
            ),
            capture_output=True,
            timeout=120,
            env=env,
            check=False,
        )
        print(f"saved {out}")
    server.shutdown()
    print(
        f"viewport {options.width}px: a top-level code block fits {sorted(widths)} characters; "
        f"{scrolling} block(s) scroll visibly; {problems} cut off"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
