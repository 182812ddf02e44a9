"""``run_blockwise(dashboard=True)``: the page shows the driver's own counters (issue 39).

What the tracking store cannot say (blocks running now, skipped as already done,
orphaned) the driver's page takes from the run's counters. A user's script runs twice
from a file in a subprocess: first (distributed) with the blocks of the grid's first row
failing, then again, resumed, with every block held on a gate file, in distributed and in
serial mode; while the gate is shut the page's running count is the number of busy
workers and its skipped count the blocks done before (as ``bellis status`` counts them),
and ``bellis serve`` on the same store still says ``n/a`` for them.
"""

from __future__ import annotations

import itertools
import json
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from test_live_serve import serve

_URL = re.compile(r"live page at (http://\S+)")

SCRIPT = """
import sys, time
from pathlib import Path
import bellis

MODE, GATE, PHASE = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

def process(block):
    if PHASE == "first":
        if block.write_roi.offset[0] == 0:
            raise RuntimeError("first row fails")
        return
    while not GATE.exists():
        time.sleep(0.05)

task = bellis.Task(
    "dash",
    total_roi=bellis.Roi((0, 0), (40, 50)),
    read_roi=bellis.Roi((0, 0), (10, 10)),
    write_roi=bellis.Roi((0, 0), (10, 10)),
    process_function=process,
    num_workers=2,
    max_retries=0,
    read_write_conflict=False,
    resource_tracking=True,
    tracking_path="dash",
)
ok = bellis.run_blockwise(
    [task], multiprocessing=MODE == "distributed", dashboard=PHASE != "first", progress=False
)
print("RESULT", ok, flush=True)
"""


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _task_of(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    code, body = _get(f"{parts.scheme}://{parts.netloc}/api/state.json?{parts.query}")
    assert code == 200, body
    found: dict[str, Any] = json.loads(body)["tasks"][0]
    return found


def _status(store: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(store), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


def _store_done(store: Path) -> int:
    found = _status(store)
    text = json.dumps(found)
    m = re.search(r'"done(?:_count)?": (\d+)', text)
    assert m is not None, text
    return int(m.group(1))


@pytest.mark.parametrize(("mode", "busy"), [("distributed", 2), ("serial", 1)])
def test_the_driver_page_shows_running_and_skipped_blocks(
    tmp_path: Path, mode: str, busy: int
) -> None:
    gate = tmp_path / "gate"
    script = tmp_path / "dash.py"
    script.write_text(SCRIPT)
    first = subprocess.run(
        [sys.executable, str(script), "distributed", str(gate), "first"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert "RESULT False" in first.stdout, first.stdout + first.stderr
    done_before = _store_done(tmp_path / "dash")
    assert done_before == 15, _status(tmp_path / "dash")  # 4 x 5 blocks, the first row failed

    run = subprocess.Popen(
        [sys.executable, str(script), mode, str(gate), "second"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert run.stderr is not None
        for line in run.stderr:
            lines.put(line)
        lines.put("")

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    try:
        seen: list[str] = []
        while not (m := _URL.search(seen[-1] if seen else "")):
            seen.append(lines.get(timeout=180))
            assert seen[-1], "".join(seen)
        url = m.group(1)
        # the workers start at their own pace: wait (a generous deadline, not a timing) until
        # every one holds its block; the gate is shut, so none can finish one
        deadline = time.monotonic() + 240
        while True:
            task = _task_of(url)  # (the first answers may come before the run has begun)
            if task["from_driver"]:
                assert task["running_blocks"] <= busy, task
            if task["from_driver"] and task["running_blocks"] == busy:
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert task["from_driver"] is True and task["running_blocks"] == busy, task
        assert task["skipped"] == done_before, task
        assert task["orphaned"] == 0, task
        assert task["done"] == done_before and task["blocks"] == 20, task
        # the lanes of the driver's page: the blocks the first run ran (its 15 done and 5
        # failed blocks; none of this run's has returned yet)
        recent = task["recent"]
        assert recent is not None and recent["blocks"] == 20, recent
        assert sum(len(lane["blocks"]) for lane in recent["lanes"]) == 20
        gate.write_text("go")
        out = run.communicate(timeout=300)[0]
        assert "RESULT True" in out, out
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        pumping.join(timeout=60)
        for pipe in (run.stdout, run.stderr):
            if pipe is not None:
                pipe.close()

    # bellis serve reads only the store: it does not know these
    with serve(tmp_path / "dash") as url:
        task = _task_of(url)
    assert task["from_driver"] is False
    assert (task["skipped"], task["running_blocks"], task["orphaned"]) == (None, None, None)
    assert task["done"] == 20


LANES = """
import os, sys, time
from pathlib import Path
import bellis

MODE, SEEN = sys.argv[1], Path(sys.argv[2])
WORKERS = 2 if MODE == "distributed" else 1

def process(block):
    with open(SEEN / str(os.getpid()), "a") as f:  # which process ran it
        f.write(f"{block.block_id[1]}\\n")
    # every worker runs a block before any goes on (so each has a lane); a cap, in case
    deadline = time.monotonic() + 120
    while len(list(SEEN.iterdir())) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # slower than a batch's target: each worker gets one block at a time

task = bellis.Task(
    "lanes",
    total_roi=bellis.Roi((0,), (120,)),
    read_roi=bellis.Roi((0,), (10,)),
    write_roi=bellis.Roi((0,), (10,)),
    process_function=process,
    num_workers=WORKERS,
    read_write_conflict=False,
    resource_tracking=True,
    tracking_path="lanes",
)
ok = bellis.run_blockwise([task], multiprocessing=MODE == "distributed", progress=False)
print("RESULT", ok, flush=True)
"""


@pytest.mark.parametrize(("mode", "workers"), [("distributed", 2), ("serial", 1)])
def test_the_lanes_and_wall_times_show_each_workers_blocks(
    tmp_path: Path, mode: str, workers: int
) -> None:
    from test_live_serve import _probe_dom, needs_chromium

    seen = tmp_path / "seen"
    seen.mkdir()
    script = tmp_path / "lanes.py"
    script.write_text(LANES)
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(seen)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert "RESULT True" in proc.stdout, proc.stdout + proc.stderr
    # what the block function saw: the blocks each process ran
    ran = {p.name: p.read_text().split() for p in seen.iterdir()}
    assert len(ran) == workers and sum(map(len, ran.values())) == 12
    with serve(tmp_path / "lanes") as url:
        task = _task_of(url)
        dom = None if needs_chromium.args[0] else _probe_dom(url)
    recent = task["recent"]
    assert recent is not None, task
    assert recent["workers"] == workers and len(recent["lanes"]) == workers
    assert recent["blocks"] == 12
    if mode == "serial":
        assert [lane["worker"] for lane in recent["lanes"]] == ["driver"]
    # each lane is one process's blocks: the lanes' sizes are the processes' counts, and
    # a worker runs one block at a time (its blocks never overlap)
    assert sorted(len(lane["blocks"]) for lane in recent["lanes"]) == sorted(map(len, ran.values()))
    for lane in recent["lanes"]:
        spans = [(b[0], b[1]) for b in lane["blocks"]]
        assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(spans)), spans
        assert all(b[3] is not None and b[3] > 0 for b in lane["blocks"])  # peak RSS, MB
    assert sum(recent["histogram"]["counts"]) == 12
    assert recent["trend"] is not None and recent["trend"]["blocks"] == 12
    if dom is not None:  # the page draws them, with the same counts
        m = re.search(r'<canvas id="lanes"([^>]*)>', dom)
        assert m and f'data-workers="{workers}"' in m.group(1), dom[-3000:]
        m = re.search(r'<canvas id="walls"([^>]*)>', dom)
        assert m and 'data-blocks="12"' in m.group(1), dom[-3000:]
        assert re.search(r'<div id="trend" data-rising="(yes|no)"[^>]*>12 blocks in the', dom)
