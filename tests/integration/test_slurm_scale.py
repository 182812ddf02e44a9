"""Many SLURM workers, and workers that leave before their job's time limit, on the
single-node CI cluster (``.ci/slurm_setup.sh``; its ``oversub`` partition lets one CPU
hold many jobs). The SLURM commands on PATH are wrapped to count their calls."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

import bellis
from bellis._launchers._slurm import SlurmLauncher
from kit.blocks import done_count, done_ids, make_task, read_records, sleep_block
from kit.slurm import (
    active_jobs,
    drained,
    job_prefix,
    jobs_named,
    needs_slurm,
    oversub_partition,
    wrap_commands,
)

pytestmark = needs_slurm()

_COMMANDS = ("sbatch", "squeue", "scontrol", "scancel")


def _count_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put counting wrappers of the SLURM commands first on PATH: each call appends one
    line, ``<command> <args>``, to the returned file, then runs the real command."""
    log = tmp_path / "slurm-calls"
    wrap_commands(
        tmp_path, monkeypatch, {name: f'echo "{name} $*" >> {log}\n' for name in _COMMANDS}
    )
    return log


def _calls(log: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {name: [] for name in _COMMANDS}
    for line in log.read_text().splitlines() if log.exists() else []:
        name, _, args = line.partition(" ")
        out[name].append(args)
    return out


def _squeue_ids(args: str) -> list[str]:
    words = args.split()
    return words[words.index("-j") + 1].split(",") if "-j" in words else []


def _array_size(args: str) -> int:
    """How many jobs one sbatch call submitted: its ``--array=`` list's size, else 1."""
    for word in args.split():
        if word.startswith("--array="):
            n = 0
            for part in word.removeprefix("--array=").split("%")[0].split(","):
                lo, _, hi = part.partition("-")
                n += int(hi or lo) - int(lo) + 1
            return n
    return 1


N_WORKERS = 200
N_BLOCKS = 2000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_hundred_workers_start_as_one_array_and_are_polled_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = oversub_partition()
    if partition is None:
        pytest.skip("no 'oversub' partition (see .ci/slurm_setup.sh): 200 jobs need one")
    log = _count_calls(tmp_path, monkeypatch)
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bs")
    launcher = SlurmLauncher(
        job_name_prefix=prefix, partition=partition, mem="100M", poll_interval=1.0
    )
    task = make_task(
        "many", N_BLOCKS, functools.partial(sleep_block, str(rec), 0.01), max_workers=N_WORKERS
    )
    t0 = time.monotonic()
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    polls = (time.monotonic() - t0) / 1.0 + 1  # at most one poll per poll_interval
    state = states["many"]
    records = read_records(rec)
    assert (state.completed_count, state.failed_count, state.orphaned_count) == (N_BLOCKS, 0, 0)
    assert done_ids(records, "many") == list(range(N_BLOCKS))
    assert all(done_count(records, "many", sid) == 1 for sid in range(N_BLOCKS))
    calls = _calls(log)
    # the 200 workers went as one array job; any further sbatch replaced workers that
    # failed (on a loaded node some do): one job each, or several as one array
    first, *replacing = calls["sbatch"]
    assert f"--array=0-{N_WORKERS - 1} " in first, calls["sbatch"]
    replaced = sum(_array_size(a) for a in replacing)
    assert replaced <= state.worker_failure_count, (calls["sbatch"], state.worker_failure_count)
    assert state.worker_start_count == N_WORKERS + replaced
    # one squeue call per poll for all jobs (the array by its id), never one per job ...
    # (polling job by job would make N_WORKERS calls per poll; the bound is the run's own
    # length in polls, so a slow, loaded run does not break it)
    assert 0 < len(calls["squeue"]) <= 3 * polls + 10, (len(calls["squeue"]), polls)
    assert all(len(_squeue_ids(a)) <= len(calls["sbatch"]) for a in calls["squeue"]), calls
    # ... and their exit codes come with it: scontrol only read the array size limit
    assert [a for a in calls["scontrol"] if a != "show config"] == []
    report = task.report()
    assert sum(report.workers.exits.values()) == state.worker_start_count
    # every job was cancelled or ended; on this overloaded node SLURM itself may still be
    # tearing some down (COMPLETING for a minute after a failed launch)
    assert drained(prefix, 180.0, each_array_task=True) == []
    # the blocks went round: many workers, in many jobs, did some
    pids = {a.pid for rows in records.values() for a in rows if a.kind == "done"}
    assert len(pids) > 10


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_workers_leave_before_their_job_time_limit_and_are_replaced(tmp_path: Path) -> None:
    from bellis._worker._walltime import LEAVING_MARKER

    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "bs")
    # a one-minute limit and 2 s blocks: 64 blocks on 2 workers outlast one job each
    launcher = SlurmLauncher(
        job_name_prefix=prefix, time_limit=1, walltime_margin=15, poll_interval=1.0
    )
    # no restarts at all: leaving for the time limit must not spend any
    task = make_task(
        "wt",
        64,
        functools.partial(sleep_block, str(rec), 2.0),
        max_workers=2,
        max_worker_restarts=0,
        max_retries=0,
    )
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    state = states["wt"]
    assert (state.completed_count, state.failed_count, state.orphaned_count) == (64, 0, 0)
    assert state.worker_failure_count == 0 and state.worker_restart_count == 0
    records = read_records(rec)
    assert done_ids(records, "wt") == list(range(64))
    # no block was cut off: each ran once, to its end
    assert all(len(records[("wt", sid)]) == 2 for sid in range(64))
    jobs = jobs_named(prefix, each_array_task=True)
    # no job reached its limit; the first two left before it and were replaced
    assert {s for _, s, _ in jobs} == {"COMPLETED"}, jobs
    assert len(jobs) == state.worker_start_count >= 3
    exits = task.report().workers.exits
    assert exits.get("walltime", 0) >= 2 and sum(exits.values()) == len(jobs), exits
    logs = "".join(p.read_text() for p in (tmp_path / "logs" / "wt").glob("worker_*.err"))
    assert logs.count(LEAVING_MARKER) == exits["walltime"]
    assert "replacing worker 0, which left before its job time limit" in logs
    # every job script says when its job started, for its worker to know when it ends
    script = (tmp_path / "logs" / "wt" / "worker_0.sbatch").read_text()
    assert "BELLIS_JOB_STARTED=$(date +%s)" in script and "BELLIS_JOB_TIME_LIMIT=60 " in script
    assert active_jobs(prefix, each_array_task=True) == []
