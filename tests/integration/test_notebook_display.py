"""``task.report()._repr_html_()`` (what Jupyter shows) of a real distributed run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import bellis
from bellis._report._panel import format_bytes, format_duration

SVG = "{http://www.w3.org/2000/svg}"

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import bellis
    from bellis import Roi

    def f(block):
        time.sleep(0.02)
        if tuple(int(o) for o in block.write_roi.offset) == (10, 20):
            raise ValueError("injected failure")

    task = bellis.Task("paint", total_roi=Roi((0, 0), (30, 40)), read_roi=Roi((0, 0), (10, 10)),
                       write_roi=Roi((0, 0), (10, 10)), process_function=f,
                       read_write_conflict=False, max_workers=2, max_retries=1,
                       resource_tracking=True, tracking_path=sys.argv[1])
    bellis.run_blockwise([task], progress=False, summary=False)
    report = task.report()
    with open(sys.argv[2], "w") as fh:
        fh.write(report._repr_html_())
    pipeline = bellis.RunReport({"paint": report})
    with open(sys.argv[3], "w") as fh:
        fh.write(pipeline._repr_html_())
    """
)


def test_repr_html_of_a_real_run(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    store, out, run_out = tmp_path / "paint", tmp_path / "task.html", tmp_path / "run.html"
    proc = subprocess.run(
        [sys.executable, str(script), str(store), str(out), str(run_out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    root = ET.fromstring(f"<root>{html}</root>")

    report = bellis.TaskReport(json.loads((store / "runs.jsonl").read_text()), store)
    assert report.blocks.wall is not None and report.blocks.peak_rss is not None
    cells = ["".join(td.itertext()) for td in root.iter("td")]
    assert cells[cells.index("wall") + 1].startswith(format_duration(report.blocks.wall.mean))
    assert cells[cells.index("peak RSS") + 1].startswith(format_bytes(report.blocks.peak_rss.mean))
    assert cells[cells.index("blocks") + 1] == "11 run, 0 skipped, 2 failed attempts"
    table = [
        ["".join(td.itertext()) for td in tr.iter("td")]
        for tr in root.iter("tr")
        if len(list(tr.iter("td"))) == 10
    ]
    assert [(int(r[0]), int(r[3]), r[9]) for r in table] == [
        (w.worker_id, w.blocks, w.exit) for w in report.workers.records
    ]

    # the timeline: one row per worker, its block count from the store, the failed block
    (svg,) = root.iter(f"{SVG}svg")
    per_worker = Counter(r.worker_id for r in report.block_records())
    titles = {
        t.text.split(":")[0]: t.text
        for t in svg.iter(f"{SVG}title")
        if t.text and re.match(r"worker \d+: \d+ blocks, \d+ failed$", t.text)
    }
    assert set(titles) >= {f"worker {w}" for w in per_worker}
    failed_rows = 0
    for w, title in titles.items():
        n_done = per_worker[int(w.split()[1])]
        n_blocks, n_failed = (int(x.split()[0]) for x in title.split(": ")[1].split(", "))
        assert n_blocks - n_failed == n_done
        failed_rows += n_failed
    assert failed_rows == 1  # the store keeps the last failed attempt of the failed block
    assert any(r.get("fill") == "#d65f5f" for r in svg.iter(f"{SVG}rect"))

    run_html = run_out.read_text()
    assert "run report: 1 tasks" in run_html and html in run_html
