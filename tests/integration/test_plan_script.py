"""Issue 28, item 3: ``bellis plan -- python my_pipeline.py ARGS`` plans an unchanged
daisy-style script: each ``run_blockwise`` call it reaches prints and saves its plan
instead of running, and returns True as a completed run would; when a later step needs
outputs that the dry run did not write, the plan says where the script stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

# a daisy-style script: two steps, each one run_blockwise call, the second reading what the
# first wrote (a marker per block); with "strict" it refuses to go on without them
SCRIPT = textwrap.dedent(
    """
    import os, sys
    import bellis as daisy
    from bellis import Roi

    out = sys.argv[1]
    strict = len(sys.argv) > 2 and sys.argv[2] == "strict"
    daisy.set_tracking_basedir("tracking")

    def first(block):
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, str(block.block_id[1])), "w").close()

    def second(block):
        open(os.path.join(out, "second-" + str(block.block_id[1])), "w").close()

    def third(block):
        open(os.path.join(out, "third-" + str(block.block_id[1])), "w").close()

    t1 = daisy.Task("first", Roi((0, 0), (40, 40)), Roi((0, 0), (10, 10)),
                    Roi((0, 0), (10, 10)), process_function=first, max_workers=2)
    print("first returned", daisy.run_blockwise([t1]))
    if strict and not os.path.isdir(out):
        sys.exit("the first step wrote no output: " + out)
    t2 = daisy.Task("second", Roi((0, 0), (40, 40)), Roi((0, 0), (20, 20)),
                    Roi((5, 5), (10, 10)), process_function=second, max_workers=4)
    states = daisy.run_blockwise([t2], multiprocessing=False, return_states=True)
    s = states["second"]
    print("second returned", s.completed_count == s.total_block_count, s.total_block_count)
    t3 = daisy.Task("third", Roi((0,), (4,)), Roi((0,), (1,)), Roi((0,), (1,)),
                    process_function=third)
    states = daisy.Server().run_blockwise([t3], progress=False)
    print("third returned", states["third"].completed_count)
    """
)


def _plan(
    tmp_path: Path, *script_args: str, sample: list[str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    (tmp_path / "pipeline.py").write_text(SCRIPT)
    cli = [sys.executable, "-m", "bellis", "plan", *(sample or []), "--"]
    proc = subprocess.run(
        [*cli, sys.executable, "pipeline.py", *script_args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "BELLIS_PLAN"},
    )
    lines = (tmp_path / "bellis-plan.jsonl").read_text().splitlines()
    return proc, [json.loads(line) for line in lines]


def test_each_run_blockwise_call_of_a_script_prints_and_saves_its_plan(tmp_path: Path) -> None:
    proc, entries = _plan(tmp_path, "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # nothing ran: no block wrote its file, no store was created, no worker log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bellis-plan.jsonl", "pipeline.py"]
    # each call returned True, as a completed run would
    assert "first returned True" in proc.stdout and "second returned True 9" in proc.stdout
    assert "third returned 4" in proc.stdout  # a Server plans too
    assert "run_blockwise call 1" in proc.stdout and "run_blockwise call 3" in proc.stdout
    assert "3 run_blockwise call(s) planned" in proc.stdout
    plans = [e["plan"] for e in entries]
    assert [p["call"] for p in plans] == [1, 2, 3]
    first, second = plans[0]["tasks"][0], plans[1]["tasks"][0]
    assert (first["task_id"], first["blocks"], first["left"], first["workers"]) == (
        "first",
        16,
        16,
        2,
    )
    assert (plans[0]["mode"], first["launcher"]) == ("distributed", "local")
    # 40 less 2 x 5 of context: 3 blocks per axis, conflicts (context) give levels
    assert (second["task_id"], second["blocks"], second["left"]) == ("second", 9, 9)
    assert second["levels"] > 1 and second["launcher"] == "serial" and second["workers"] == 0
    assert plans[0]["assumes"] == [] and plans[1]["assumes"] == ["first"]
    assert plans[2]["assumes"] == ["first", "second"]
    assert "assumes: the blocks earlier run_blockwise calls left to run (first)" in proc.stdout


def test_the_plan_says_where_a_script_stopped(tmp_path: Path) -> None:
    proc, entries = _plan(tmp_path, "out", "strict")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the first step wrote no output" in proc.stderr  # the script's own error
    assert [e["plan"]["call"] for e in entries if "plan" in e] == [1]
    stopped = entries[-1]["stopped"]
    assert stopped["exit_code"] == 1 and stopped["after_call"] == 1
    assert "after run_blockwise call 1 (tasks first)" in stopped["text"]
    assert "first (16 blocks not run)" in stopped["text"]
    assert stopped["text"] in proc.stdout


def test_plan_without_a_command_says_how_to_call_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "plan"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "bellis plan -- python my_pipeline.py ARGS" in proc.stderr


def test_plan_with_a_sample_forecasts_each_call_and_runs_only_the_sample(tmp_path: Path) -> None:
    proc, entries = _plan(tmp_path, "out", "strict", sample=["--sample", "5"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the sample ran for real (and wrote its outputs, so the strict script went on)
    ran = sorted(p.name for p in (tmp_path / "out").iterdir())
    plans = [e["plan"] for e in entries]
    assert [p["call"] for p in plans] == [1, 2, 3]
    sampled = [p["tasks"][0]["forecast"]["sampled_done"] for p in plans]
    # 5 blocks per task; the second task's conflict levels add the blocks a sampled block
    # waits for (its first level has one block); the third has 4 blocks in all
    assert sampled[0] == 5 and 5 <= sampled[1] <= 9 and sampled[2] == 4
    assert len([n for n in ran if n.isdigit()]) == sampled[0]
    assert len([n for n in ran if n.startswith("second-")]) == sampled[1]
    assert len([n for n in ran if n.startswith("third-")]) == sampled[2]
    assert "third returned 4" in proc.stdout
    for p, total, n in zip(plans, (16, 9, 4), sampled, strict=True):
        task = p["tasks"][0]
        assert task["done"] == n and task["left"] == total - n
        assert p["forecast"]["blocks_left"] == total - n and p["forecast"]["wall"]["estimate"] >= 0
    # the third task's sample is all of it: nothing is left to forecast
    assert plans[2]["forecast"]["wall"]["estimate"] == 0
    assert "forecast (from the sample" in proc.stdout


def test_plan_rejects_a_bad_sample(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "plan", "--sample", "0", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--sample wants a positive number of blocks per task (got '0')" in proc.stderr


def test_plan_help_says_what_a_sample_runs_and_writes(tmp_path: Path) -> None:
    # review finding 11: the help said "No block runs and no tracking store is written",
    # which --sample contradicts (its blocks run, are recorded done, and leave a forecast)
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "plan", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "No block runs and no tracking store is written." not in text
    assert "Without --sample no block runs and no tracking store is written" in text
    assert "with --sample each call's sample of blocks really runs, is recorded done" in text
    assert "forecast.json" in text
