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
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kit import browser
from kit.live import driver_page, needs_chromium, serve, state_of, status_json, task_of

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


def _store_done(store: Path) -> int:
    found = status_json(store)
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
    assert done_before == 15, status_json(tmp_path / "dash")  # 4 x 5 blocks, the first row failed

    with driver_page(script, mode, str(gate), "second", cwd=tmp_path) as (run, url):
        # the workers start at their own pace: wait (a generous deadline, not a timing) until
        # every one holds its block; the gate is shut, so none can finish one
        deadline = time.monotonic() + 240
        while True:
            task = task_of(url)  # (the first answers may come before the run has begun)
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

    # bellis serve reads only the store: it does not know these
    with serve(tmp_path / "dash") as url:
        task = task_of(url)
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
        task = task_of(url)
        dom = None if needs_chromium.args[0] else browser.dump_dom(url)
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


UNTRACKED = """
import os, sys, time
from pathlib import Path
import bellis

MODE, SEEN, GATE = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
WORKERS = 2 if MODE == "distributed" else 1
BLOCKS, FAILS = 12, 3

def ticket():  # the order in which blocks started, across processes
    n = 0
    while True:
        try:
            os.mkdir(SEEN / f"ticket-{n}")
            return n
        except FileExistsError:
            n += 1

def process(block):
    n = ticket()
    if n == BLOCKS - 1:  # the last block holds the run, and so its page, open
        (SEEN / "held").write_text(str(block.block_id[1]))
        while not GATE.exists():
            time.sleep(0.05)
        return
    with open(SEEN / f"pid-{os.getpid()}", "a") as f:  # which process ran it
        f.write(f"{block.block_id[1]} {int(n == FAILS)}\\n")
    # every worker runs a block before any goes on (so each has a lane); a cap, in case
    deadline = time.monotonic() + 120
    while len(list(SEEN.glob("pid-*"))) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # slower than a batch's target: each worker gets one block at a time
    if n == FAILS:  # failed (a serial run would stop at an exception)
        block.status = bellis.BlockStatus.FAILED

task = bellis.Task(
    "plain",
    total_roi=bellis.Roi((0,), (120,)),
    read_roi=bellis.Roi((0,), (10,)),
    write_roi=bellis.Roi((0,), (10,)),
    process_function=process,
    num_workers=WORKERS,
    max_retries=0,
    read_write_conflict=False,
    tracking_path="plain",
)
ok = bellis.run_blockwise(
    [task], multiprocessing=MODE == "distributed", dashboard=True, progress=False
)
print("RESULT", ok, flush=True)
"""


def _wait_for(url: str, name: str, ready: Any, what: str) -> dict[str, Any]:
    """The task ``name`` of the page at ``url`` once ``ready(task)`` holds (the run goes
    at its own pace: a generous deadline, not a timing)."""
    deadline = time.monotonic() + 240
    while True:
        task = next(t for t in state_of(url)["tasks"] if t["name"] == name)
        if ready(task):
            return task
        assert time.monotonic() < deadline, (what, task)
        time.sleep(0.2)


@pytest.mark.parametrize(("mode", "workers"), [("distributed", 2), ("serial", 1)])
def test_the_driver_draws_lanes_without_resource_tracking(
    tmp_path: Path, mode: str, workers: int
) -> None:
    seen, gate = tmp_path / "seen", tmp_path / "gate"
    seen.mkdir()
    script = tmp_path / "plain.py"
    script.write_text(UNTRACKED)
    with driver_page(script, mode, str(seen), str(gate), cwd=tmp_path) as (run, url):
        # every block but the held one has come back
        task = _wait_for(
            url,
            "plain",
            lambda t: t["from_driver"] and (t["recent"] or {}).get("blocks") == 11,
            "11 blocks back",
        )
        dom = None if needs_chromium.args[0] else browser.dump_dom(url)
        gate.write_text("go")
        out = run.communicate(timeout=300)[0]
    assert "RESULT False" in out, out  # one block failed
    assert task["resources"] is False  # the store has no stamps: the lanes are the driver's
    recent = task["recent"]
    assert recent["source"] == "driver" and recent["workers"] == workers
    assert len(recent["lanes"]) == workers
    if mode == "serial":
        assert [lane["worker"] for lane in recent["lanes"]] == ["driver"]
    # what each process ran (the block function's own record): each lane is one of them,
    # the same cells, the failed one marked failed
    ran = sorted(
        sorted(
            (int(c), f == "1")
            for c, f in (line.split() for line in p.read_text().split("\n") if line)
        )
        for p in seen.glob("pid-*")
    )
    drawn = sorted(sorted((b[2], bool(b[5])) for b in lane["blocks"]) for lane in recent["lanes"])
    assert drawn == ran
    assert sum(f for lane in ran for _, f in lane) == 1
    for lane in recent["lanes"]:
        spans = [(b[0], b[1]) for b in lane["blocks"]]
        assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(spans)), spans
        assert all(b[3] is None and b[4] is None for b in lane["blocks"])  # no RSS, no CPU
    assert sum(recent["histogram"]["counts"]) == 11
    if dom is not None:  # the page draws the same lanes
        m = re.search(r'<canvas id="lanes"([^>]*)>', dom)
        assert m, dom[-3000:]
        assert f'data-workers="{workers}"' in m.group(1) and 'data-source="driver"' in m.group(1)
        assert 'data-blocks="11"' in m.group(1)


BACKUPS = """
import os, sys, time
from pathlib import Path
import bellis

HERE, GATE = Path(sys.argv[1]), Path(sys.argv[2])
SLOW = 7

def process(block):
    if block.block_id[1] == SLOW:
        try:
            fd = os.open(HERE / "first_attempt", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # the backup copy: fast
            (HERE / "second_attempt").write_text(str(os.getpid()))
        else:  # the original: a straggler (its worker is stopped when the copy wins)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            time.sleep(120)
    time.sleep(0.02)

def hold(block):  # keeps the run, and so its page, open until the test has looked
    while not GATE.exists():
        time.sleep(0.05)

tasks = [
    bellis.Task(
        "t",
        total_roi=bellis.Roi((0,), (40,)),
        read_roi=bellis.Roi((0,), (1,)),
        write_roi=bellis.Roi((0,), (1,)),
        process_function=process,
        read_write_conflict=False,
        max_workers=2,
        speculative=True,
        tracking_path="t",
    ),
    bellis.Task(
        "hold",
        total_roi=bellis.Roi((0,), (1,)),
        read_roi=bellis.Roi((0,), (1,)),
        write_roi=bellis.Roi((0,), (1,)),
        process_function=hold,
        read_write_conflict=False,
        num_workers=1,
        tracking_path="hold",
    ),
]
print("RESULT", bellis.run_blockwise(tasks, dashboard=True, progress=False), flush=True)
"""


def test_a_straggler_and_its_backup_copy_are_marked_on_the_lanes(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = tmp_path / "backups.py"
    script.write_text(BACKUPS)
    with driver_page(script, str(tmp_path), str(gate), cwd=tmp_path) as (run, url):
        task = _wait_for(
            url, "t", lambda t: t["done"] == 40 and (t["recent"] or {}).get("marks"), "the race"
        )
        dom = None if needs_chromium.args[0] else browser.dump_dom(f"{url}#task=t")
        gate.write_text("go")
        out = run.communicate(timeout=300)[0]
    assert "RESULT True" in out, out
    assert (tmp_path / "second_attempt").exists()  # the copy ran, and won
    recent = task["recent"]
    marks = {m["kind"]: m for m in recent["marks"]}
    assert sorted(m["kind"] for m in recent["marks"]) == ["backup", "straggler"]
    straggler, backup = marks["straggler"], marks["backup"]
    assert straggler["cell"] == backup["cell"] == 7
    assert (straggler["won"], backup["won"]) == (False, True)
    assert straggler["worker"] != backup["worker"]
    assert straggler["start"] < backup["start"] <= backup["end"] == straggler["end"]
    # the copy's block is a bar of its worker's lane; the straggler's lane has none of it
    cells = {lane["worker"]: [b[2] for b in lane["blocks"]] for lane in recent["lanes"]}
    assert 7 in cells[backup["worker"]]
    assert 7 not in cells.get(straggler["worker"], [])
    assert sum(map(len, cells.values())) == 40  # every block once, no failed attempt
    if dom is not None:
        m = re.search(r'<canvas id="lanes"([^>]*)>', dom)
        assert m, dom[-3000:]
        assert 'data-marks="2"' in m.group(1) and 'data-backup-cells="7"' in m.group(1)
