"""Retry with more memory on the real single-node SLURM (issue 17 item 1), as a user runs
it: a script in a subprocess with ``SlurmLauncher(mem="150M")``, real batch jobs, whose
memory SLURM enforces (``JobAcctGatherParams=OverMemoryKill``, polled every 2 s, see
``.ci/slurm_setup.sh``).

One block in 20 allocates 300 MB and holds it long enough for the poll to see it: SLURM
kills its job; the block runs again in a job with a larger ``--mem`` (300M, then 600M
if 300M is not enough with the interpreter around it) and succeeds there. No other block
runs in a big job.
"""

from __future__ import annotations

from pathlib import Path

from kit.slurm import active_jobs, job_prefix, needs_slurm
from kit.user_script import check_memory_ladder, hog_script, run_script

pytestmark = needs_slurm()

SCRIPT = hog_script(
    hog_mb=300,
    hold=6,  # seen by SLURM's 2 s memory poll
    who='os.environ.get("SLURM_JOB_ID", "?")',
    grant='os.environ.get("SLURM_MEM_PER_NODE", "?")',
    launcher='bellis.SlurmLauncher(mem="150M", poll_interval=0.5, job_name_prefix=arg)',
)


def test_a_block_out_of_memory_in_its_job_succeeds_in_a_larger_job(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bm")
    proc = run_script(tmp_path, SCRIPT, prefix, name="run.py")
    _mem, report = check_memory_ladder(tmp_path, proc, 150)
    assert report["counters"]["oom_retries"] == sum(report["memory"]["retries"].values()) >= 1
    assert active_jobs(prefix) == []
