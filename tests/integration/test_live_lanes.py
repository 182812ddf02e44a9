"""The live page's worker lanes from the store, and races still going (issue 39).

A run without ``resource_tracking`` writes its window of recent blocks into its store
(``live_lanes.json``), so ``bellis serve`` in another process draws the same lanes, while
the run goes and after it: each lane is what one worker process ran, by the block
function's own record (its pid and block id, written to files). A straggler and its
backup copy, both held on a gate file, are drawn as running on their two lanes while the
race goes on, on the run's own page and on ``bellis serve``'s.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kit import browser
from kit.live import driver_page, needs_chromium, serve, state_of

PLAIN = """
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
    # which process ran it (the last block, which holds the run open, in its own file)
    name = "held" if n == BLOCKS - 1 else "ran"
    with open(SEEN / f"{name}-{os.getpid()}", "a") as f:
        f.write(f"{block.block_id[1]} {int(n == FAILS)}\\n")
    if n == BLOCKS - 1:
        while not GATE.exists():
            time.sleep(0.05)
        return
    # every worker runs a block before any goes on (so each has a lane); a cap, in case
    deadline = time.monotonic() + 120
    while len(list(SEEN.glob("ran-*"))) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # slower than a batch's target: each worker gets one block at a time
    if n == FAILS:
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
ok = bellis.run_blockwise([task], multiprocessing=MODE == "distributed", progress=False)
print("RESULT", ok, flush=True)
"""


def _until(what: str, probe: Callable[[], Any], deadline: float) -> Any:
    """``probe()``'s first true answer (the run goes at its own pace: a generous deadline,
    not a timing)."""
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _ran(seen: Path, *prefixes: str) -> list[list[tuple[int, bool]]]:
    """Per process (by the files its blocks wrote): its blocks' cells and failed flags."""
    per_pid: dict[str, list[tuple[int, bool]]] = {}
    for prefix in prefixes:
        for p in seen.glob(f"{prefix}-*"):
            pid = p.name.split("-", 1)[1]
            for line in p.read_text().split("\n"):
                if line:
                    cell, failed = line.split()
                    per_pid.setdefault(pid, []).append((int(cell), failed == "1"))
    return sorted(sorted(blocks) for blocks in per_pid.values())


def _drawn(recent: dict[str, Any]) -> list[list[tuple[int, bool]]]:
    return sorted(sorted((b[2], bool(b[5])) for b in lane["blocks"]) for lane in recent["lanes"])


@pytest.mark.parametrize(("mode", "workers"), [("distributed", 2), ("serial", 1)])
def test_serve_draws_the_lanes_of_a_run_without_resource_tracking(
    tmp_path: Path, mode: str, workers: int
) -> None:
    seen, gate, store = tmp_path / "seen", tmp_path / "gate", tmp_path / "plain"
    seen.mkdir()
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    run = subprocess.Popen(
        [sys.executable, str(script), mode, str(seen), str(gate)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 240
        _until("the held block starts", lambda: list(seen.glob("held-*")), deadline)
        with serve(store) as url:

            def lanes_of(n: int) -> dict[str, Any] | None:
                task = state_of(url)["tasks"][0]
                recent = task.get("recent") or {}
                return task if recent.get("blocks") == n else None

            # during the run: every block but the held one has come back
            during = _until("11 blocks in the lanes", lambda: lanes_of(11), deadline)
            assert during["running"] is True and during["resources"] is False
            assert during["from_driver"] is False  # drawn from the store, not a driver
            recent = during["recent"]
            assert recent["source"] == "file" and recent["workers"] == workers
            assert len(recent["lanes"]) == workers
            if mode == "serial":
                assert [lane["worker"] for lane in recent["lanes"]] == ["driver"]
            assert _drawn(recent) == _ran(seen, "ran")
            dom = None if needs_chromium.args[0] else browser.dump_dom(url)
            gate.write_text("go")
            out = run.communicate(timeout=240)[0]
            assert "RESULT False" in out, out  # one block failed
            # after the run: its last write holds every block, the held one too
            after = _until("12 blocks in the lanes", lambda: lanes_of(12), deadline + 60)
            assert after["running"] is False
            assert _drawn(after["recent"]) == _ran(seen, "ran", "held")
            assert sum(f for lane in _drawn(after["recent"]) for _, f in lane) == 1
            for lane in after["recent"]["lanes"]:
                assert all(b[3] is None and b[4] is None for b in lane["blocks"])  # no RSS
        if dom is not None:  # the page draws them
            m = re.search(r'<canvas id="lanes"([^>]*)>', dom)
            assert m, dom[-3000:]
            assert f'data-workers="{workers}"' in m.group(1) and 'data-source="file"' in m.group(1)
            assert 'data-blocks="11"' in m.group(1)
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate()


RACE = """
import os, sys, time
from pathlib import Path
import bellis

HERE, GATE = Path(sys.argv[1]), Path(sys.argv[2])
SLOW = 7

def process(block):
    if block.block_id[1] == SLOW:
        try:
            fd = os.open(HERE / "first_attempt", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # the backup copy
            (HERE / "second_attempt").write_text(str(os.getpid()))
        else:  # the original: a straggler
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
        while not GATE.exists():  # both copies run until the test has looked
            time.sleep(0.05)
    time.sleep(0.02)

task = bellis.Task(
    "t",
    total_roi=bellis.Roi((0,), (40,)),
    read_roi=bellis.Roi((0,), (1,)),
    write_roi=bellis.Roi((0,), (1,)),
    process_function=process,
    read_write_conflict=False,
    max_workers=2,
    speculative=True,
    tracking_path="t",
)
print("RESULT", bellis.run_blockwise([task], dashboard=True, progress=False), flush=True)
"""


def _running(task: dict[str, Any]) -> list[dict[str, Any]]:
    recent = task.get("recent") or {}
    return [m for m in recent.get("marks") or [] if m.get("running")]


def test_a_race_still_going_is_drawn_running_on_both_lanes(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = tmp_path / "race.py"
    script.write_text(RACE)
    with driver_page(script, str(tmp_path), str(gate), cwd=tmp_path) as (run, url):
        deadline = time.monotonic() + 240
        _until("the copy starts", (tmp_path / "second_attempt").exists, deadline)

        def racing(page: str) -> dict[str, Any] | None:
            task = next(t for t in state_of(page)["tasks"] if t["name"] == "t")
            return task if len(_running(task)) == 2 else None

        task = _until("the race on the run's page", lambda: racing(url), deadline)
        dom = None if needs_chromium.args[0] else browser.dump_dom(f"{url}#task=t")
        with serve(tmp_path / "t") as served:  # and from the store's lanes file
            other = _until("the race on bellis serve", lambda: racing(served), deadline)
        gate.write_text("go")
        out = run.communicate(timeout=240)[0]
    assert "RESULT True" in out, out
    pids = {
        "straggler": (tmp_path / "first_attempt").read_text(),
        "backup": (tmp_path / "second_attempt").read_text(),
    }
    assert pids["straggler"] != pids["backup"]  # two processes ran it at once
    for found in (task, other):
        marks = {m["kind"]: m for m in _running(found)}
        assert sorted(marks) == ["backup", "straggler"]
        straggler, backup = marks["straggler"], marks["backup"]
        assert straggler["cell"] == backup["cell"] == 7
        assert straggler["won"] is None and backup["won"] is None
        assert straggler["worker"] != backup["worker"]
        assert straggler["start"] < backup["start"] <= backup["end"] == straggler["end"]
        names = [lane["worker"] for lane in found["recent"]["lanes"]]
        assert straggler["worker"] in names and backup["worker"] in names
        assert found["recent"]["end"] >= straggler["end"]
    assert other["recent"]["source"] == "file" and task["recent"]["source"] == "driver"
    if dom is not None:
        m = re.search(r'<canvas id="lanes"([^>]*)>', dom)
        assert m, dom[-3000:]
        assert 'data-running-marks="2"' in m.group(1) and 'data-backup-cells="7"' in m.group(1)
