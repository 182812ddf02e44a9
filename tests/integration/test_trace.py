"""``bellis report PATH --trace trace.json``: the Chrome trace of real distributed runs."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import bellis

FIXTURE = Path(__file__).parent.parent / "compat" / "daisy_store_fixture"

# a 3-D grid of 2 x 3 x 4 blocks and a 1-D second task; block (1, 2, 3) of "fine" fails for
# good, block (0, 1, 2) fails once and then succeeds (RETRY_MARKER), and with FIX set
# nothing fails (the rerun that resumes the failed block)
SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import bellis
    from bellis import Roi

    BASE, TRACKING, FIX = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"

    def fine(block):
        time.sleep(0.02)
        cell = tuple(int(o) // 10 for o in block.write_roi.offset)
        if cell == (1, 2, 3) and not FIX:
            raise ValueError("injected failure")
        if cell == (0, 1, 2):
            marker = os.path.join(BASE, "retried")
            if not os.path.exists(marker):
                open(marker, "w").close()
                raise ValueError("fails once")

    def coarse(block):
        time.sleep(0.01)

    a = bellis.Task("fine", total_roi=Roi((0, 0, 0), (20, 30, 40)),
                    read_roi=Roi((0, 0, 0), (10, 10, 10)),
                    write_roi=Roi((0, 0, 0), (10, 10, 10)), process_function=fine,
                    read_write_conflict=False, max_workers=2, max_retries=1,
                    resource_tracking=TRACKING)
    b = bellis.Task("coarse", total_roi=Roi((0,), (60,)), read_roi=Roi((0,), (10,)),
                    write_roi=Roi((0,), (10,)), process_function=coarse,
                    read_write_conflict=False, max_workers=2,
                    resource_tracking=TRACKING)
    bellis.set_tracking_basedir(os.path.join(BASE, "track"))
    ok = bellis.run_blockwise([a, b], progress=False, summary=False)
    print("ok" if ok else "failed")
    """
)


def _run(base: Path, *, tracking: bool = True, fix: bool = False) -> None:
    script = base / "pipeline.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(base), "1" if tracking else "0", "1" if fix else "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("ok" if fix else "failed"), proc.stdout + proc.stderr


def _trace_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bellis", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _blocks(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "run"]


def _names(trace: dict[str, Any], kind: str) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == kind
    }


def _load_report(store: Path) -> dict[tuple[int, ...], Any]:
    """The per-block records through the public API, by grid coordinate."""
    last = (store / "runs.jsonl").read_text().splitlines()[-1]
    report = bellis.TaskReport(json.loads(last), store)
    return {r.coord: r for r in report.block_records()}


def test_trace_of_a_pipeline_with_failures(tmp_path: Path) -> None:
    _run(tmp_path)
    out = tmp_path / "trace.json"
    proc = _trace_cli(str(tmp_path / "track"), "--trace", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "1 runs" in proc.stdout and "1 failed attempts" in proc.stdout, proc.stdout
    trace = json.loads(out.read_text())
    origin = trace["otherData"]["origin_unix_seconds"]
    events = _blocks(trace)

    # every done block is one event whose duration is its round trip in the store
    for task, count in (("fine", 23), ("coarse", 6)):
        records = _load_report(tmp_path / "track" / task)
        mine = [e for e in events if e["args"]["task"] == task and e["cat"] == "block"]
        assert len(mine) == len(records) == count
        for e in mine:
            rec = records[tuple(e["args"]["grid_coordinate"])]
            assert rec.sent_at is not None and rec.returned_at is not None
            assert e["dur"] == pytest.approx((rec.returned_at - rec.sent_at) * 1e6, abs=0.01)
            assert e["ts"] == pytest.approx((rec.sent_at - origin) * 1e6, abs=0.01)
            assert rec.stats is not None
            assert e["args"]["wall_seconds"] == pytest.approx(rec.stats.wall_seconds)
            assert e["args"]["peak_rss_bytes"] == rec.stats.peak_rss_bytes
            assert rec.worker_id is not None and e["args"]["worker_id"] == rec.worker_id

    # the block that failed for good: its last attempt, in its own category
    failed = [e for e in events if e["cat"] == "failed_attempt"]
    assert len(failed) == 1
    assert failed[0]["args"]["grid_coordinate"] == [1, 2, 3]
    assert failed[0]["args"]["write_roi"] == {"offset": [10, 20, 30], "shape": [10, 10, 10]}
    assert failed[0]["args"]["failed_attempts"] == 2  # max_retries=1: two attempts
    assert failed[0]["dur"] > 0
    retried = [e for e in events if e["args"]["grid_coordinate"] == [0, 1, 2]]
    assert [e["cat"] for e in retried] == ["block"]
    assert retried[0]["args"]["failed_attempts"] == 1

    # one process (one run), one thread per worker of each task, named; no overlaps
    processes = _names(trace, "process_name")
    assert len(processes) == 1 and "fine" in next(iter(processes.values()))
    threads = _names(trace, "thread_name")
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_thread[(e["pid"], e["tid"])].append(e)
        args = e["args"]
        assert threads[(e["pid"], e["tid"])] == f"{args['task']} worker {args['worker_id']}"
    assert {threads[k].split()[0] for k in by_thread} == {"fine", "coarse"}
    for evs in by_thread.values():
        evs.sort(key=lambda e: e["ts"])
        for a, b in itertools.pairwise(evs):
            assert a["ts"] + a["dur"] <= b["ts"] + 1.0, (a, b)  # 1 µs: float stamps
    runs = [e for e in trace["traceEvents"] if e.get("cat") == "run"]
    assert sorted(e["args"]["task"] for e in runs) == ["coarse", "fine"]


def test_trace_of_two_runs_has_two_processes(tmp_path: Path) -> None:
    _run(tmp_path)
    _run(tmp_path, fix=True)  # resumes: only the block that failed runs again
    out = tmp_path / "trace.json"
    proc = _trace_cli(str(tmp_path / "track" / "fine"), "--trace", str(out))
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(out.read_text())
    assert trace["otherData"]["runs"] == 2
    events = _blocks(trace)
    assert all(e["cat"] == "block" for e in events)
    second = [e for e in events if e["pid"] == 2]
    assert [e["args"]["grid_coordinate"] for e in second] == [[1, 2, 3]]
    assert second[0]["args"]["failed_attempts"] == 2
    assert len([e for e in events if e["pid"] == 1]) == 23
    assert len(_names(trace, "process_name")) == 2


def test_trace_without_resource_tracking(tmp_path: Path) -> None:
    _run(tmp_path, tracking=False)
    out = tmp_path / "trace.json"
    proc = _trace_cli(str(tmp_path / "track"), "--trace", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "no worker_id, sent_at, returned_at" in proc.stderr
    trace = json.loads(out.read_text())
    assert _blocks(trace) == []
    runs = [e for e in trace["traceEvents"] if e.get("cat") == "run"]
    assert len(runs) == 2 and all(e["args"]["outcome"] for e in runs)


def test_trace_of_a_daisy_store(tmp_path: Path) -> None:
    store = tmp_path / "daisy"
    shutil.copytree(FIXTURE, store)
    out = tmp_path / "t.json"
    proc = _trace_cli(str(store), "--trace", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "written by daisy 2.0.0" in proc.stderr
    trace = json.loads(out.read_text())
    assert trace["traceEvents"] == []
    (info,) = trace["otherData"]["stores"]
    assert "cpu_children_seconds" in info["missing_arrays"] and info["block_events"] == 0


def test_trace_of_no_store(tmp_path: Path) -> None:
    proc = _trace_cli(str(tmp_path), "--trace", str(tmp_path / "t.json"))
    assert proc.returncode == 2
    assert f"no tracking store at {tmp_path}" in proc.stderr
    assert not (tmp_path / "t.json").exists()
