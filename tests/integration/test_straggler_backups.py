"""Straggler backups (issue 17 item 2), as a user runs them: a script in a subprocess,
40 blocks of 20 ms on 2 real worker processes, one block of which sleeps on its first
attempt only (a marker file says which process made that attempt).

With ``Task(speculative=True)`` the idle worker runs a copy of the sleeping block, the copy
wins, the sleeping worker is stopped at once (its process is gone), the block is recorded
once with the copy's figures, and nothing counts as a failure. Without it, the run waits
for the sleeper.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from kit.procs import gone
from kit.slurm import drained, job_prefix, needs_slurm, oversub_partition
from kit.user_script import run_to_result, runs_line

BLOCKS = 40
SLOW = 7  # the block that sleeps on its first attempt

SCRIPT = """
import json
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
SLOW = int(sys.argv[1])
SLEEP = float(sys.argv[2])


def block_fn(block):
    sid = block.block_id[1]
    if sid == SLOW:
        marker = HERE / "first_attempt"
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            (HERE / "second_attempt").write_text(str(os.getpid()))
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            time.sleep(SLEEP)
    time.sleep(0.02)


def main():
    speculative = sys.argv[3] == "on"
    launcher = None
    if sys.argv[4].startswith("slurm:"):
        from bellis import SlurmLauncher

        prefix, _, partition = sys.argv[4][6:].partition(":")
        launcher = SlurmLauncher(
            job_name_prefix=prefix, partition=partition or None, poll_interval=0.5
        )
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    task = bellis.Task(
        "t",
        total_roi=Roi((0,), (40,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=block_fn,
        read_write_conflict=False,
        max_workers=2,
        resource_tracking=True,
        speculative=speculative,
        launcher=launcher,
    )
    t0 = time.monotonic()
    ok = bellis.run_blockwise([task], progress=False)
    elapsed = time.monotonic() - t0
    report = task.report()
    rec = report.block((SLOW,))
    (HERE / "result.json").write_text(
        json.dumps(
            {
                "ok": ok,
                "elapsed": elapsed,
                "report": report.to_json(),
                "slow_record": None
                if rec is None
                else {"worker_id": rec.worker_id, "wall": rec.stats.wall_seconds},
                "records": sum(1 for _ in report.block_records()),
            }
        )
    )
    (HERE / "panel.txt").write_text(report.panel())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
"""


def _run(
    tmp_path: Path, sleep: float, mode: str, launcher: str = "local"
) -> tuple[Any, dict[str, Any]]:
    return run_to_result(tmp_path, SCRIPT, str(SLOW), str(sleep), mode, launcher)


def _assert_the_copy_won(tmp_path: Path, proc: Any, result: dict[str, Any]) -> None:
    assert result["ok"] is True
    assert result["elapsed"] < 60.0  # the run did not wait for the sleeper
    # the slow copy's process is gone: stopped, not left to sleep on (a SLURM job's
    # processes go when slurmd has carried out the scancel)
    slow_pid = int((tmp_path / "first_attempt").read_text())
    assert gone(slow_pid, 30.0)
    assert int((tmp_path / "second_attempt").read_text()) != slow_pid
    report = result["report"]
    counters = report["counters"]
    assert counters["completed"] == BLOCKS
    assert (counters["failed"], counters["worker_failures"], counters["worker_restarts"]) == (
        0,
        0,
        0,
    )
    assert (counters["timeout_reclaims"], counters["orphaned"]) == (0, 0)
    assert (counters["backups_started"], counters["backups_won"], counters["backups_lost"]) == (
        1,
        1,
        0,
    )
    assert counters["backup_loser_seconds"] > 0
    assert report["blocks"]["failed_attempts"] == 0
    # recorded once, with the fast copy's figures, by the worker that ran the copy
    assert report["blocks"]["count"] == BLOCKS and result["records"] == BLOCKS
    assert report["blocks"]["wall"]["n"] == BLOCKS
    exits = report["workers"]["exits"]
    assert exits == {"preempted": 1, "clean": 1}, exits
    (preempted,) = [r for r in report["workers"]["records"] if r["exit"] == "preempted"]
    slow = result["slow_record"]
    assert slow is not None and slow["wall"] < 5.0
    assert slow["worker_id"] != preempted["worker_id"]
    line = runs_line(tmp_path)
    assert line["counters"]["backups_won"] == 1 and line["counters"]["failed"] == 0
    assert line["workers"]["exits"] == {"preempted": 1, "clean": 1}
    assert re.search(r"backups +1 started, 1 won, 0 lost", (tmp_path / "panel.txt").read_text())
    assert "1 straggler backup(s) in task 't': 1 won" in proc.stdout
    assert f"block t/{SLOW} has been out" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("launcher", ["local", pytest.param("slurm", marks=needs_slurm())])
def test_a_backup_copy_of_the_straggler_wins_and_the_slow_copy_is_stopped(
    tmp_path: Path, launcher: str
) -> None:
    prefix = job_prefix(tmp_path, "bk")
    where = "local"
    if launcher == "slurm":
        # the CI cluster's oversubscribed partition, where there is one: both workers' jobs
        # run at once even while other jobs hold the node's two CPUs
        where = f"slurm:{prefix}:{oversub_partition() or ''}"
    proc, result = _run(tmp_path, 60.0, "on", where)
    _assert_the_copy_won(tmp_path, proc, result)
    if launcher == "local":
        # the slot of the stopped worker says why it left, should a new worker take it
        assert "worker exited with error" not in proc.stderr
    else:
        # the slow copy's job was cancelled, and no job of the run is left
        assert drained(prefix, 60.0) == []


def test_without_backups_the_run_waits_for_the_straggler(tmp_path: Path) -> None:
    sleep = 4.0
    _proc, result = _run(tmp_path, sleep, "off")
    assert result["ok"] is True
    assert result["elapsed"] >= sleep
    assert not (tmp_path / "second_attempt").exists()  # it ran once, slowly
    counters = result["report"]["counters"]
    assert counters["backups_started"] == 0 and counters["completed"] == BLOCKS
    slow = result["slow_record"]
    assert slow is not None and slow["wall"] >= sleep
    assert os.path.exists(tmp_path / "first_attempt")
