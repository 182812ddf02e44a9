"""Stall detection (issue 17 item 3), as a user runs it: a script in a subprocess with
``Task(stall_timeout=2)`` and ``timeout=120``, real worker processes and real files.

A block that waits on an ``Event`` forever is reclaimed as *stalled* long before its
timeout, retried and completed; a block that sleeps while calling ``heartbeat()``, a block
that computes, and a block whose child process computes, all longer than the stall
timeout, are left alone; a block that only sleeps is reclaimed. The stall shows as its own
kind in the summary, the panel, the report, ``runs.jsonl`` and the worker's log, and the
store counts the failed attempt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kit.user_script import run_to_result, runs_line

STALL = 2.0
TIMEOUT = 120.0

SCRIPT = """
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent


def first_attempt(sid):
    marker = HERE / f"attempted_{sid}"
    if marker.exists():
        return False
    marker.write_text(str(os.getpid()))
    return True


def block_fn(block):
    sid = block.block_id[1]
    mode, stall = json.loads((HERE / "config.json").read_text())
    long = 3 * stall
    if mode == "event" and sid == 1 and first_attempt(sid):
        threading.Event().wait()  # no CPU, no IO: a stall
    elif mode == "sleep" and sid == 2 and first_attempt(sid):
        end = time.monotonic() + long
        while time.monotonic() < end:
            time.sleep(0.1)  # wakes up, but that is no sign of progress
    elif mode == "alive" and sid == 1:
        first_attempt(sid)
        end = time.monotonic() + long
        while time.monotonic() < end:
            time.sleep(stall / 8)
            block.heartbeat()
    elif mode == "alive" and sid == 2:
        first_attempt(sid)
        end = time.monotonic() + long
        while time.monotonic() < end:
            time.sleep(stall / 8)
            bellis.heartbeat()
    elif mode == "alive" and sid == 3:
        first_attempt(sid)
        end = time.monotonic() + long
        n = 0
        while time.monotonic() < end:
            n += 1  # busy: CPU moves
    elif mode == "alive" and sid == 4:
        first_attempt(sid)
        busy = f"import time\\nend = time.monotonic() + {long}\\nwhile time.monotonic() < end: pass"
        subprocess.run([sys.executable, "-c", busy], check=True)  # the child's CPU moves
    (HERE / f"done_{sid}").write_text(str(os.getpid()))


def main():
    mode, stall, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    (HERE / "config.json").write_text(json.dumps([mode, stall]))
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    task = bellis.Task(
        "t",
        total_roi=Roi((0,), (6,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=block_fn,
        read_write_conflict=False,
        max_workers=2,
        timeout=timeout,
        stall_timeout=stall,
    )
    t0 = time.monotonic()
    ok = bellis.run_blockwise([task], progress=False)
    elapsed = time.monotonic() - t0
    report = task.report()
    (HERE / "result.json").write_text(
        json.dumps({"ok": ok, "elapsed": elapsed, "report": report.to_json()})
    )
    (HERE / "panel.txt").write_text(report.panel())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
"""


def _run(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    return run_to_result(tmp_path, SCRIPT, mode, str(STALL), str(TIMEOUT))


def _err_logs(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in sorted((tmp_path / "logs").rglob("*.err")))


def _status(tmp_path: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(tmp_path / "tracking" / "t")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _assert_one_stall(tmp_path: Path, proc: Any, result: dict[str, Any], sid: int) -> None:
    # reclaimed by the stall detector, long before the block timeout could fire
    assert result["ok"] is True
    assert result["elapsed"] < TIMEOUT
    assert all((tmp_path / f"done_{i}").exists() for i in range(6))
    # the stalled attempt's worker is gone, and the block ran again in another one
    assert (tmp_path / f"attempted_{sid}").read_text() != (tmp_path / f"done_{sid}").read_text()
    counters = result["report"]["counters"]
    assert (counters["stall_reclaims"], counters["timeout_reclaims"]) == (1, 0)
    assert (counters["completed"], counters["failed"]) == (6, 0)
    assert result["report"]["workers"]["exits"].get("stalled") == 1
    assert "timeout" not in result["report"]["workers"]["exits"]
    assert result["report"]["blocks"]["failed_attempts"] == 1
    line = runs_line(tmp_path)
    assert line["counters"]["stall_reclaims"] == 1
    assert line["workers"]["exits"]["stalled"] == 1
    assert [r["exit"] for r in line["workers"]["records"]].count("stalled") == 1
    panel = (tmp_path / "panel.txt").read_text()
    assert "1 stalled" in panel
    assert f"1 block attempt(s) in task 't' stalled: no CPU, IO or heartbeat for {STALL:g}s" in (
        proc.stdout
    )
    assert f"block lost block_id=t/{sid} stalled=true (stall_timeout={STALL:g}s)" in proc.stderr
    err = _err_logs(tmp_path)
    assert f"block t/{sid} stalled: no CPU, IO or heartbeat for" in err
    assert "still running after timeout" not in err
    status = _status(tmp_path)
    assert "1 failed attempts recorded; 1 of the done cells failed before they succeeded" in status


def test_a_block_waiting_on_an_event_is_reclaimed_as_stalled_and_retried(tmp_path: Path) -> None:
    proc, result = _run(tmp_path, "event")
    _assert_one_stall(tmp_path, proc, result, 1)


def test_a_block_that_only_sleeps_is_stalled(tmp_path: Path) -> None:
    # waking up now and then is no sign of progress: only CPU, IO and heartbeats are
    proc, result = _run(tmp_path, "sleep")
    _assert_one_stall(tmp_path, proc, result, 2)


def test_heartbeats_computing_and_a_computing_child_keep_a_block_alive(tmp_path: Path) -> None:
    proc, result = _run(tmp_path, "alive")
    assert result["ok"] is True
    counters = result["report"]["counters"]
    assert (counters["stall_reclaims"], counters["completed"]) == (0, 6)
    assert result["report"]["blocks"]["failed_attempts"] == 0
    assert set(result["report"]["workers"]["exits"]) == {"clean"}
    for sid in (1, 2, 3, 4):  # each ran once, longer than the stall timeout
        assert (tmp_path / f"attempted_{sid}").read_text() == (tmp_path / f"done_{sid}").read_text()
    assert "stalled" not in _err_logs(tmp_path)
    assert "stalled" not in proc.stdout + proc.stderr
    assert runs_line(tmp_path)["counters"]["stall_reclaims"] == 0


SERIAL_SCRIPT = """
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent


def block_fn(block):
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        time.sleep(0.1)
    block.heartbeat()
    (HERE / f"done_{block.block_id[1]}").write_text("")


task = bellis.Task(
    "s",
    total_roi=Roi((0,), (2,)),
    read_roi=Roi((0,), (1,)),
    write_roi=Roi((0,), (1,)),
    process_function=block_fn,
    stall_timeout=0.5,
)
ok = bellis.run_blockwise([task], multiprocessing=False, progress=False, summary=False)
sys.exit(0 if ok else 1)
"""


def test_serial_mode_ignores_stall_timeout_with_a_warning(tmp_path: Path) -> None:
    script = tmp_path / "serial_script.py"
    script.write_text(SERIAL_SCRIPT)
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "done_0").exists() and (tmp_path / "done_1").exists()
    warning = "task 's': stall_timeout=0.5s is ignored in serial mode (multiprocessing=False)"
    assert proc.stderr.count(warning) == 1


@pytest.mark.parametrize("bad", ["0", "-3", "'2s'"])
def test_an_invalid_stall_timeout_is_refused_before_anything_runs(tmp_path: Path, bad: str) -> None:
    script = tmp_path / "bad_script.py"
    script.write_text(
        "import bellis\nfrom bellis import Roi\n"
        "bellis.Task('b', Roi((0,), (2,)), Roi((0,), (1,)), Roi((0,), (1,)),\n"
        f"            process_function=lambda b: None, stall_timeout={bad})\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1
    assert "bellis.errors.ConfigurationError: stall_timeout=" in proc.stderr
    assert "stall detection off" in proc.stderr
