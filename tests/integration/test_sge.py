"""Workers as real Grid Engine jobs on the single-node CI queue (``.ci/sge_setup.sh``,
Debian's gridengine 8.1.9): the scenarios the SLURM tests run, on the batch core's SGE
dialect. A pipeline, a job killed mid-run, the memory ladder under ``h_vmem``, workers
leaving before ``h_rt``, and teardown with no job left behind."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import bellis
from bellis._launchers._base import WorkerExit, WorkerHandle, WorkerSpec
from kit.blocks import done_ids, make_task, read_records, sleep_block
from kit.launchers import run_losing_a_worker, run_two_task_pipeline
from kit.sge import accounting, active_jobs, needs_sge
from kit.slurm import job_prefix

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
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "gk")
    launcher = _launcher(prefix)
    task = make_task(
        "s", 8, functools.partial(sleep_block, str(rec), 1.0), max_workers=2, max_retries=3
    )

    def delete_one() -> str | None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            running = [j for j in active_jobs(prefix) if j[1] == "r"]
            if running and any(rec.iterdir()):
                subprocess.run(["qdel", running[0][0]], check=True, timeout=30)
                return running[0][0]
            time.sleep(0.2)
        return None

    state, deleted = run_losing_a_worker(
        task, launcher, rec, 8, delete_one, "no running job was found to delete"
    )
    assert state.first_worker_error is not None
    assert f"Grid Engine job {deleted} " in state.first_worker_error
    assert "was cancelled" in state.first_worker_error
    assert _drained(prefix) == []
    (record,) = accounting(deleted)
    assert record["exit_status"].split()[0] in ("137", "143"), record


def _standalone_spec(tmp_path: Path, worker_id: int, fn: Any, **kwargs: Any) -> WorkerSpec:
    import cloudpickle

    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    payload = cloudpickle.dumps(
        {"function": fn, "arity": 0, "sys_path": [p for p in sys.path if p], "log_settings": {}}
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return WorkerSpec(
        task_id="solo",
        worker_id=worker_id,
        env=env,
        payload=payload,
        out_path=logs / f"w{worker_id}.out",
        err_path=logs / f"w{worker_id}.err",
        **kwargs,
    )


def _exit_three() -> None:
    print("about to fail", file=sys.stderr, flush=True)
    sys.exit(3)


def _sleep_long() -> None:
    time.sleep(120)


def _wait_for_exit(launcher: Any, handles: list[WorkerHandle], seconds: float) -> list[WorkerExit]:
    deadline = time.monotonic() + seconds
    exits: list[WorkerExit | None] = [None] * len(handles)
    while time.monotonic() < deadline and any(e is None for e in exits):
        exits = [launcher.poll(h) for h in handles]
        time.sleep(0.1)
    assert all(e is not None for e in exits), f"jobs did not finish in {seconds}s"
    return [e for e in exits if e is not None]


def test_an_exit_code_is_read_from_the_accounting(tmp_path: Path) -> None:
    launcher = _launcher(job_prefix(tmp_path, "gx"))
    try:
        handle = launcher.launch(_standalone_spec(tmp_path, 0, _exit_three))
        (ex,) = _wait_for_exit(launcher, [handle], 90)
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
        [_standalone_spec(tmp_path, i, _sleep_long, slot=i) for i in range(4)]
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


MEMORY_SCRIPT = """
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
        data = bytearray(500 * 2**20)
        for i in range(0, len(data), 4096):
            data[i] = 1
    job = f"{os.environ.get('JOB_ID')}-{os.environ.get('SGE_TASK_ID')}"
    mem = int(os.environ["BELLIS_MEMORY_LIMIT"]) // 2**20
    (HERE / "records" / f"{sid}_{job}").write_text(str(mem))


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
    launcher = bellis.SgeLauncher(mem="400M", poll_interval=0.5, job_name_prefix=prefix)
    ok = bellis.run_blockwise([task], launcher=launcher, progress=False)
    report = task.report()
    (HERE / "result.json").write_text(json.dumps({"ok": ok, "report": report.to_json()}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
"""


def test_a_block_over_h_vmem_succeeds_in_a_larger_job(tmp_path: Path) -> None:
    from kit.user_script import grant_records, ran_alone, run_script

    prefix = job_prefix(tmp_path, "gm")
    proc = run_script(tmp_path, MEMORY_SCRIPT, prefix, name="run.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = grant_records(tmp_path)
    assert sorted(records) == list(range(20))
    _big_job, mem = ran_alone(records, 7, 400)
    assert mem in (800, 1600)
    assert "block t/7 ran out of memory with 400M; it runs again on a worker with 800M" in (
        proc.stderr
    )
    report = json.loads((tmp_path / "result.json").read_text())["report"]
    assert report["memory"]["succeeded"] == {f"{mem}M": 1}
    assert _drained(prefix) == []


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_workers_leave_before_h_rt_and_are_replaced(tmp_path: Path) -> None:
    from bellis._worker._walltime import LEAVING_MARKER

    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "gw")
    # a 40 s h_rt and 80 blocks of 1 s on 2 workers: every job leaves before its limit
    launcher = _launcher(prefix, time_limit="00:00:40", walltime_margin=12)
    task = make_task(
        "wt",
        80,
        functools.partial(sleep_block, str(rec), 1.0),
        max_workers=2,
        max_worker_restarts=0,
        max_retries=0,
    )
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    s = states["wt"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (80, 0, 0)
    assert s.worker_failure_count == 0 and s.worker_restart_count == 0
    assert done_ids(read_records(rec), "wt") == list(range(80))
    exits = task.report().workers.exits
    assert exits.get("walltime", 0) >= 2, exits
    logs = "".join(p.read_text() for p in (tmp_path / "logs" / "wt").glob("worker_*.err"))
    assert logs.count(LEAVING_MARKER) == exits["walltime"]
    for job_id in launcher._jobs:
        (record,) = accounting(job_id)
        assert (record["failed"], record["exit_status"].split()[0]) == ("0", "0"), record
    assert _drained(prefix) == []


def _slow_first_attempt(recdir: str, block: bellis.Block) -> None:
    marker = Path(recdir) / "slept"
    if block.block_id[1] == 0 and not marker.exists():
        marker.touch()
        time.sleep(120)
    sleep_block(recdir, 0.0, block)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_job_killed_at_h_rt_is_reported_and_its_block_retried(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    prefix = job_prefix(tmp_path, "gt")
    launcher = _launcher(prefix, time_limit="00:00:30")
    task = make_task(
        "t",
        3,
        functools.partial(_slow_first_attempt, str(rec)),
        max_workers=1,
        max_retries=2,
        max_worker_restarts=2,
    )
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    s = states["t"]
    assert s.completed_count == 3 and s.worker_failure_count == 1
    assert s.first_worker_error is not None
    assert "a block ran longer than the job time limit" in s.first_worker_error
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
        scheduler_options={"host": "127.0.0.1", "dashboard_address": None},
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
