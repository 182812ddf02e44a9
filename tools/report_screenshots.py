"""Regenerate docs/img/report-*.png: one small screenshot per section of the demo's report.

    PYTHONPATH=src python tools/report_screenshots.py [--workdir DIR] [--only SECTION ...]

Runs ``bellis demo`` (two tasks on a 96^3 volume), which writes ``report.html``, then
shows each section of that page alone in headless Chromium (``chromium`` on the PATH)
and saves a PNG of it. The demo's blocks do not fail, so the Failures section is shown
from the report of the tests' failing pipeline (``tests/kit/failing_pipeline.py``), with
one block's details open as a click opens them. Chromium is started as the report tests
start it (``tests/kit/browser.py``: one set of flags).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kit import browser  # noqa: E402  (how Chromium is started, as the tests start it)
from kit.failing_pipeline import VALUE_BLOCKS, run_failing  # noqa: E402

SECTIONS = {
    "advice": "900,330",
    "failures": "900,900",
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

_SHOW_BLOCK = """<script>
var iv = setInterval(function () {
  if (document.body.getAttribute("data-rendered") !== "yes") { return; }
  clearInterval(iv);
  window.bellisReport.showBlock(0, "BLOCK", "failures-detail", 3);
}, 50);
</script>""".replace("BLOCK", ",".join(map(str, VALUE_BLOCKS[0])))


def _failures_page(work: Path) -> str:
    """The report of a run whose blocks fail (the demo's do not)."""
    failing = work / "failing"
    failing.mkdir(exist_ok=True)
    run = run_failing(failing, tracked=True, flaky=True)
    page = failing / "report.html"
    subprocess.run(
        [sys.executable, "-m", "bellis", "report", str(run.store), "-o", str(page)], check=True
    )
    return page.read_text(encoding="utf-8").replace("</body>", _SHOW_BLOCK + "</body>")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", help="where the demo runs (default: a temporary folder)")
    p.add_argument("--out", default=str(ROOT / "docs" / "img"), help="where the PNGs go")
    p.add_argument("--only", nargs="+", choices=sorted(SECTIONS), help="these sections only")
    args = p.parse_args()
    if browser.chromium() is None:
        raise SystemExit("tools/report_screenshots.py needs chromium on the PATH")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bellis-shots-")).resolve()
    sections = {s: SECTIONS[s] for s in args.only or SECTIONS}
    page = ""
    if set(sections) - {"failures"}:
        subprocess.run(
            [sys.executable, "-m", "bellis", "demo", "--workdir", str(work), "--fresh"],
            check=True,
        )
        page = (work / "report.html").read_text(encoding="utf-8")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for section, size in sections.items():
        css = (
            "<style>body>h1,body>p,body>div.note,body>table,section{display:none!important}"
            f"section#{section}{{display:block!important}}"
            f"section#{section} h2{{margin-top:4px}}</style>"
        )
        source = _failures_page(work) if section == "failures" else page
        text = source.replace("</head>", css + "</head>", 1)
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
