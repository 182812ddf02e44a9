"""What the report, the panel and the demo say is true (issue 24, items 3 to 5).

Each test runs bellis as a user does (``bellis demo``, ``bellis report``, a script of
one's own) in a subprocess, and checks what is shown against ground truth it takes
itself: the run windows of ``runs.jsonl``, the blocks' stamps in the tracking store, and
the times a block function wrote down while it ran.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kit import browser

BELLIS = [sys.executable, "-m", "bellis"]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=600, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _payload(page: Path) -> dict[str, Any]:
    text = page.read_text(encoding="utf-8")
    m = re.search(r'<script id="bellis-data" type="application/json">(.*?)</script>', text, re.S)
    assert m is not None, "no bellis-data in the page"
    data: dict[str, Any] = json.loads(m.group(1).replace("<\\/", "</"))
    return data


def _runs(store: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (store / "runs.jsonl").read_text().splitlines()]


def _stamps(store: Path) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(sent_at, returned_at) of every done block of a store, read with zarr."""
    import zarr

    root = zarr.open_group(str(store), mode="r")
    done = np.asarray(root["done"][...]).reshape(-1) != 0
    sent = np.asarray(root["sent_at"][...], dtype=np.float64).reshape(-1)[done]
    ret = np.asarray(root["returned_at"][...], dtype=np.float64).reshape(-1)[done]
    keep = ret > 0
    return sent[keep], ret[keep]


@pytest.fixture(scope="module")
def demo_twice(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """``bellis demo`` run twice in one folder, as the README suggests."""
    tmp = tmp_path_factory.mktemp("demo")
    work = tmp / "demo"
    outs = []
    for _ in range(2):
        proc = _run([*BELLIS, "demo", "--workdir", str(work), "--size", "64"], tmp)
        outs.append(proc.stdout + proc.stderr)
    return work, outs


def _windows(work: Path) -> list[tuple[float, float, int]]:
    """(start, end, blocks run) of each pipeline run of the demo, oldest first."""
    found: dict[tuple[float, float], int] = {}
    for task in ("smooth", "label"):
        for r in _runs(work / "tracking" / task):
            key = (r["run_started_at"], r["run_finished_at"])
            found[key] = found.get(key, 0) + r["blocks"]["count"]
    return [(a, b, n) for (a, b), n in sorted(found.items())]


# ------------------------------------------------------------------ item 3: throughput


def test_throughput_is_drawn_where_the_blocks_returned(demo_twice: tuple[Path, list[str]]) -> None:
    """Each task's throughput trace is a step line over bin edges: its filled steps lie
    inside the run that did the work, each step holds exactly the blocks that returned
    in it (counted from the store's stamps), and the steps hold every block."""
    work, _ = demo_twice
    windows = _windows(work)
    assert len(windows) == 2 and windows[1][2] == 0, windows  # the rerun skipped everything
    t0 = windows[0][0]  # the page's time origin: the first run's start
    start, end = windows[0][0] - t0, windows[0][1] - t0
    fig = _payload(work / "report.html")["figures"]["throughput"]
    dotted = sorted(s["x0"] for s in fig["layout"]["shapes"] if s["line"]["dash"] == "dot")
    assert dotted[0] == pytest.approx(0.0, abs=1e-6)  # the origin the test assumed
    traces = {tr["name"]: tr for tr in fig["data"]}
    assert set(traces) == {"smooth", "label"}
    for task, tr in traces.items():
        assert tr["line"]["shape"] == "hv"
        x = np.asarray(tr["x"], dtype=np.float64)
        y = np.asarray(tr["y"], dtype=np.float64)
        _, ret = _stamps(work / "tracking" / task)
        ret = ret - t0
        steps = [(x[i], x[i + 1], y[i]) for i in range(len(x) - 1) if y[i] > 0]
        assert steps, task
        total = 0.0
        for a, b, rate in steps:
            assert start - 1e-6 <= a < b <= end + 1e-6, (task, a, b, start, end)
            n = rate * (b - a)
            inside = int(np.count_nonzero((ret >= a) & (ret < b)))
            last = b == max(s[1] for s in steps)
            if last:
                inside = int(np.count_nonzero((ret >= a) & (ret <= b)))
            assert n == pytest.approx(inside, abs=1e-3), (task, a, b, n, inside)
            total += n
        assert total == pytest.approx(len(ret), abs=1e-3), task


# ------------------------------------------------------------------ item 4: the rerun


def test_demo_rerun_keeps_its_workers_and_opens_on_the_work(
    demo_twice: tuple[Path, list[str]],
) -> None:
    """After the rerun (every block skipped, no worker started) the Workers section
    still shows the workers of the run that did the work, says which run that is, and
    the timeline opens on that run, not on all runs."""
    work, _ = demo_twice
    page = work / "report.html"
    text = page.read_text(encoding="utf-8")
    assert "no managed workers" not in text
    data = _payload(page)
    workers = data["figures"].get("workers")
    assert workers is not None, "the Workers section has no chart after the rerun"
    windows = _windows(work)
    first = {t: _runs(work / "tracking" / t)[0] for t in ("smooth", "label")}
    labels = [y for tr in workers["data"] if tr.get("orientation") == "h" for y in tr["y"]]
    expected = {
        f"{t} · worker {w['worker_id']}" for t, r in first.items() for w in r["workers"]["records"]
    }
    assert {lab.split(" (")[0] for lab in labels} == expected
    assert "run 1" in workers["layout"]["title"]["text"]
    section = text[text.index('<section id="workers">') :]
    section = section[: section.index("</section>")]
    assert "every block was skipped" in section, section

    tl = data["figures"]["timeline"]["layout"]
    t0 = windows[0][0]
    lo, hi = tl["xaxis"]["range"]
    a, b = windows[0][0] - t0, windows[0][1] - t0
    assert lo <= a and hi >= b, (lo, hi, a, b)
    assert hi - lo < 1.1 * (b - a) + 1e-3  # the run, not all runs
    menu = tl["updatemenus"][0]
    assert menu["active"] == 1 and menu["buttons"][1]["label"].startswith("run 1:")


RERUN = r"""
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


def test_timeline_rows_keep_the_workers_of_each_run_apart(tmp_path: Path) -> None:
    """Two runs that both did work (the second redoes the first's failed row): worker
    ids restart every run, so a row per worker id would mix two processes. Every row's
    bars lie in one run's window, and a row of run 2 is labelled as such."""
    script = tmp_path / "rerun.py"
    script.write_text(RERUN)
    for mode in ("fail", "pass"):
        _run([sys.executable, str(script), str(tmp_path), mode], tmp_path)
    store = tmp_path / "tracking" / "grow"
    page = tmp_path / "report.html"
    _run([*BELLIS, "report", str(store), "-o", str(page)], tmp_path)
    runs = _runs(store)
    assert [r["blocks"]["count"] for r in runs] == [12, 4]
    t0 = runs[0]["run_started_at"]
    windows = [(r["run_started_at"] - t0, r["run_finished_at"] - t0) for r in runs]
    fig = _payload(page)["figures"]["timeline"]
    labels = fig["layout"]["yaxis"]["ticktext"]
    rows: dict[int, list[float]] = {}
    for tr in fig["data"]:
        if tr.get("mode") != "lines":
            continue
        for x, y in zip(tr["x"], tr["y"], strict=True):
            if x is not None:
                rows.setdefault(int(y), []).append(float(x))
    assert rows
    seen_runs = set()
    for row, xs in rows.items():
        inside = [
            i for i, (a, b) in enumerate(windows) if all(a - 1e-6 <= x <= b + 1e-6 for x in xs)
        ]
        assert len(inside) == 1, (labels[row], xs, windows)
        seen_runs.add(inside[0])
        assert f"run {inside[0] + 1}" in labels[row], labels[row]
    assert seen_runs == {0, 1}


@pytest.mark.skipif(browser.chromium() is None, reason="no chromium on PATH")
def test_demo_rerun_page_in_chromium(demo_twice: tuple[Path, list[str]]) -> None:
    """In the browser: the timeline opens on the run that did the work, every numeric
    axis tick of the time charts is a round number, and no two run labels overlap."""
    work, _ = demo_twice
    probe = """
    var out = {};
    ['timeline', 'throughput'].forEach(function (sec) {
      var gd = document.querySelector('.plot[data-section="' + sec + '"]');
      var ticks = Array.prototype.map.call(gd.querySelectorAll('.xtick text'),
                                           function (t) { return t.textContent; });
      var boxes = Array.prototype.map.call(gd.querySelectorAll('.annotation'),
        function (a) { var r = a.getBoundingClientRect();
                       return [r.left, r.top, r.right, r.bottom, a.textContent]; });
      out[sec] = {ticks: ticks, boxes: boxes, range: gd.layout.xaxis.range};
    });
    return out;
    """
    found = browser.load(work / "report.html", probe)
    assert found["errors"] == [] and found["rendered"] == "yes"
    windows = _windows(work)
    t0 = windows[0][0]
    for sec, got in found["result"].items():
        lo, hi = got["range"]
        assert lo <= windows[0][0] - t0 and hi >= windows[0][1] - t0, (sec, got["range"])
        assert hi - lo < 1.1 * (windows[0][1] - windows[0][0]) + 1e-3, (sec, got["range"])
        assert len(got["ticks"]) >= 3, got
        values = [float(t.replace("\u2212", "-")) for t in got["ticks"]]
        steps = {round(b - a, 9) for a, b in itertools.pairwise(values)}
        assert len(steps) == 1, (sec, got["ticks"])
        (step,) = steps
        mantissa = step / 10 ** np.floor(np.log10(step))
        assert round(mantissa, 6) in (1.0, 2.0, 2.5, 5.0), (sec, got["ticks"])
        boxes = got["boxes"]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
                assert apart, (sec, a, b)


# ------------------------------------------------------------- item 5: per-task figures

TIMED = r"""
import json, os, subprocess, sys, time
from pathlib import Path

import bellis

BASE = Path(sys.argv[1])
TIMES = BASE / "times"
TIMES.mkdir(exist_ok=True)


def timed(task, child):
    def fn(block):
        t0 = time.time()
        if child:
            subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
        time.sleep(0.25)
        t1 = time.time()
        (TIMES / f"{task}-{block.block_id[1]}.json").write_text(json.dumps([t0, t1]))
    return fn


bellis.set_tracking_basedir(BASE / "tracking")
total, blk = bellis.Roi((0,), (40,)), bellis.Roi((0,), (10,))
first = bellis.Task("first", total, blk, blk, timed("first", True), max_workers=1,
                    resource_tracking=True, read_write_conflict=False)
# each block of "second" reads all that "first" writes: it waits for all of "first"
second = bellis.Task("second", bellis.Roi((-40,), (120,)), bellis.Roi((0,), (90,)),
                     bellis.Roi((40,), (10,)), timed("second", False), max_workers=1,
                     resource_tracking=True, read_write_conflict=False, upstream_tasks=[first])
print("OK" if bellis.run_blockwise([first, second], progress=True) else "FAILED")
"""


def _panel_section(out: str, task: str) -> list[str]:
    lines = out[out.index("Resource Utilization") :].splitlines()
    start = next(i for i, x in enumerate(lines) if re.match(rf"  {task}  \d+ blocks", x))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"  \S", lines[i])), None)
    return lines[start:end]


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]


def test_per_task_wall_and_rate_are_the_tasks_own(tmp_path: Path) -> None:
    """Two tasks one after the other, each four 0.25 s blocks on one worker. Every block
    writes down when it started and ended. Each task's wall (panel title, run line) and
    its blocks/s (last progress line) are its own, from its first block to its last,
    not the pipeline's; ``cpu children`` shows only for the task whose blocks start a
    child process; the trend keeps SPEC §5.9's format (signed, four decimals)."""
    script = tmp_path / "timed.py"
    script.write_text(TIMED)
    proc = _run([sys.executable, str(script), str(tmp_path)], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "OK" or "OK" in proc.stdout, out
    spans = {}
    for task in ("first", "second"):
        times = [json.loads(p.read_text()) for p in (tmp_path / "times").glob(f"{task}-*.json")]
        assert len(times) == 4
        spans[task] = (min(t[0] for t in times), max(t[1] for t in times))
    assert spans["second"][0] >= spans["first"][1] - 1e-3  # second waited for first
    slack = 0.4  # send and return around the block function, under load
    for task, (a, b) in spans.items():
        truth = b - a
        (line,) = _runs(tmp_path / "tracking" / task)
        assert line["first_sent_at"] <= a and line["last_returned_at"] >= b, (line, a, b)
        own = line["last_returned_at"] - line["first_sent_at"]
        assert truth <= own <= truth + slack, (task, own, truth)
        title = _panel_section(proc.stdout, task)[0]
        m = re.fullmatch(rf"  {task}  4 blocks, 1 workers, (.+) wall", title)
        assert m is not None, title
        assert truth - 0.05 <= _seconds(m.group(1)) <= truth + slack, (title, truth)
        (fin,) = [x for x in proc.stderr.splitlines() if x.startswith(f"[bellis] {task}: finished")]
        rate = float(re.search(r"([\d.]+) blocks/s on average", fin).group(1))  # type: ignore[union-attr]
        assert 4 / (truth + slack) - 0.05 <= rate <= 4 / truth + 0.05, (fin, truth)
    first, second = _panel_section(proc.stdout, "first"), _panel_section(proc.stdout, "second")
    assert any(x.split()[:2] == ["cpu", "children"] for x in first), first
    assert not any("cpu children" in x for x in second), second
    for section in (first, second):
        (trend,) = [x for x in section if x.split()[:1] == ["trend"]]
        assert re.fullmatch(r"\s+trend\s+∠ [+-]\d+\.\d{4} ms/block", trend), trend


def test_demo_rerun_points_to_fresh(demo_twice: tuple[Path, list[str]]) -> None:
    """The rerun's resume notice tells a demo user how to start over: ``--fresh``."""
    _, outs = demo_twice
    assert "--fresh" not in outs[0]
    assert "bellis demo --fresh" in outs[1], outs[1]
    assert "Task.reset()" not in outs[1], outs[1]
