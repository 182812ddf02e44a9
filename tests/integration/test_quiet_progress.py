"""Quiet logs for batch runs (issue 39 item 4, daisy#57): when stderr is not a terminal, a
task's progress is one line every ``BELLIS_PROGRESS_INTERVAL`` seconds, never one per block;
on a terminal the live bars stay as they are.

Each test writes a script into ``tmp_path`` and runs it as a user would, with stderr a pipe
(a cluster job's log) or, for the bars, a tmux pane.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kit.terminal import needs_tmux, run_in_terminal

SCRIPT = """
import sys
import time

import bellis
from bellis import Roi


def noop(block):
    pass


if __name__ == "__main__":
    side = int(sys.argv[2])
    task = bellis.Task(
        "quiet",
        total_roi=Roi((0, 0), (side, side)),
        read_roi=Roi((0, 0), (1, 1)),
        write_roi=Roi((0, 0), (1, 1)),
        process_function=noop,
        read_write_conflict=False,
        max_workers=2,
    )
    start = time.monotonic()
    ok = bellis.run_blockwise(
        [task], multiprocessing=sys.argv[1] == "distributed", progress=True, summary=False
    )
    print(f"wall {time.monotonic() - start:.6f}", flush=True)
    sys.exit(0 if ok else 1)
"""


def _env(interval: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BELLIS_PROGRESS_INTERVAL"}
    if interval is not None:
        env["BELLIS_PROGRESS_INTERVAL"] = interval
    return env


def _run(
    tmp_path: Path, mode: str, side: int, interval: str | None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "quiet.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), mode, str(side)],
        cwd=tmp_path,
        env=_env(interval),
        capture_output=True,  # stderr is a pipe, not a terminal: a batch job's log
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_a_10000_block_run_writes_a_bounded_number_of_progress_lines(
    mode: str, tmp_path: Path
) -> None:
    interval = 1.0
    done = _run(tmp_path, mode, 100, f"{interval:g}")
    assert done.returncode == 0, done.stdout + done.stderr
    wall = float(done.stdout.split("wall ", 1)[1].split()[0])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if mode == "serial":  # serial mode shows no progress at all (SPEC, daisy's behaviour)
        assert lines == [], done.stderr
        return
    # everything on stderr is a progress line of the task: nothing per block
    assert all(line.startswith("[bellis] quiet: ") for line in lines), done.stderr
    finished = [line for line in lines if line.startswith("[bellis] quiet: finished ")]
    assert len(finished) == 1 and "10000/10000 done (100.0%)" in finished[0], done.stderr
    # a task's lines come at least one interval apart, the first one interval after the
    # start: at most wall / interval of them in a run that took `wall` seconds
    bound = math.floor(wall / interval) + 1
    assert len(lines) - 1 <= bound, (wall, bound, done.stderr)


def test_a_bad_interval_is_an_error_that_names_the_variable(tmp_path: Path) -> None:
    done = _run(tmp_path, "distributed", 2, "soon")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "ConfigurationError" in done.stderr, done.stderr
    assert "BELLIS_PROGRESS_INTERVAL='soon'" in done.stderr, done.stderr
    assert "BELLIS_PROGRESS_INTERVAL=60" in done.stderr, done.stderr


@needs_tmux
def test_a_terminal_keeps_its_live_bar(tmp_path: Path) -> None:
    """The variable spaces the plain lines only: on a terminal the tqdm bar is as before."""
    script = tmp_path / "quiet.py"
    script.write_text(SCRIPT)
    status, pane = run_in_terminal(
        tmp_path,
        f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} distributed 20 > out.txt",
        setup="export BELLIS_PROGRESS_INTERVAL=1\n",
    )
    assert status == "0", pane
    # a tqdm bar that ended at 400/400 with the task's final symbol, and no plain lines
    assert "quiet ✔ ♻=0" in pane and "400/400" in pane, pane
    assert "[bellis]" not in pane, pane
