"""Workers as long-running tasks on a real ``distributed.LocalCluster`` (worker processes)."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import bellis
from kit.blocks import hang_once_block, make_task, read_records, sleep_block
from kit.launchers import run_losing_a_worker, run_two_task_pipeline

distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed")

pytestmark = [pytest.mark.dask]


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker() -> None:
    # LocalCluster's spawned processes start the stdlib's per-process resource tracker, which
    # lives as long as this process; start it before the leak check takes its snapshot
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


@pytest.fixture
def cluster() -> Iterator[tuple[Any, Any]]:
    from distributed import Client, LocalCluster

    lc = LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        # a free port: None still binds 8787, which a second test run at once holds
        dashboard_address=":0",
        scheduler_port=0,
        host="127.0.0.1",
        silence_logs=40,
    )
    client = Client(lc)
    try:
        yield lc, client
    finally:
        client.close()
        lc.close()


def test_pipeline_runs_on_dask_workers(cluster: tuple[Any, Any], tmp_path: Path) -> None:
    from bellis._launchers._dask import DaskLauncher

    _, client = cluster
    rec = tmp_path / "rec"
    rec.mkdir()
    launcher = DaskLauncher(client)
    assert launcher.is_local
    _states, records = run_two_task_pipeline(launcher, rec, 10)
    # the blocks ran in the bellis subprocesses of the dask worker processes, not here
    worker_pids = set(client.run(os.getpid).values())
    pids = {a.pid for rows in records.values() for a in rows}
    assert os.getpid() not in pids
    assert not pids & worker_pids
    # nothing of the run is left on the cluster
    assert all(not keys for keys in client.processing().values())
    assert launcher.live_task_keys() == []


def test_killed_dask_worker_is_replaced(cluster: tuple[Any, Any], tmp_path: Path) -> None:
    from bellis._launchers._dask import DaskLauncher

    lc, client = cluster
    # a spare dask worker: dask runs the killed worker's task again there at once
    lc.scale(3)
    client.wait_for_workers(3, timeout=60)
    rec = tmp_path / "rec"
    rec.mkdir()
    launcher = DaskLauncher(client)
    task = make_task(
        "k", 10, functools.partial(sleep_block, str(rec), 0.3), max_workers=2, max_retries=3
    )

    def kill_one() -> str | None:
        # kill the dask worker whose bellis subprocess is mid-block: a block started under
        # 0.15 s ago (of 0.3 s) and not done. Killing any busy dask worker could hit one whose
        # subprocess is still starting, which costs no block.
        import psutil

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            dask_pids = client.run(os.getpid)
            now = time.time()
            for rows in read_records(rec).values():
                last = rows[-1]
                if last.kind != "start" or now - last.t0 > 0.15:
                    continue
                try:
                    parent = psutil.Process(last.pid).ppid()
                except psutil.NoSuchProcess:
                    continue
                for addr, pid in dask_pids.items():
                    if pid == parent:
                        os.kill(pid, signal.SIGKILL)
                        return str(addr)
            time.sleep(0.02)
        return None

    state, _killed = run_losing_a_worker(
        task, launcher, rec, 10, kill_one, "no busy dask worker was found to kill"
    )
    assert state.first_worker_error is not None
    assert "dask worker lost" in state.first_worker_error
    # one kill costs one block one attempt: the copy dask ran again stood down instead of
    # joining under the lost worker's id (and being dropped mid-block as lost in its turn)
    assert state.failed_attempt_count == 1


def test_a_client_closed_mid_run_ends_the_run_with_a_report(
    cluster: tuple[Any, Any], tmp_path: Path
) -> None:
    from bellis._launchers._dask import DaskLauncher

    _, client = cluster
    rec = tmp_path / "rec"
    rec.mkdir()
    task = make_task(
        "c",
        40,
        functools.partial(sleep_block, str(rec), 0.1),
        max_workers=2,
        max_worker_restarts=2,
        tracking_path=str(tmp_path / "track"),
    )

    def close_when_started() -> None:
        deadline = time.monotonic() + 60
        while not any(rows for rows in read_records(rec).values()):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        client.close()

    closer = threading.Thread(target=close_when_started, daemon=True)
    closer.start()
    # the launcher loses its workers: the task uses its restart budget and is abandoned,
    # instead of a bare dask error escaping before anything was torn down or reported
    with pytest.raises(bellis.TaskAbandonedError):
        bellis.run_blockwise(task, launcher=DaskLauncher(client), progress=False, summary=False)
    closer.join()
    report = task.report()
    assert report is not None and report.outcome == "abandoned"
    assert report.counters["completed"] < 40


def test_a_launcher_reused_for_a_second_run_starts_clean(
    cluster: tuple[Any, Any], tmp_path: Path
) -> None:
    from bellis._launchers._dask import DaskLauncher

    _, client = cluster
    launcher = DaskLauncher(client)
    rec1, rec2 = tmp_path / "rec1", tmp_path / "rec2"
    rec1.mkdir()
    rec2.mkdir()
    # the same task twice, as a rerun to resume does
    first = make_task("r", 6, functools.partial(sleep_block, str(rec1), 0.0), max_workers=2)
    assert bellis.run_blockwise(first, launcher=launcher, progress=False, summary=False)
    first_token = launcher.token  # the run's dask keys and stop list are named after it
    # the second run stops one worker on a block timeout: only that one may stop
    second = make_task(
        "r",
        6,
        functools.partial(hang_once_block, str(rec2), 2),
        max_workers=2,
        timeout=1.0,
        max_worker_restarts=1,
    )
    states = bellis.run_blockwise(
        second, launcher=launcher, return_states=True, progress=False, summary=False
    )
    s = states["r"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (6, 0, 0)
    assert s.timeout_reclaim_count == 1
    assert s.worker_failure_count == 0  # the timed-out worker stopped, and no other
    # a fresh token, so a fresh stop list: the first run's closing "stop everything" is gone
    assert launcher.token != first_token
