"""Issue 35, item 8: a worker process that opens several clients is one worker.

volara-ml's ``Predict`` opens a ``daisy.Client()`` in each worker only to read its
``worker_id``, and volara's worker loop then opens a second client that takes the blocks.
bellis used to serve the second connection as an unmanaged client: the worker that did the
blocks was charged to the restart budget as one that "exited without processing a block",
and the resource table showed no block for it. Blocks, exits and the budget are counted per
worker process, whatever number of connections it opens.

A driver script (the public API, ``import bellis as daisy``) runs in a subprocess: a
pipeline of three chained tasks whose worker functions each open a first client, read its
``worker_id``, then loop on a second client. ``max_worker_restarts=0``, so one charged
start is visible in the counters and, where a replacement is needed, abandons the task.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.slurm import active_jobs, job_prefix, needs_slurm

N = 12  # blocks per task

DRIVER = r"""
N = 12
import json
import os
import sys

import bellis as daisy
from bellis import Roi

out, track, first_client, per_worker = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
prefix = sys.argv[5]  # "": local workers; else SLURM jobs named with this prefix
launcher = None if not prefix else daisy.SlurmLauncher(job_name_prefix=prefix, poll_interval=1.0)


def record(task_id, block, worker_id):
    begin = block.write_roi.begin[0]
    line = f"{task_id} {begin} {os.getpid()} {worker_id}\n"
    fd = os.open(os.path.join(out, "blocks.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    # the block's output: a file whose bytes say which block and task wrote it
    with open(os.path.join(out, f"{task_id}-{begin}.out"), "w") as f:
        f.write(f"{task_id}:{begin}:{block.write_roi.end[0]}")


def worker():
    first = daisy.Client()  # only to read the worker id, as volara-ml's Predict does
    worker_id = first.worker_id
    if first_client == "closed":
        first.close()  # closed before the second client takes blocks
    second = daisy.Client()
    task_id = second.task_id
    done = 0
    while per_worker == 0 or done < per_worker:
        with second.acquire_block() as block:
            if block is None:
                break
            record(task_id, block, worker_id)
        done += 1
    # the first client (if still open) closes at exit; with blocks left, when per_worker
    # ends the loop early: a new worker takes over


tasks = []
for name in ("a", "b", "c"):
    tasks.append(
        daisy.Task(
            name,
            total_roi=Roi((0,), (N,)),
            read_roi=Roi((0,), (1,)),
            write_roi=Roi((0,), (1,)),
            process_function=worker,
            read_write_conflict=False,
            max_workers=2,
            max_worker_restarts=0,
            tracking_path=os.path.join(track, name),
            resource_tracking=True,
        )
    )
# chained: every block of b reads a's block at its place, c reads b's
ok = daisy.run_blockwise(
    tasks[0] + tasks[1] + tasks[2], launcher=launcher, progress=False, summary=False
)
result = {"ok": ok}
for t in tasks:
    rep = t.report()
    result[t.task_id] = {
        "outcome": rep.outcome,
        "counters": rep.counters,
        "unmanaged": rep.workers.unmanaged_clients,
        "exits": rep.workers.exits,
        "blocks": {str(r.worker_id): r.blocks for r in rep.workers.records},
    }
print("RESULT " + json.dumps(result))
"""


@pytest.mark.parametrize(
    "launcher", ["local", pytest.param("slurm", marks=needs_slurm())], ids=["local", "slurm"]
)
@pytest.mark.parametrize("per_worker", [0, 2], ids=["loop-to-the-end", "blocks-left-at-exit"])
@pytest.mark.parametrize("first_client", ["open", "closed"])
def test_a_worker_with_two_clients_is_one_worker(
    tmp_path: Path, first_client: str, per_worker: int, launcher: str
) -> None:
    prefix = "" if launcher == "local" else job_prefix(tmp_path, "tc")
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    cmd = [sys.executable, str(script), str(out), str(tmp_path / "track"), first_client]
    try:
        proc = subprocess.run(
            [*cmd, str(per_worker), prefix],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        if prefix:
            assert active_jobs(prefix) == []  # every job of the run ended with it
    finally:
        for job_id, _state, _name in active_jobs(prefix) if prefix else []:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "exited without processing a block" not in proc.stderr, proc.stderr
    assert "restart budget" not in proc.stderr and "abandon" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["ok"] is True, result
    # every block of every task ran once, and wrote its output
    rows = [ln.split() for ln in (out / "blocks.txt").read_text().splitlines()]
    for name in ("a", "b", "c"):
        mine = [r for r in rows if r[0] == name]
        assert sorted(int(r[1]) for r in mine) == list(range(N)), (name, mine)
        for i in range(N):
            text = (out / f"{name}-{i}.out").read_text()
            assert text == f"{name}:{i}:{i + 1}", text
        got = result[name]
        assert got["outcome"] == "completed", got
        assert got["unmanaged"] == 0, got
        assert got["counters"]["worker_restarts"] == 0, got
        assert got["counters"]["worker_failures"] == 0, got
        # one exit per worker process, clean, whatever number of clients it opened
        assert got["exits"] == {"clean": got["counters"]["worker_starts"]}, got
        # the resource table's blocks per worker are those the worker's process recorded
        by_worker: dict[str, int] = {}
        for r in mine:
            by_worker[r[3]] = by_worker.get(r[3], 0) + 1
        assert {k: v for k, v in got["blocks"].items() if v} == by_worker, (got, by_worker)
        assert sum(got["blocks"].values()) == N
        if per_worker:
            # each worker left after at most 2 blocks, with blocks left: at least 6
            # starts, none of them charged (max_worker_restarts=0)
            assert max(by_worker.values()) <= per_worker, by_worker
            assert got["counters"]["worker_starts"] >= N // per_worker, got
