"""SIGINT / SIGTERM to a driver mid-run: prompt exit, no surviving worker, drained blocks
recorded in the tracking store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from kit.blocks import read_records
from kit.procs import pid_alive

DRIVER = """
import functools
import sys

sys.path.insert(0, {kit_parent!r})
import bellis
from kit import blocks
from bellis import logging as blog

blog.set_log_basedir({logs!r})
bellis.set_tracking_basedir({track!r})
fn = functools.partial(blocks.sleep_block, {rec!r}, 0.3)
a = blocks.make_task("a", 40, fn, max_workers=3)
b = blocks.make_task("b", 40, fn, max_workers=2)
bellis.run_blockwise(bellis.Pipeline([a, b], [(a, b)]), progress=False)
"""


def worker_processes(marker: str) -> list[int]:
    """Live bellis worker processes whose environment mentions ``marker``."""
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/cmdline", "rb") as f:
                cmd = f.read()
            if b"bellis._worker._main" not in cmd:
                continue
            with open(f"/proc/{e}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if marker.encode() in env and pid_alive(int(e)):
            out.append(int(e))
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_driver_drains_and_exits(sig: signal.Signals, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    track = tmp_path / "track"
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(DRIVER).format(
            kit_parent=str(Path(__file__).parents[1]),
            logs=str(tmp_path / "logs"),
            track=str(track),
            rec=str(rec),
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            recs = read_records(rec)
            if sum(1 for rows in recs.values() if rows and rows[-1].kind == "done") >= 4:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        else:
            pytest.fail("the driver made no progress")
        t_sig_wall = time.time()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = out.decode()
    assert proc.returncode != 0
    assert "Run interrupted; counts at shutdown:" in text
    assert f"run aborted by {sig.name}" in err.decode()
    assert worker_processes(str(tmp_path)) == []
    recs = read_records(rec)
    pids = {a.pid for rows in recs.values() for a in rows}
    assert pids and not any(pid_alive(p) for p in pids)
    for task_id in ("a", "b"):
        done = np.asarray(zarr.open_group(str(track / task_id), mode="r")["done"][...])
        succeeded = {
            sid
            for (t, sid), rows in recs.items()
            if t == task_id and any(a.kind == "done" for a in rows)
        }
        marked = {int(i) for i in np.flatnonzero(done)}
        # every block marked done ran to completion, and every block that completed (also
        # during the drain) is marked done
        assert marked <= succeeded, (task_id, marked - succeeded)
        assert succeeded <= marked, (task_id, succeeded - marked)
    assert len(recs) < 80  # it really was interrupted
    # the report of the interrupted run: its workers were alive at the abort
    line = json.loads((track / "a" / "runs.jsonl").read_text().splitlines()[-1])
    assert line["outcome"] == "interrupted"
    assert set(line["workers"]["exits"]) == {"interrupted"}, line["workers"]["exits"]
    assert all(r["teardown"] is None for r in line["workers"]["records"])
    # the drain hands out no new block: at most one per worker (5) was on its way when the
    # signal came
    started_after = [
        a for rows in recs.values() for a in rows if a.kind == "start" and a.t0 > t_sig_wall
    ]
    assert len(started_after) <= 5, started_after
    # blocks in flight at the signal finished during the drain, and were recorded above
    assert any(a.t1 is not None and a.t1 > t_sig_wall for rows in recs.values() for a in rows)
