"""The report's Failures section and block details (issue 25, item 3), as a user meets them.

A user's pipeline script (``kit.failing_pipeline``) runs in a subprocess with resource
tracking: blocks it chose raise a ``ValueError`` or a ``KeyError`` on every attempt, one
times out, one raises a ``RuntimeError`` once and is then done. ``bellis report`` builds
the page; the tests check the Failures section against the script's own choice of
failing blocks, then click, in headless Chromium, a red cell of the failure map and an
orange (done after a retry) and a red (failed) bar of the timeline, and read the traceback
shown. A page of a store without
failures, and a daisy 2.0.0 store, say so; text from a run that looks like markup stays
text.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kit import browser
from kit.failing_pipeline import (
    ATTEMPTS,
    FLAKY_BLOCK,
    KEY_BLOCKS,
    TIMEOUT_BLOCK,
    VALUE_BLOCKS,
    FailingRun,
    run_failing,
)
from kit.user_script import run_script

COMPAT = Path(__file__).parent.parent / "compat"
needs_chromium = pytest.mark.skipif(
    browser.chromium() is None, reason="no chromium on PATH (.ci/run installs Debian's)"
)


def _report(store: Path, out: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "report", str(store), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[FailingRun, Path]:
    tmp = tmp_path_factory.mktemp("failpage")
    run = run_failing(tmp, "distributed", tracked=True, flaky=True)
    assert "RESULT False" in run.output, run.output
    page = tmp / "report.html"
    _report(run.store, page)
    return run, page


def _coords(text: str) -> set[tuple[int, ...]]:
    return {tuple(int(x) for x in c.split(",")) for c in re.findall(r'data-block="([\d,]+)"', text)}


def test_failures_section_lists_each_error_with_its_blocks(
    failed_run: tuple[FailingRun, Path],
) -> None:
    run, page = failed_run
    text = page.read_text(encoding="utf-8")
    section = text[text.index('<section id="failures">') :]
    section = section[: section.index("</section>")]
    row_re = r'<tr class="error-row" data-task="seg" data-count="(\d+)">(.*?)</tr>'
    rows = re.findall(row_re, section, re.S)
    found = {}
    for count, row in rows:
        title = re.search(r"<b>(.*?)</b>", row)
        assert title is not None
        found[title.group(1)] = (int(count), _coords(row))
    # the ground truth: the script's own choice of failing blocks
    assert found == {
        "ValueError: bad voxel size": (ATTEMPTS * len(VALUE_BLOCKS), set(VALUE_BLOCKS)),
        "KeyError: &#x27;missing channel&#x27;": (ATTEMPTS * len(KEY_BLOCKS), set(KEY_BLOCKS)),
        "RuntimeError: flaky once": (1, {FLAKY_BLOCK}),
        "timeout: exceeded the block timeout (1s)": (ATTEMPTS, {TIMEOUT_BLOCK}),
    }, found
    assert "4 distinct errors, 13 failed attempts over 1 run" in section
    # each error's first traceback names the user's file and line, escaped
    line = run.line_of("LINE_VALUE")
    assert f"File &quot;{run.script}&quot;, line {line}, in process" in section
    # the details of every failed block are embedded, with their log lines
    m = re.search(r'<script id="bellis-failures" type="application/json">(.*?)</script>', text)
    assert m is not None
    data: dict[str, Any] = json.loads(m.group(1))
    blocks = data["stores"]["0"]["blocks"]
    want = {*VALUE_BLOCKS, *KEY_BLOCKS, FLAKY_BLOCK, TIMEOUT_BLOCK}
    assert set(blocks) == {",".join(map(str, c)) for c in want}
    assert data["omitted"] == 0 and data["embedded"] == 13
    (y, x) = VALUE_BLOCKS[0]
    attempts = blocks[f"{y},{x}"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    for a in attempts:
        assert a["log"].endswith(".err") and isinstance(a["log_line"], int)
        assert any("ValueError: bad voxel size" in s for s in a["log_lines"])
        assert any(f"at {y},{x}" in s for s in a["out_lines"])  # the block's own print
    # no raw "<" from a run in the JSON: it cannot end the script element
    assert "<" not in m.group(1)


_CLICK = r"""
async function clickAt(gd, x, y) {  // a real click (mouse events) at data coordinates
  gd.scrollIntoView();
  await new Promise(function (r) { setTimeout(r, 100); });
  var xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  var px = box.left + xa._offset + xa.d2p(x), py = box.top + ya._offset + ya.d2p(y);
  var target = document.elementFromPoint(px, py);
  ['mousemove', 'mousedown', 'mouseup', 'click'].forEach(function (type) {
    target.dispatchEvent(new MouseEvent(type, {bubbles: true, cancelable: true, view: window,
                                               clientX: px, clientY: py, button: 0}));
  });
  await new Promise(function (r) { setTimeout(r, 400); });
}
function barOf(gd, key) {  // the middle of the timeline bar of block `key`
  var hit = null;
  gd.data.forEach(function (tr) {
    (tr.customdata || []).forEach(function (cd, i) {
      if (cd[1] === key) { hit = {x: tr.x[i], y: tr.y[i], trace: tr.name}; }
    });
  });
  return hit;
}
"""


@needs_chromium
def test_a_click_shows_the_block_traceback(failed_run: tuple[FailingRun, Path]) -> None:
    run, page = failed_run
    (vy, vx), (ky, kx), (fy, fx) = VALUE_BLOCKS[0], KEY_BLOCKS[0], FLAKY_BLOCK
    probe = (
        _CLICK
        + f"""
    var out = {{}};
    var vol = document.getElementById('plot-volume-0');
    await window.bellisReport.volumes['volume-0'].show('failures', 0, 0);
    out.cell = vol.data[0].z[{vy}][{vx}];
    await clickAt(vol, {vx}, {vy});
    out.volume = document.getElementById('volume-0-detail').innerText;
    var tl = document.getElementById('plot-timeline');
    var retried = barOf(tl, '{fy},{fx}');
    out.retriedTrace = retried.trace;
    await clickAt(tl, retried.x, retried.y);
    out.retried = document.getElementById('timeline-detail').innerText;
    var failedBar = barOf(tl, '{ky},{kx}');
    out.failedTrace = failedBar.trace;
    await clickAt(tl, failedBar.x, failedBar.y);
    out.failed = document.getElementById('timeline-detail').innerText;
    document.querySelector('a.blk[data-block="{TIMEOUT_BLOCK[0]},{TIMEOUT_BLOCK[1]}"]').click();
    out.link = document.getElementById('failures-detail').innerText;
    return out;
    """
    )
    found = browser.load(page, probe)
    assert found["errors"] == [], found["errors"]
    assert found["rendered"] == "yes"
    assert found["requests"] == [], found["requests"]  # nothing fetched: offline
    result = found["result"]
    assert result["cell"] == ATTEMPTS  # a red cell of the failure map
    shown = result["volume"]
    assert f"seg: block ({vy}, {vx})" in shown and "3 recorded failed attempts" in shown
    assert f'File "{run.script}", line {run.line_of("LINE_VALUE")}, in process' in shown
    assert "ValueError: bad voxel size" in shown
    assert re.search(r"log \S+worker_\d+\.err, line \d+:", shown), shown
    # an orange bar: a block done after a failed attempt
    assert result["retriedTrace"] == "seg: done after failed attempts"
    retried = result["retried"]
    assert f"seg: block ({fy}, {fx})" in retried and "1 recorded failed attempt" in retried
    assert f'File "{run.script}", line {run.line_of("LINE_FLAKY")}, in process' in retried
    assert "RuntimeError: flaky once" in retried
    # a red bar: the last failed attempt of a block that is not done
    assert result["failedTrace"] == "seg: failed attempt"
    failed = result["failed"]
    assert f'File "{run.script}", line {run.line_of("LINE_KEY")}, in process' in failed
    assert "KeyError: 'missing channel'" in failed
    # a block link of the Failures section: the timed-out block, with its watchdog's line
    assert "[timeout]" in result["link"] and "still running after timeout" in result["link"]


@needs_chromium
def test_run_text_that_looks_like_markup_stays_text(
    failed_run: tuple[FailingRun, Path], tmp_path: Path
) -> None:
    run, _ = failed_run
    store = tmp_path / "store"
    shutil.copytree(run.store, store)
    evil = "</script><script>window.__pwned=1</script><!--<script>&amp; <b>bold</b>"
    record = {
        "v": 1,
        "run": 1.0,
        "task": "seg",
        "block": 0,
        "coord": [0, 0],
        "grid": [0, 0],
        "attempt": 1,
        "time": 2.0,
        "kind": "raised",
        "type": "ValueError",
        "message": evil,
        "where": "x.py:1 in <module>",
        "traceback": f"Traceback (most recent call last):\n  {evil}\nValueError: {evil}\n",
    }
    with open(store / "errors.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    page = tmp_path / "evil.html"
    text = _report(store, page)
    assert evil not in text and "window.__pwned=1</script>" not in text
    probe = """
    window.bellisReport.showBlock(0, '0,0', 'failures-detail', 1);
    return {pwned: window.__pwned === 1,
            shown: document.getElementById('failures-detail').innerText,
            bold: document.querySelectorAll('#failures-detail b').length,
            rows: document.querySelectorAll('tr.error-row').length};
    """
    found = browser.load(page, probe)
    assert found["errors"] == [], found["errors"]
    result = found["result"]
    assert result["pwned"] is False
    assert evil in result["shown"]  # shown as the text it is
    assert result["rows"] == 5


def test_store_without_failures_says_so(tmp_path: Path) -> None:
    script = """
import sys
import bellis
roi, blk = bellis.Roi((0, 0), (20, 20)), bellis.Roi((0, 0), (10, 10))
task = bellis.Task("fine", roi, blk, blk, lambda b: None, max_workers=2,
                   resource_tracking=True, tracking_path=sys.argv[1])
print("RESULT", bellis.run_blockwise([task], progress=False, summary=False))
"""
    proc = run_script(tmp_path, script, str(tmp_path / "store"), timeout=300)
    assert "RESULT True" in proc.stdout, proc.stdout + proc.stderr
    page = tmp_path / "fine.html"
    text = _report(tmp_path / "store", page)
    assert "fine: no failed attempt was recorded" in text
    assert 'class="error-row"' not in text
    if browser.chromium() is not None:
        probe = (
            _CLICK
            + """
        var vol = document.getElementById('plot-volume-0');
        await clickAt(vol, 1, 0);
        return document.getElementById('volume-0-detail').innerText;
        """
        )
        found = browser.load(page, probe)
        assert found["errors"] == [] and found["rendered"] == "yes"
        assert found["requests"] == []
        assert "fine: block (0, 1)" in found["result"]
        assert "No failed attempt of this block was recorded." in found["result"]


def test_daisy_store_has_no_error_records(tmp_path: Path) -> None:
    store = tmp_path / "daisy_store"
    shutil.copytree(COMPAT / "daisy_store_fixture", store)
    text = _report(store, tmp_path / "daisy.html")
    section = text[text.index('<section id="failures">') :]
    section = section[: section.index("</section>")]
    assert 'class="error-row"' not in section
    assert "no failed attempt was recorded (no errors.jsonl)" in section or (
        "failed attempt(s) counted, but none recorded" in section
    ), section
