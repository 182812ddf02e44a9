"""Issue 28: a plan's sample runs in the run's steady state. Its first blocks wait until the
task's workers are all connected (``bellis._scheduling._gate``), so a sampled block runs
beside as many others as in the real run, not alone while the other workers import.

The user script's block function is unpickled in each worker before it connects; all but
the first worker to unpickle it start 3 s late. Ungated, the first worker would run the
whole 30-block sample (10 ms a block) before the others connect. Every block appends its
worker's pid to a file, so the test sees which workers ran the sample.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kit.slurm import job_prefix, needs_slurm
from kit.user_script import run_script

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import bellis
    from bellis import Roi

    base = os.getcwd()

    class Block:
        def __getstate__(self):
            return {}

        def __setstate__(self, state):
            # in the worker, before it connects: the first one here is quick
            try:
                os.close(os.open(os.path.join(base, "first"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                time.sleep(3)

        def __call__(self, block):
            time.sleep(0.01)
            fd = os.open(os.path.join(base, "ran"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.write(fd, f"{os.getpid()} {block.block_id[1]}\\n".encode())
            os.close(fd)

    kw = {}
    if sys.argv[1] == "slurm":
        kw["launcher"] = bellis.SlurmLauncher(
            job_name_prefix=sys.argv[2], poll_interval=0.5, time_limit=10, mem="300M",
            partition="oversub")
    task = bellis.Task("t", Roi((0, 0), (200, 300)), Roi((0, 0), (10, 10)),
                       Roi((0, 0), (10, 10)), process_function=Block(), max_workers=3, **kw)
    bellis.set_tracking_basedir(os.path.join(base, "tracking"))
    plan = bellis.plan(task, sample=30, show=False)
    print("@@" + json.dumps(plan.to_json()["forecast"]))
    """
)


@pytest.mark.parametrize(
    "launcher", ["local", pytest.param("slurm", marks=needs_slurm())], ids=["local", "slurm"]
)
def test_a_sample_waits_for_all_its_workers_and_each_runs_some(
    tmp_path: Path, launcher: str
) -> None:
    proc = run_script(tmp_path, SCRIPT, launcher, job_prefix(tmp_path, "pg"), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    forecast = json.loads(proc.stdout.split("@@", 1)[1])
    rows = [line.split() for line in (tmp_path / "ran").read_text().splitlines()]
    assert len(rows) == 30 and len({b for _, b in rows}) == 30  # each sampled block once
    per_worker: dict[str, int] = {}
    for pid, _ in rows:
        per_worker[pid] = per_worker.get(pid, 0) + 1
    # all three workers ran blocks of the sample: none started before the late two were
    # there (ungated, the first worker ran all 30 in about 0.3 s, 3 s before the others)
    assert len(per_worker) == 3, per_worker
    assert min(per_worker.values()) >= 3, per_worker
    # the two late workers' start is measured, not their wait for the gate
    assert forecast["sampled"] == 30 and forecast["wall"]["estimate"] > 0
