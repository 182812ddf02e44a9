"""Workers as real Grid Engine jobs on the single-node CI queue (``.ci/sge_setup.sh``,
Debian's gridengine 8.1.9): the scenarios the SLURM tests run, on the batch core's SGE
dialect. A pipeline, a job killed mid-run, the memory ladder under ``h_vmem``, workers
leaving before ``h_rt``, and teardown with no job left behind."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import bellis
from kit.launchers import (
    exit_three,
    run_cancelling_a_job,
    run_time_limit_kill,
    run_two_task_pipeline,
    run_walltime_handover,
    sleep_long,
    standalone_spec,
    wait_for_exit,
)
from kit.sge import accounting, active_jobs, needs_sge
from kit.slurm import job_prefix
from kit.user_script import check_memory_ladder, hog_script, run_script

pytestmark = needs_sge()


def _launcher(prefix: str, **kwargs: Any) -> bellis.SgeLauncher:
    kwargs.setdefault("poll_interval", 0.5)
    return bellis.SgeLauncher(job_name_prefix=prefix, **kwargs)


def _drained(prefix: str, seconds: float = 60.0) -> list[tuple[str, str, str]]:
    deadline = time.monotonic() + seconds
    while (left := active_jobs(prefix)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_pipeline_runs_as_grid_engine_jobs(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "gp")
    launcher = _launcher(prefix, array_threshold=2)
    run_two_task_pipeline(launcher, rec, 12, context=10)
    assert launcher.live_job_ids() == []
    assert _drained(prefix) == []
    ids = list(launcher._jobs)
    assert len(ids) == 4
    for job_id in ids:
        (record,) = accounting(job_id)
        assert (record["failed"], record["exit_status"].split()[0]) == ("0", "0"), record
        assert record["jobname"].startswith(f"{prefix}-bellis-")
    logs = tmp_path / "logs"
    assert list(logs.rglob("*.payload")) == []
    assert all(p.stat().st_mode & 0o077 == 0 for p in logs.rglob("*.sge"))


def test_a_deleted_job_is_replaced(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "gk")

    def running() -> list[str]:
        return [j[0] for j in active_jobs(prefix) if j[1] == "r"]

    _state, deleted = run_cancelling_a_job(
        _launcher(prefix), tmp_path, "Grid Engine", running, ["qdel"], seconds=90
    )
    assert _drained(prefix) == []
    (record,) = accounting(deleted)
    assert record["exit_status"].split()[0] in ("137", "143"), record


def test_an_exit_code_is_read_from_the_accounting(tmp_path: Path) -> None:
    launcher = _launcher(job_prefix(tmp_path, "gx"))
    try:
        handle = launcher.launch(standalone_spec(tmp_path, 0, exit_three))
        (ex,) = wait_for_exit(launcher, [handle], 90)
    finally:
        launcher.close()
    assert (ex.kind, ex.code) == ("error", 3)
    assert "exited with code 3" in ex.message and "about to fail" in ex.message
    (record,) = accounting(handle.native.job_id)
    assert record["exit_status"].split()[0] == "3"


def test_close_deletes_running_jobs(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "gc")
    launcher = _launcher(prefix)
    handles = launcher.launch_many(
        [standalone_spec(tmp_path, i, sleep_long, slot=i) for i in range(4)]
    )
    deadline = time.monotonic() + 60
    while not any(j[1] == "r" for j in active_jobs(prefix)):
        assert time.monotonic() < deadline, "no job started"
        time.sleep(0.2)
    # four workers started together: one array, tasks 1-4 (Grid Engine counts from 1)
    number = handles[0].native.job_id.split(".")[0]
    assert [h.native.job_id for h in handles] == [f"{number}.{i}" for i in range(1, 5)]
    launcher.close()
    assert launcher.live_job_ids() == []
    assert _drained(prefix, 30.0) == []
    assert all(h.native.exit is not None for h in handles)
    assert list((tmp_path / "logs").rglob("*.payload")) == []


MEMORY_SCRIPT = hog_script(
    hog_mb=500,
    who="f\"{os.environ.get('JOB_ID')}-{os.environ.get('SGE_TASK_ID')}\"",
    grant='int(os.environ["BELLIS_MEMORY_LIMIT"]) // 2**20',
    launcher='bellis.SgeLauncher(mem="400M", poll_interval=0.5, job_name_prefix=arg)',
)


def test_a_block_over_h_vmem_succeeds_in_a_larger_job(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "gm")
    proc = run_script(tmp_path, MEMORY_SCRIPT, prefix, name="run.py")
    check_memory_ladder(tmp_path, proc, 400)
    assert _drained(prefix) == []


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_workers_leave_before_h_rt_and_are_replaced(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "gw")
    # a 40 s h_rt and 80 blocks of 1 s on 2 workers: every job leaves before its limit
    launcher = _launcher(prefix, time_limit="00:00:40", walltime_margin=12)
    run_walltime_handover(launcher, tmp_path)
    for job_id in launcher._jobs:
        (record,) = accounting(job_id)
        assert (record["failed"], record["exit_status"].split()[0]) == ("0", "0"), record
    assert _drained(prefix) == []


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_job_killed_at_h_rt_is_reported_and_its_block_retried(tmp_path: Path) -> None:
    prefix = job_prefix(tmp_path, "gt")
    launcher = _launcher(prefix, time_limit="00:00:30")
    run_time_limit_kill(launcher, tmp_path, 120)
    assert _drained(prefix) == []


@pytest.mark.dask
@pytest.mark.timeout(400)
def test_dask_jobqueue_sge_cluster_runs_a_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other route: ``DaskLauncher`` over dask-jobqueue's ``SGECluster`` on the same
    Grid Engine. Its jobs are dask workers, each hosting bellis workers as subprocesses."""
    jobqueue = pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed")
    from distributed import Client

    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "gd")
    # the jobs take this environment (-V): the test's modules are importable there
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    cluster = jobqueue.SGECluster(
        cores=2,
        processes=1,
        memory="2GB",
        queue="all.q",
        walltime="00:10:00",
        job_name=prefix,
        python=sys.executable,
        job_extra_directives=["-V"],
        log_directory=str(tmp_path / "dask-logs"),
        scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
        worker_extra_args=["--host", "127.0.0.1"],
    )
    try:
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=180)
            assert len(active_jobs(prefix)) == 2
            run_two_task_pipeline(bellis.DaskLauncher(client), rec, 8)
    finally:
        cluster.close()
    assert _drained(prefix) == []
