"""``bellis serve`` refreshes its map and counts from what changed (issue 39).

The server keeps each store's decoded map between refreshes and decodes only the cells
whose bytes changed (``_report._live_delta``). One server follows a store across two
runs: the first leaves some blocks failed, the second (resumed, in place in the same
chunk files) makes them done; each refresh's counts and map are the store's.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kit.live import serve, state_of

SCRIPT = """
import sys
import bellis

PHASE = sys.argv[1]

def process(block):
    if PHASE == "first" and block.block_id[1] % 7 == 0:
        block.status = bellis.BlockStatus.FAILED

task = bellis.Task(
    "grid",
    total_roi=bellis.Roi((0,), (100,)),
    read_roi=bellis.Roi((0,), (1,)),
    write_roi=bellis.Roi((0,), (1,)),
    process_function=process,
    max_retries=0,
    read_write_conflict=False,
    tracking_path="grid",
)
print("RESULT", bellis.run_blockwise([task], multiprocessing=False, progress=False), flush=True)
"""

FAILING = [c for c in range(100) if c % 7 == 0]


def _run(script: Path, phase: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(script), phase], capture_output=True, text=True, cwd=cwd, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _codes(task: dict[str, Any]) -> list[int]:
    m = task["map"]
    assert m["tile"] == [1, 1, 1] and m["grid"] == [1, 1, 100]
    return list(base64.b64decode(m["codes"]))


def _until_done(url: str, done: int) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        task: dict[str, Any] = state_of(url)["tasks"][0]
        if task.get("done") == done:
            return task
        assert time.monotonic() < deadline, task
        time.sleep(0.3)


def test_a_refresh_shows_what_a_later_run_changed_in_place(tmp_path: Path) -> None:
    script = tmp_path / "grid.py"
    script.write_text(SCRIPT)
    assert "RESULT False" in _run(script, "first", tmp_path)
    with serve(tmp_path / "grid") as url:
        first = _until_done(url, 100 - len(FAILING))
        assert (first["failed"], first["retried"], first["failed_attempts"]) == (15, 0, 15)
        codes = _codes(first)
        assert [c for c in range(100) if codes[c] == 4] == FAILING  # failed
        assert all(codes[c] == 2 for c in range(100) if c not in FAILING)  # done
        # the same chunk files, rewritten in place by the next run while the server runs
        assert "RESULT True" in _run(script, "second", tmp_path)
        second = _until_done(url, 100)
        assert (second["failed"], second["retried"], second["failed_attempts"]) == (0, 15, 15)
        assert second["untouched"] == 0
        codes = _codes(second)
        assert [c for c in range(100) if codes[c] == 3] == FAILING  # done after failures
        assert all(codes[c] == 2 for c in range(100) if c not in FAILING)
