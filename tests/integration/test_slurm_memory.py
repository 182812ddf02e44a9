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

import json
from pathlib import Path

from kit.slurm import active_jobs, job_prefix, needs_slurm
from kit.user_script import grant_records, ran_alone, run_script

pytestmark = needs_slurm()

SCRIPT = """
import json
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
HOG = 7


def block_fn(block):
    sid = block.block_id[1]
    if sid == HOG:
        data = bytearray(300 * 2**20)
        for i in range(0, len(data), 4096):
            data[i] = 1  # resident, not only reserved
        time.sleep(6)  # seen by SLURM's 2 s memory poll
    job = os.environ.get("SLURM_JOB_ID", "?")
    mem = os.environ.get("SLURM_MEM_PER_NODE", "?")
    (HERE / "records" / f"{sid}_{job}").write_text(mem)


def main():
    prefix = sys.argv[1]
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    (HERE / "records").mkdir()
    task = bellis.Task(
        "t",
        total_roi=Roi((0,), (20,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=block_fn,
        read_write_conflict=False,
        max_workers=2,
    )
    launcher = bellis.SlurmLauncher(mem="150M", poll_interval=0.5, job_name_prefix=prefix)
    ok = bellis.run_blockwise([task], launcher=launcher, progress=False)
    report = task.report()
    (HERE / "result.json").write_text(json.dumps({"ok": ok, "report": report.to_json()}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
"""


def test_a_block_out_of_memory_in_its_job_succeeds_in_a_larger_job(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "bm")
    proc = run_script(tmp_path, SCRIPT, prefix, name="run.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = grant_records(tmp_path)
    assert sorted(records) == list(range(20))
    _big_job, mem = ran_alone(records, 7, 150)
    assert mem in (300, 600)
    assert "block t/7 ran out of memory with 150M; it runs again on a worker with 300M" in (
        proc.stderr
    )
    report = json.loads((tmp_path / "result.json").read_text())["report"]
    grant = f"{mem}M"
    assert report["memory"]["succeeded"] == {grant: 1}
    assert report["counters"]["oom_retries"] == sum(report["memory"]["retries"].values()) >= 1
    assert active_jobs(prefix) == []
