"""The HTML run report (issue 16): ``bellis report`` on real stores, checked in Chromium.

A script in ``tmp_path`` runs a real distributed pipeline: two tasks on a 4 x 4 x 4 block
grid with resource tracking, one with blocks that always fail, one with a block that
fails once and succeeds on its retry. ``bellis report`` (the CLI) writes the page; headless
Chromium loads it (``browser.py``) and the tests assert what a user sees: no JavaScript
error, a rendered plot in every section, a screenshot that is not blank, the hover text
of a known block naming its grid coordinate, the failed blocks in the failure map at
their coordinates. Other tests cover a daisy 2.0.0 store, a store without resource
tracking, a run still in flight, ``TaskReport.to_html`` and ``bellis.write_report``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kit import browser

COMPAT = Path(__file__).parent.parent / "compat"
BELLIS = [sys.executable, "-m", "bellis"]
FAILING = [(1, 2, 3), (2, 0, 1), (3, 3, 0)]
RETRIED = (0, 1, 2)
needs_chromium = pytest.mark.skipif(
    browser.chromium() is None, reason="no chromium on PATH (.ci/run installs Debian's)"
)

PIPELINE = r"""
import os, sys, time
from pathlib import Path

import bellis

BASE = Path(sys.argv[1])
FAILING = {tuple(c) for c in FAILING_CELLS}
RETRIED = tuple(RETRIED_CELL)
SLEEP = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
TRACK = (sys.argv[3] != "untracked") if len(sys.argv) > 3 else True


def cell(block):
    return tuple(o // 8 for o in block.write_roi.offset)


def segment(block):
    time.sleep(SLEEP)
    bytearray(1 << 20)
    if cell(block) in FAILING:
        raise ValueError(f"injected failure at {cell(block)}")


def measure(block):
    time.sleep(SLEEP)
    marker = BASE / "retried-once"
    if cell(block) == RETRIED and not marker.exists():
        marker.write_text("x")
        raise ValueError("injected failure, once")


def main():
    bellis.set_tracking_basedir(BASE / "tracking")
    total = bellis.Roi((0, 0, 0), (32, 32, 32))
    block = bellis.Roi((0, 0, 0), (8, 8, 8))
    tasks = [
        bellis.Task(name, total, block, block, fn, max_workers=2, max_retries=1,
                    resource_tracking=TRACK, read_write_conflict=False)
        for name, fn in (("segment", segment), ("measure", measure))
    ]
    ok = bellis.run_blockwise(tasks, progress=False, summary=False)
    print("OK" if ok else "FAILED")


if __name__ == "__main__":
    main()
""".replace("FAILING_CELLS", repr(FAILING)).replace("RETRIED_CELL", repr(RETRIED))


def _env() -> dict[str, str]:
    return dict(os.environ)


def _pipeline(tmp: Path, *extra: str) -> subprocess.Popen[str]:
    script = tmp / "pipeline.py"
    script.write_text(PIPELINE)
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp), *extra],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def _run_pipeline(tmp: Path, *extra: str) -> None:
    proc = _pipeline(tmp, *extra)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert out.strip().splitlines()[-1] == "FAILED", out + err  # some blocks failed


def _report(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BELLIS, "report", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )


def _payload(page: Path) -> dict[str, Any]:
    text = page.read_text(encoding="utf-8")
    m = re.search(r'<script id="bellis-data" type="application/json">(.*?)</script>', text, re.S)
    assert m is not None, "no bellis-data in the page"
    data: dict[str, Any] = json.loads(m.group(1).replace("<\\/", "</"))
    return data


def _f32(spec: dict[str, str]) -> list[float]:
    import numpy as np

    return np.frombuffer(base64.b64decode(spec["bdata"]), dtype="<f4").tolist()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def pipeline_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    _run_pipeline(tmp, "0.02")
    proc = _report(str(tmp / "tracking"), "-o", str(tmp / "out" / "run.html"), cwd=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = tmp / "out" / "run.html"
    assert proc.stdout.strip() == f"wrote {page}"
    return page


def test_page_is_self_contained_and_holds_the_stores(pipeline_report: Path) -> None:
    text = pipeline_report.read_text(encoding="utf-8")
    # works offline: plotly.js is inline, nothing is fetched (no src= / href= to a URL)
    scripts = re.findall(r"<script>(.*?)</script>", text, re.S)
    assert "plotly.js v" in scripts[0] and len(scripts[0]) > 1_000_000
    markup = re.sub(r"<script[^>]*>.*?</script>", "", text, flags=re.S)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", markup)
    data = _payload(pipeline_report)
    volumes = {v["task"]: v for v in data["volumes"]}
    assert set(volumes) == {"segment", "measure"}
    seg = volumes["segment"]
    assert seg["shape"] == [4, 4, 4] and seg["factor"] == 1
    failures = _f32(seg["metrics"]["failures"])
    failed = {(k // 16, (k // 4) % 4, k % 4) for k, v in enumerate(failures) if v > 0}
    assert failed == set(FAILING)
    # the retried block of `measure` is done, after one failed attempt
    meas = volumes["measure"]
    k = RETRIED[0] * 16 + RETRIED[1] * 4 + RETRIED[2]
    assert _f32(meas["metrics"]["state"])[k] == 2.0
    assert _f32(meas["metrics"]["failures"])[k] == 1.0
    # every block of the timeline is drawn, and one known block's hover names it
    timeline = data["figures"]["timeline"]["data"]
    texts = [
        t
        for tr in timeline
        if not tr["name"].endswith(": failed attempt")
        for t in tr.get("text", [])
    ]
    assert len(texts) == 64 - len(FAILING) + 64
    assert any(t.startswith("<b>measure</b> block (0, 1, 2)") for t in texts)
    assert any("ROI [0:8, 8:16, 16:24)" in t for t in texts)
    # the permanently failed blocks have bars of their own: their last failed attempts
    bars = [tr for tr in timeline if tr["name"] == "segment: failed attempt"]
    assert [tr["mode"] for tr in bars] == ["lines", "markers"]
    assert len(bars[0]["x"]) == 3 * len(FAILING)  # one segment each, split by None
    hovers = bars[1]["text"]
    assert sorted(
        re.findall(r"block (\(\d, \d, \d\)): <b>failed attempt", "".join(hovers))
    ) == sorted(str(c) for c in FAILING)
    assert all("failures 2" in t and "worker " in t and "ROI [" in t for t in hovers), hovers
    assert not any("measure: failed attempt" in tr["name"] for tr in timeline)  # retried, done
    # the failed attempts are also named on their workers' rows
    rows = data["figures"]["timeline"]["layout"]["yaxis"]["ticktext"]
    assert any(r.startswith("segment · worker") and "failed, exit" in r for r in rows), rows
    # advice is derived from the figures: the failed blocks are named
    assert "segment: 3 block(s) failed and are not done" in text
    assert "p99 peak RSS" in text


@needs_chromium
def test_report_renders_in_chromium(pipeline_report: Path) -> None:
    probe = """
    var out = {sections: {}, hover: null, failed: []};
    document.querySelectorAll('.plot').forEach(function (d) {
      var s = d.getAttribute('data-section');
      var n = d.querySelectorAll('.main-svg').length + d.querySelectorAll('canvas').length;
      out.sections[s] = (out.sections[s] || 0) + n;
    });
    var vols = window.bellisReport.volumes, seg = null;
    Object.keys(vols).forEach(function (k) { if (vols[k].task === 'segment') { seg = k; } });
    var gd = document.getElementById('plot-' + seg);
    for (var z = 0; z < 4; z++) {
      await vols[seg].show('failures', 0, z);
      var Z = gd.data[0].z;
      for (var y = 0; y < Z.length; y++) {
        for (var x = 0; x < Z[y].length; x++) { if (Z[y][x] > 0) { out.failed.push([z, y, x]); } }
      }
    }
    var tl = document.querySelector('.plot[data-section="timeline"]');
    out.attempts = [];
    tl.data.forEach(function (tr) {
      if (tr.name === 'segment: failed attempt' && tr.text) { out.attempts = tr.text.slice(); }
    });
    await vols[seg].show('state', 0, 1);
    Plotly.Fx.hover(gd, {xval: 3, yval: 2}, 'xy');
    await new Promise(function (r) { setTimeout(r, 200); });
    var layer = gd.querySelector('.hoverlayer');
    out.hover = layer ? layer.textContent : null;
    return out;
    """
    found = browser.load(pipeline_report, probe)
    assert found["errors"] == [], found["errors"]
    assert found["rendered"] == "yes"
    result = found["result"]
    sections = result["sections"]
    expected = {"timeline", "volume", "distributions", "throughput", "workers", "history"}
    assert set(sections) == expected
    assert all(n > 0 for n in sections.values()), sections
    assert sorted(map(tuple, result["failed"])) == sorted(FAILING)
    # the timeline as drawn holds a failed-attempt bar per failed block, its hover text
    # naming the block's grid coordinate
    attempts = result["attempts"]
    assert len(attempts) == len(FAILING), attempts
    for c in FAILING:
        assert any(f"block {c}: <b>failed attempt</b>" in t for t in attempts), attempts
    hover = result["hover"]
    assert hover is not None and "block (1, 2, 3)" in hover, hover
    assert "state failed" in hover and "ROI [8:16, 16:24, 24:32)" in hover, hover

    png = pipeline_report.parent / "page.png"
    browser.screenshot(pipeline_report, png)
    assert browser.png_colours(png) > 30


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    proc = _report(str(tmp_path / "nowhere"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "nowhere" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = _report(str(tmp_path / "empty"), cwd=tmp_path)
    assert proc.returncode == 2 and "no tracking store" in proc.stderr
    assert not (tmp_path / "report.html").exists()


def test_daisy_store_says_what_is_missing(tmp_path: Path) -> None:
    store = tmp_path / "daisy_store"
    shutil.copytree(COMPAT / "daisy_store_fixture", store)
    proc = _report(str(store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "the store has no worker_id, sent_at, returned_at, cpu_children_seconds" in text
    assert "No block has time stamps" in text
    if browser.chromium() is not None:
        found = browser.load(tmp_path / "report.html")
        assert found["errors"] == [] and found["rendered"] == "yes"


def test_untracked_store_shows_done_and_failures(tmp_path: Path) -> None:
    _run_pipeline(tmp_path, "0", "untracked")
    out = tmp_path / "untracked.html"
    proc = _report(str(tmp_path / "tracking" / "segment"), "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text(encoding="utf-8")
    note = "written without resource tracking: only done, failures and code versions are shown"
    assert note in text
    seg = _payload(out)["volumes"][0]
    assert set(seg["metrics"]) == {"state", "failures", "code_version"}
    failed = {k for k, v in enumerate(_f32(seg["metrics"]["failures"])) if v > 0}
    assert failed == {z * 16 + y * 4 + x for z, y, x in FAILING}
    if browser.chromium() is not None:
        found = browser.load(out)
        assert found["errors"] == [] and found["rendered"] == "yes"


def test_run_in_flight_gives_a_partial_report(tmp_path: Path) -> None:
    proc = _pipeline(tmp_path, "0.3")
    try:
        done = tmp_path / "tracking" / "segment" / "done" / "c" / "0" / "0" / "0"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if done.exists() and sum(done.read_bytes()) >= 4:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        else:
            pytest.fail("the run recorded no block within 300 s")
        out = tmp_path / "partial.html"
        rep = _report(str(tmp_path / "tracking"), "-o", str(out), cwd=tmp_path)
        assert proc.poll() is None, "the run ended before the report was written"
    finally:
        proc.kill()
        proc.communicate()
    assert rep.returncode == 0, rep.stderr
    text = out.read_text(encoding="utf-8")
    assert "Partial report: a run is still in flight." in text
    assert f"a run is in flight (pid {proc.pid} on host" in text


def test_task_report_to_html_and_write_report(tmp_path: Path) -> None:
    script = tmp_path / "api.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\nimport bellis\n"
        "base = Path(sys.argv[1])\n"
        "bellis.set_tracking_basedir(base / 'tracking')\n"
        "roi = bellis.Roi((0, 0), (40, 40))\nblk = bellis.Roi((0, 0), (10, 10))\n"
        "t = bellis.Task('plane', roi, blk, blk, lambda b: None, max_workers=2,\n"
        "                resource_tracking=True)\n"
        "assert bellis.run_blockwise([t], progress=False, summary=False)\n"
        "print(t.report().to_html(base / 'task.html'))\n"
        "print(bellis.write_report([base / 'tracking'], base / 'all.html'))\n"
        "print('plotly' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines == [str(tmp_path / "task.html"), str(tmp_path / "all.html"), "True"]
    for name in ("task.html", "all.html"):
        vol = _payload(tmp_path / name)["volumes"]
        assert [(v["task"], v["shape"]) for v in vol] == [("plane", [4, 4])]
        done = _f32(vol[0]["metrics"]["state"])
        assert done == [1.0] * 16


def test_demo_writes_its_report(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    proc = subprocess.run(
        [*BELLIS, "demo", "--workdir", str(work), "--size", "64"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = work / "report.html"
    assert f"report: {page} (open it in a browser)" in proc.stdout
    assert sorted(v["task"] for v in _payload(page)["volumes"]) == ["label", "smooth"]


RESUMED = r"""
import sys
from pathlib import Path

import bellis

BASE = Path(sys.argv[1])
FAIL = sys.argv[2] == "fail"


def work(block):
    if FAIL and block.write_roi.offset[0] == 0:
        raise ValueError("injected failure in the first row")


bellis.set_tracking_basedir(BASE / "tracking")
roi, blk = bellis.Roi((0, 0), (40, 40)), bellis.Roi((0, 0), (10, 10))
task = bellis.Task("grow", roi, blk, blk, work, max_workers=2, max_retries=0,
                   resource_tracking=True)
print("OK" if bellis.run_blockwise([task], progress=False, summary=False) else "FAILED")
"""


def test_run_selector_lists_every_run(tmp_path: Path) -> None:
    """Two runs of one task, the second resuming the first: the timeline's run menu has a
    labelled entry per line of runs.jsonl, and the failed attempts of run 1 turn into
    blocks done after failed attempts once run 2 redoes them."""
    import datetime

    script = tmp_path / "resumed.py"
    script.write_text(RESUMED)
    store = tmp_path / "tracking" / "grow"
    pages = []
    for n, (mode, outcome) in enumerate((("fail", "FAILED"), ("pass", "OK")), start=1):
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path), mode],
            capture_output=True,
            text=True,
            timeout=600,
            env=_env(),
        )
        assert proc.returncode == 0 and proc.stdout.split() == [outcome], proc.stderr
        page = tmp_path / f"after-{n}.html"
        rep = _report(str(store), "-o", str(page), cwd=tmp_path)
        assert rep.returncode == 0, rep.stderr
        pages.append(page)

    # after run 1: the 4 blocks of the first row are failed-attempt bars
    first = _payload(pages[0])["figures"]["timeline"]["data"]
    (hover,) = [tr for tr in first if tr["name"] == "grow: failed attempt" and "text" in tr]
    assert sorted(re.findall(r"block (\(\d, \d\)): <b>failed", "".join(hover["text"]))) == [
        f"(0, {x})" for x in range(4)
    ]

    runs = [json.loads(x) for x in (store / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2
    assert [r["blocks"]["count"] for r in runs] == [12, 4], runs  # run 2 redid the first row
    layout = _payload(pages[1])["figures"]["timeline"]["layout"]
    buttons = layout["updatemenus"][0]["buttons"]
    assert buttons[0]["label"] == "all runs"
    assert len(buttons) == 1 + len(runs)
    for n, (b, r) in enumerate(zip(buttons[1:], runs, strict=True), start=1):
        when = datetime.datetime.fromtimestamp(r["run_started_at"], datetime.UTC)
        prefix = f"run {n}: {when:%Y-%m-%d %H:%M:%S} UTC, {r['blocks']['count']} blocks"
        assert b["label"].startswith(prefix), (b["label"], prefix)
        assert ", wall " in b["label"]
        lo, hi = b["args"][0]["xaxis.range"]  # choosing it zooms to the run's window
        span = r["run_finished_at"] - r["run_started_at"]
        assert hi - lo == pytest.approx(span * 1.04, rel=1e-3, abs=1e-3)
    assert "(12 skipped)" in buttons[2]["label"]
    # run 2 redid the failed blocks: no failed-attempt bar is left, they are orange bars now
    second = _payload(pages[1])["figures"]["timeline"]["data"]
    assert not any(tr["name"].endswith(": failed attempt") for tr in second)
    (retried,) = [
        tr for tr in second if "done after failed attempts" in tr["name"] and "text" in tr
    ]
    assert len(retried["text"]) == 4

    if browser.chromium() is not None:
        probe = """
        var gd = document.querySelector('.plot[data-section="timeline"]');
        var menu = gd.layout.updatemenus[0].buttons;
        await Plotly.relayout(gd, menu[1].args[0]);
        return {labels: menu.map(function (b) { return b.label; }), range: gd.layout.xaxis.range};
        """
        found = browser.load(pages[1], probe)
        assert found["errors"] == [] and found["rendered"] == "yes"
        assert found["result"]["labels"] == [b["label"] for b in buttons]
        assert found["result"]["range"] == pytest.approx(buttons[1]["args"][0]["xaxis.range"])
