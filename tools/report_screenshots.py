"""Regenerate docs/img/report-*.png: one small screenshot per section of the demo's report.

    PYTHONPATH=src python tools/report_screenshots.py [--workdir DIR]

Runs ``bellis demo`` (two tasks on a 96^3 volume), which writes ``report.html``, then
shows each section of that page alone in headless Chromium (``chromium`` on the PATH)
and saves a PNG of it. Chromium is started as the report tests start it
(``tests/integration/browser.py``: one set of flags).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import browser  # noqa: E402  (tests/integration/browser.py: how Chromium is started)

SECTIONS = {
    "advice": "900,330",
    "timeline": "900,420",
    "volume": "900,640",
    "distributions": "900,760",
    "throughput": "900,460",
    "workers": "900,500",
    "history": "900,520",
}


_SHOW_WALL = """<script>
var iv = setInterval(function () {
  if (document.body.getAttribute("data-rendered") !== "yes") { return; }
  clearInterval(iv);
  var v = window.bellisReport.volumes;
  Object.keys(v).forEach(function (k) { v[k].show("wall_seconds", 0, 1); });
}, 50);
</script>"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", help="where the demo runs (default: a temporary folder)")
    p.add_argument("--out", default=str(ROOT / "docs" / "img"), help="where the PNGs go")
    args = p.parse_args()
    if browser.chromium() is None:
        raise SystemExit("tools/report_screenshots.py needs chromium on the PATH")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bellis-shots-")).resolve()
    subprocess.run(
        [sys.executable, "-m", "bellis", "demo", "--workdir", str(work), "--fresh"], check=True
    )
    page = (work / "report.html").read_text(encoding="utf-8")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for section, size in SECTIONS.items():
        css = (
            "<style>body>h1,body>p,body>div.note,body>table,section{display:none!important}"
            f"section#{section}{{display:block!important}}"
            f"section#{section} h2{{margin-top:4px}}</style>"
        )
        text = page.replace("</head>", css + "</head>", 1)
        if section == "volume":  # show a measured figure rather than the all-done state
            text = text.replace("</body>", _SHOW_WALL + "</body>")
        one = work / f"only-{section}.html"
        one.write_text(text, encoding="utf-8")
        png = out / f"report-{section}.png"
        png.unlink(missing_ok=True)  # browser.screenshot checks that a new one was written
        browser.screenshot(one, png, size=size, wait_ms=20_000)
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
