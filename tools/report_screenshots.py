"""Regenerate docs/img/report-*.png: one small screenshot per section of the demo's report.

    PYTHONPATH=src python tools/report_screenshots.py [--workdir DIR]

Runs ``bellis demo`` (two tasks on a 96^3 volume), which writes ``report.html``, then
shows each section of that page alone in headless Chromium (``chromium`` on the PATH)
and saves a PNG of it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {
    "advice": "900,330",
    "timeline": "900,420",
    "volume": "900,640",
    "distributions": "900,760",
    "throughput": "900,460",
    "workers": "900,500",
    "history": "900,520",
}
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


_SHOW_WALL = """<script>
var iv = setInterval(function () {
  if (document.body.getAttribute("data-rendered") !== "yes") { return; }
  clearInterval(iv);
  var v = window.bellisReport.volumes;
  Object.keys(v).forEach(function (k) { v[k].show("wall_seconds", 0, 1); });
}, 50);
</script>"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    raise SystemExit("tools/report_screenshots.py needs chromium on the PATH")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", help="where the demo runs (default: a temporary folder)")
    p.add_argument("--out", default=str(ROOT / "docs" / "img"), help="where the PNGs go")
    args = p.parse_args()
    exe = _chromium()
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
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [
                    exe,
                    *FLAGS,
                    f"--user-data-dir={profile}",
                    f"--window-size={size}",
                    "--virtual-time-budget=20000",
                    f"--screenshot={png}",
                    one.as_uri(),
                ],
                check=True,
                capture_output=True,
            )
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
