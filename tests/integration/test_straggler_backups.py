"""Straggler backups (issue 17 item 2), as a user runs them: a script in a subprocess,
40 blocks of 20 ms on 2 real worker processes, one block of which sleeps on its first
attempt only (a marker file says which process made that attempt).

With ``Task(speculative=True)`` the idle worker runs a copy of the sleeping block, the copy
wins, the sleeping worker is stopped at once (its process is gone), the block is recorded
once with the copy's figures, and nothing counts as a failure. Without it, the run waits
for the sleeper.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import slurm_unavailable_reason

from bellis._stats._runlog import validate_run_line

_SLURM = slurm_unavailable_reason()

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
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(SLOW), str(sleep), mode, launcher],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads((tmp_path / "result.json").read_text())


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def _active_jobs(prefix: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i|%j"], capture_output=True, text=True, timeout=30, check=True
    )
    return [line for line in out.stdout.splitlines() if f"|{prefix}" in line]


def _runs_line(tmp_path: Path) -> dict[str, Any]:
    lines = (tmp_path / "tracking" / "t" / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 1
    line: dict[str, Any] = json.loads(lines[0])
    assert validate_run_line(line) == []
    return line


def _gone(pid: int, within: float) -> bool:
    end = time.monotonic() + within
    while _pid_alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def _assert_the_copy_won(tmp_path: Path, proc: Any, result: dict[str, Any]) -> None:
    assert result["ok"] is True
    assert result["elapsed"] < 60.0  # the run did not wait for the sleeper
    # the slow copy's process is gone: stopped, not left to sleep on (a SLURM job's
    # processes go when slurmd has carried out the scancel)
    slow_pid = int((tmp_path / "first_attempt").read_text())
    assert _gone(slow_pid, 30.0)
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
    line = _runs_line(tmp_path)
    assert line["counters"]["backups_won"] == 1 and line["counters"]["failed"] == 0
    assert line["workers"]["exits"] == {"preempted": 1, "clean": 1}
    assert re.search(r"backups +1 started, 1 won, 0 lost", (tmp_path / "panel.txt").read_text())
    assert "1 straggler backup(s) in task 't': 1 won" in proc.stdout
    assert f"block t/{SLOW} has been out" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_backup_copy_of_the_straggler_wins_and_the_slow_copy_is_stopped(
    tmp_path: Path,
) -> None:
    proc, result = _run(tmp_path, 60.0, "on")
    _assert_the_copy_won(tmp_path, proc, result)
    # the slot of the stopped worker says why it left, should a new worker take it
    assert "worker exited with error" not in proc.stderr


@pytest.mark.slurm
@pytest.mark.skipif(_SLURM is not None, reason=f"no SLURM controller: {_SLURM}")
def test_on_slurm_the_copy_wins_and_the_slow_job_is_cancelled(tmp_path: Path) -> None:
    prefix = "bk" + str(abs(hash(str(tmp_path))) % 10**8)
    # the CI cluster's oversubscribed partition, where there is one: both workers' jobs run
    # at once even while other jobs hold the node's two CPUs
    out = subprocess.run(
        ["sinfo", "-h", "-p", "oversub", "-o", "%P"], capture_output=True, text=True
    )
    partition = "oversub" if out.stdout.strip() else ""
    proc, result = _run(tmp_path, 60.0, "on", f"slurm:{prefix}:{partition}")
    _assert_the_copy_won(tmp_path, proc, result)
    end = time.monotonic() + 60
    while _active_jobs(prefix) and time.monotonic() < end:
        time.sleep(0.5)
    assert _active_jobs(prefix) == []


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
