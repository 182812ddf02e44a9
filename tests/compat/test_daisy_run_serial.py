"""``from daisy._runner import _run_serial; _run_serial([task])``, as daisy's
``examples/mws.py --no-multiprocessing`` does (issue 14 item 3): private in daisy, but its
own example teaches it, so scripts copied from it call it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import json
import os
import sys

import bellis as daisy
from bellis._entrypoints import _run_serial

how, out = sys.argv[1], sys.argv[2]
daisy.set_tracking_basedir(os.path.join(out, "tracking"))


def process(block):
    with open(os.path.join(out, f"block-{block.block_id[1]}"), "w") as f:
        f.write(str(os.getpid()))
    print("processed", block.block_id[1])


def downstream(block):
    process(block)


roi = daisy.Roi((0, 0), (4, 6))
block = daisy.Roi((0, 0), (2, 2))
task = daisy.Task("mws", roi, block, block, process, max_workers=4)
if how == "list":
    states = _run_serial([task])
elif how == "task":
    states = _run_serial(task, block_tracking=False, summary=False)
else:
    up = daisy.Task("up", roi, block, block, process)
    down = daisy.Task("down", roi, block, block, downstream)
    states = _run_serial(up + down, summary=True)
print(json.dumps({
    "pid": os.getpid(),
    "type": type(states).__name__,
    "states": {
        tid: [type(s).__name__, s.total_block_count, s.completed_count, s.failed_count]
        for tid, s in states.items()
    },
}))
"""


def _run(tmp_path: Path, how: str) -> tuple[dict[str, object], str, str]:
    script = tmp_path / "mws_like.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, str(script), how, str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result, proc.stdout, proc.stderr


def _block_pids(tmp_path: Path) -> set[str]:
    return {p.read_text() for p in (tmp_path / "out").glob("block-*")}


def test_a_list_of_tasks_runs_in_this_process_and_returns_the_states(tmp_path: Path) -> None:
    result, stdout, stderr = _run(tmp_path, "list")
    assert result["type"] == "dict"
    assert result["states"] == {"mws": ["TaskState", 6, 6, 0]}
    # every block ran in the script's own process: no worker processes
    assert _block_pids(tmp_path) == {str(result["pid"])}
    assert len(list((tmp_path / "out").glob("block-*"))) == 6
    # the execution summary is printed (stdout); no progress display
    assert "mws" in stdout.split("{", 1)[0]
    assert "it/s" not in stderr and "blocks/s" not in stderr
    # block tracking is on by default: the store exists
    assert (tmp_path / "out" / "tracking").exists()


def test_a_task_with_tracking_and_summary_off(tmp_path: Path) -> None:
    result, stdout, _ = _run(tmp_path, "task")
    assert result["states"] == {"mws": ["TaskState", 6, 6, 0]}
    # summary=False: the JSON line is the only output
    assert stdout.strip().count("\n") == 0
    assert not (tmp_path / "out" / "tracking").exists()


def test_a_pipeline(tmp_path: Path) -> None:
    result, _, _ = _run(tmp_path, "pipeline")
    assert result["states"] == {"up": ["TaskState", 6, 6, 0], "down": ["TaskState", 6, 6, 0]}


@pytest.mark.parametrize("runs", [1, 2])
def test_a_serial_run_adds_no_separator_of_its_own(tmp_path: Path, runs: int) -> None:
    # the run's separator line comes only before the output of a later run, never after a
    # run's own output (the serial loop reopened the log after the last block)
    script = tmp_path / "serial.py"
    script.write_text(
        "import bellis as daisy\n"
        "def f(b): print('block', b.block_id[1])\n"
        "r, b = daisy.Roi((0,), (4,)), daisy.Roi((0,), (2,))\n"
        "t = daisy.Task('t', r, b, b, f, tracking_path=False)\n"
        "daisy.run_blockwise(t, multiprocessing=False, progress=False, summary=False)\n"
    )
    for _ in range(runs):
        subprocess.run([sys.executable, str(script)], cwd=tmp_path, check=True, timeout=300)
    (log,) = (tmp_path / "daisy_logs").rglob("*.out")
    lines = log.read_text().splitlines()
    assert [line for line in lines if not line.startswith("===")] == ["block 0", "block 1"] * runs
    assert sum(line.startswith("=== bellis run") for line in lines) == runs - 1
    assert not lines[-1].startswith("===")
