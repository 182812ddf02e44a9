"""Resume after a code change for tasks with a daisy ``check_function`` (review finding 2
of issue 26), as a user runs it: a 2-task script in a subprocess, real stores, a check
that says "this block's output exists". With ``on_code_change="rerun"`` the blocks made
by other code really run again (the check is not asked about them), the summary counts
the blocks that ran, ``bellis status`` shows them under the new code version, and a
following ``on_code_change="error"`` run passes; a check skip never claims the current
code made a block."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kit.user_script import run_script

SCRIPT = """
import os
import sys

import bellis as daisy
from funlib.geometry import Roi

THRESHOLD = 0.5


def record(name, text):
    for folder in (os.environ["RECORDS"], "made"):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)


def upstream(block):
    if os.environ.get("KILL") == str(block.block_id[1]):
        os._exit(9)  # the run is killed here
    if os.environ.get("FAIL") == str(block.block_id[1]):
        raise RuntimeError("this block fails")
    record(f"up_{block.block_id[1]}", str(THRESHOLD))


def downstream(block):
    record(f"down_{block.block_id[1]}", "")


def exists(kind):
    return lambda block: os.path.exists(os.path.join("made", f"{kind}_{block.block_id[1]}"))


daisy.set_tracking_basedir("tracking")
policy = os.environ.get("POLICY", "warn")
roi, block = Roi((0,), (40,)), Roi((0,), (10,))
a = daisy.Task("A", roi, block, block, upstream, check_function=exists("up"),
               on_code_change=policy)
b = daisy.Task("B", roi, block, block, downstream, check_function=exists("down"),
               on_code_change=policy)
ok = daisy.run_blockwise(a + b, multiprocessing=os.environ["MODE"] == "dist")
sys.exit(0 if ok else 3)
"""

EDITED = SCRIPT.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7")
MODES = ["serial", "dist"]


def _run(
    tmp_path: Path, text: str, records: str, mode: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    proc = run_script(
        tmp_path, text, name="pipeline.py", env={"RECORDS": records, "MODE": mode, **env}
    )
    folder = tmp_path / records
    return proc, sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _versions(tmp_path: Path, task: str) -> dict[int, int]:
    """``bellis status``: done blocks per code version ({index: count}; 0: unknown)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(tmp_path / "tracking" / task)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {int(v): int(n) for v, n in re.findall(r"version (\d+): (\d+) blocks", proc.stdout)}
    unknown = re.search(r"unknown version: (\d+) blocks", proc.stdout)
    if unknown:
        found[0] = int(unknown.group(1))
    return {v: n for v, n in found.items() if n}


def _threshold_on_disk(tmp_path: Path) -> list[str]:
    return [(tmp_path / "made" / f"up_{i}").read_text() for i in range(4)]


UP = [f"up_{i}" for i in range(4)]
DOWN = [f"down_{i}" for i in range(4)]


@pytest.mark.parametrize("mode", MODES)
def test_rerun_runs_blocks_of_other_code_although_the_check_finds_them(
    tmp_path: Path, mode: str
) -> None:
    proc, made = _run(tmp_path, SCRIPT, "run1", mode, POLICY="rerun")
    assert proc.returncode == 0 and made == DOWN + UP, proc.stdout + proc.stderr
    before = _versions(tmp_path, "A")
    assert sum(before.values()) == 4 and 0 not in before

    proc, made = _run(tmp_path, EDITED, "run2", mode, POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # A's blocks ran under the new code, then B's blocks that read them; none check-skipped
    assert made == DOWN + UP
    assert _threshold_on_disk(tmp_path) == ["0.7"] * 4
    assert "A: 4 block(s) made by other code (function upstream) ran again" in proc.stdout
    assert "B: 4 block(s) reading blocks of A redone after them ran again" in proc.stdout
    assert "check function" not in proc.stdout  # nothing skipped by a check
    # status: A's 4 blocks under one version, not the one the first run recorded
    after = _versions(tmp_path, "A")
    assert sum(after.values()) == 4 and len(after) == 1
    assert set(after) != set(before)

    # the store now says the current code made every block: "error" passes, nothing runs
    proc, made = _run(tmp_path, EDITED, "run3", mode, POLICY="error")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == []
    assert "made by other code" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("mode", MODES)
def test_default_still_skips_them_and_says_so(tmp_path: Path, mode: str) -> None:
    """The daisy-compatible default is unchanged: the done blocks are skipped, with the
    warning, and they stay recorded as other code's (a later "error" run sees them)."""
    proc, _ = _run(tmp_path, SCRIPT, "run1", mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, made = _run(tmp_path, EDITED, "run2", mode)
    assert proc.returncode == 0 and made == [], proc.stdout + proc.stderr
    assert "A: 4 block(s) skipped as done were made by other code" in proc.stdout
    proc, made = _run(tmp_path, EDITED, "run3", mode, POLICY="error")
    assert proc.returncode == 1 and made == []
    assert 'task "A": 4 done block(s) were made by other code' in proc.stderr


def test_a_killed_rerun_resumes_with_the_cleared_blocks_unchecked(tmp_path: Path) -> None:
    """A rerun killed midway left the cleared markers of blocks still holding the old
    output; the resume runs them (the check would find their old output), and so B."""
    proc, _ = _run(tmp_path, SCRIPT, "run1", "serial", POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, made = _run(tmp_path, EDITED, "run2", "serial", POLICY="rerun", KILL="2")
    assert proc.returncode == 9 and made == ["up_0", "up_1"], proc.stdout + proc.stderr
    proc, made = _run(tmp_path, EDITED, "run3", "serial", POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == [*DOWN, "up_2", "up_3"]
    assert _threshold_on_disk(tmp_path) == ["0.7"] * 4
    assert "A: 2 block(s) made by other code (function upstream) ran again" in proc.stdout
    proc, made = _run(tmp_path, EDITED, "run4", "serial", POLICY="error")
    assert proc.returncode == 0 and made == [], proc.stdout + proc.stderr


def test_a_check_skip_keeps_the_code_that_made_the_block(tmp_path: Path) -> None:
    """After a killed rerun, a "warn" run lets the check skip the cleared blocks (as
    daisy would); they stay recorded as the old code's, so "error" then names them."""
    proc, _ = _run(tmp_path, SCRIPT, "run1", "serial", POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, made = _run(tmp_path, EDITED, "run2", "serial", POLICY="rerun", KILL="2")
    assert proc.returncode == 9, proc.stdout + proc.stderr
    proc, made = _run(tmp_path, EDITED, "run3", "serial")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up_2" not in made and "up_3" not in made
    assert sorted(_versions(tmp_path, "A").values()) == [2, 2]  # two versions, 2 each
    proc, made = _run(tmp_path, EDITED, "run4", "serial", POLICY="error")
    assert proc.returncode == 1 and made == []
    assert 'task "A": 2 done block(s) were made by other code' in proc.stderr


def test_blocks_a_check_finds_before_any_run_are_of_unknown_code(tmp_path: Path) -> None:
    """Output made outside bellis (the check finds it, no run made it): the blocks are
    done of unknown code, never of the current code."""
    made_dir = tmp_path / "made"
    made_dir.mkdir()
    for i in range(2):
        (made_dir / f"up_{i}").write_text("elsewhere")
    proc, made = _run(tmp_path, SCRIPT, "run1", "serial", POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == [*DOWN, "up_2", "up_3"]
    versions = _versions(tmp_path, "A")
    assert versions.get(0) == 2 and sum(versions.values()) == 4


def test_the_summary_counts_only_the_cleared_blocks_that_ran(tmp_path: Path) -> None:
    """Distributed: a block that raises fails and the run goes on (in serial mode the
    exception ends the script, as in daisy; the killed-resume test covers that)."""
    mode = "dist"
    proc, _ = _run(tmp_path, SCRIPT, "run1", mode, POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, made = _run(tmp_path, EDITED, "run2", mode, POLICY="rerun", FAIL="3")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert made == ["down_0", "down_1", "down_2", "up_0", "up_1", "up_2"]
    assert (
        "A: 3 of 4 block(s) made by other code (function upstream) ran again "
        "(1 not done: a next run redoes them)" in proc.stdout
    )
    assert "B: 3 of 4 block(s) reading blocks of A redone after them ran again" in proc.stdout
    # the failed block still holds the old output, which its check finds: it runs anyway
    proc, made = _run(tmp_path, EDITED, "run3", mode, POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == ["down_3", "up_3"]
    assert _threshold_on_disk(tmp_path) == ["0.7"] * 4
    assert "A: 1 block(s) made by other code (function upstream) ran again" in proc.stdout
    proc, made = _run(tmp_path, EDITED, "run4", mode, POLICY="error")
    assert proc.returncode == 0 and made == [], proc.stdout + proc.stderr
