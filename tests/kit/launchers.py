"""Scenarios every launcher runs the same way (``test_dask``, ``test_slurm``, ``test_sge``,
``test_batch_standins``): the test makes the launcher, a scenario here runs it and checks
what all launchers must do, and the test then checks what is its launcher's own (its
processes, jobs, messages). Also the launcher alone: a worker spec whose function takes no
block (it never contacts a server), such functions, and waiting for their exits."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bellis
from bellis._launchers._base import WorkerExit, WorkerHandle, WorkerSpec
from bellis._payload import WorkerPayload
from kit.blocks import (
    done_count,
    done_ids,
    make_task,
    read_records,
    sleep_block,
    slow_first_attempt,
)


def run_two_task_pipeline(
    launcher: Any, rec: Path, n: int, *, context: int = 0
) -> tuple[dict[str, Any], dict[Any, Any]]:
    """Run two independent tasks of ``n`` blocks each, ``a`` and ``b`` (whose blocks read
    ``context`` beyond their write Roi on each side), on ``launcher``, two workers each;
    check that every block ran once and no worker failed. The states and the records."""
    fn = functools.partial(sleep_block, str(rec), 0.0)
    a = make_task("a", n, fn, max_workers=2)
    b = bellis.Task(
        "b",
        bellis.Roi((-context,), (10 * n + 2 * context,)),
        bellis.Roi((-context,), (10 + 2 * context,)),
        bellis.Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=2,
    )
    states = bellis.run_blockwise(
        a + b, launcher=launcher, return_states=True, progress=False, summary=False
    )
    records = read_records(rec)
    for t in ("a", "b"):
        assert states[t].completed_count == n
        assert states[t].worker_failure_count == 0
        assert len(done_ids(records, t)) == n
        assert all(done_count(records, t, sid) == 1 for sid in done_ids(records, t))
    assert done_ids(records, "a") == list(range(n))
    if context == 0:
        assert done_ids(records, "b") == list(range(n))
    return states, records


def run_losing_a_worker(
    task: Any, launcher: Any, rec: Path, n: int, lose: Callable[[], str | None], missing: str
) -> tuple[Any, str]:
    """Run ``task`` (``n`` blocks recorded in ``rec``) on ``launcher`` while ``lose``, in a
    thread, takes one busy worker away (a killed process, a cancelled job) and says which
    (None: it found none, ``missing`` says what it looked for). Check that the run lost a
    worker and still completed every block; the task's state and what ``lose`` took."""
    lost: list[str | None] = []
    thread = threading.Thread(target=lambda: lost.append(lose()))
    thread.start()
    try:
        states = bellis.run_blockwise(
            task, launcher=launcher, return_states=True, progress=False, summary=False
        )
    finally:
        thread.join()
    assert lost and lost[0] is not None, missing
    state = states[task.task_id]
    assert state.completed_count == n
    assert state.failed_count == 0
    assert state.worker_failure_count >= 1
    assert done_ids(read_records(rec), task.task_id) == list(range(n))
    return state, lost[0]


def run_cancelling_a_job(
    launcher: Any,
    tmp_path: Path,
    system: str,
    running: Callable[[], list[str]],
    cancel: list[str],
    *,
    seconds: float = 60,
    pause: float = 0.2,
) -> tuple[Any, str]:
    """:func:`run_losing_a_worker` with 8 blocks of 1 s on 2 workers, where the worker lost
    is a job cancelled with the command ``cancel`` (it takes the job id) once a block has
    run: the first of ``running``, the ids of the test's running jobs, polled every
    ``pause`` seconds for up to ``seconds``. Check that the run says which ``system`` job
    was cancelled; the task's state and that job's id."""
    rec = tmp_path / "rec"
    rec.mkdir()
    task = make_task(
        "s", 8, functools.partial(sleep_block, str(rec), 1.0), max_workers=2, max_retries=3
    )

    def cancel_one() -> str | None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ids = running()
            if ids and any(rec.iterdir()):
                subprocess.run([*cancel, ids[0]], check=True, timeout=30, capture_output=True)
                return ids[0]
            time.sleep(pause)
        return None

    state, job_id = run_losing_a_worker(
        task, launcher, rec, 8, cancel_one, "no running job was found to cancel"
    )
    assert state.first_worker_error is not None
    assert f"{system} job {job_id} " in state.first_worker_error
    assert "was cancelled" in state.first_worker_error
    return state, job_id


def run_walltime_handover(launcher: Any, tmp_path: Path) -> dict[str, int]:
    """Run 80 blocks of 1 s on 2 workers on ``launcher`` (whose time limit is shorter than
    the run): check that every job's worker left before its limit (exit kind
    ``walltime``, its marker in its log) and new jobs took over until the blocks were
    done, with no job killed and no restart spent. The workers' exits by kind."""
    from bellis._worker._walltime import LEAVING_MARKER

    rec = tmp_path / "rec"
    rec.mkdir()
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
    exits: dict[str, int] = task.report().workers.exits
    assert exits.get("walltime", 0) >= 2, exits
    logs = "".join(p.read_text() for p in (tmp_path / "logs" / "wt").glob("worker_*.err"))
    assert logs.count(LEAVING_MARKER) == exits["walltime"]
    return exits


def run_time_limit_kill(launcher: Any, tmp_path: Path, seconds: float) -> tuple[Any, Any]:
    """Run 3 blocks on one worker on ``launcher`` (a short time limit), block 0 sleeping
    ``seconds``, past the limit, on its first attempt: check that the job killed at its
    limit is the run's one worker failure, reported as a block that ran longer than the
    job time limit, and that the block ran again and every block is done. The task and
    its state."""
    rec = tmp_path / "rec"
    rec.mkdir()
    task = make_task(
        "t",
        3,
        functools.partial(slow_first_attempt, str(rec), seconds),
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
    assert done_ids(read_records(rec), "t") == [0, 1, 2]
    return task, s


# -- the launcher alone: workers whose function takes no block never contact a server ---------


def standalone_spec(tmp_path: Path, worker_id: int, fn: Any, **kwargs: Any) -> WorkerSpec:
    """A spec of task ``solo`` whose worker runs ``fn()`` (no block), with its logs
    ``w<worker_id>.out``/``.err`` in ``tmp_path / "logs"``."""
    import cloudpickle

    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    payload = WorkerPayload(
        function=cloudpickle.dumps(fn),
        arity=0,
        sys_path=tuple(p for p in sys.path if p),
        log_settings={},
    ).to_bytes()
    env = dict(os.environ)
    return WorkerSpec(
        task_id="solo",
        worker_id=worker_id,
        env=env,
        payload=payload,
        out_path=logs / f"w{worker_id}.out",
        err_path=logs / f"w{worker_id}.err",
        **kwargs,
    )


def exit_three() -> None:
    print("about to fail", file=sys.stderr, flush=True)
    sys.exit(3)


def sleep_long() -> None:
    time.sleep(120)


def hog_memory(mb: int) -> None:
    """Touch ``mb`` megabytes (resident, not only reserved) and hold them for 30 s."""
    hog = bytearray(mb * 1024 * 1024)
    for i in range(0, len(hog), 4096):
        hog[i] = 1
    time.sleep(30)


def wait_for_exit(launcher: Any, handles: list[WorkerHandle], seconds: float) -> list[WorkerExit]:
    """The exits of ``handles``, polled on ``launcher``; all must come within ``seconds``."""
    deadline = time.monotonic() + seconds
    exits: list[WorkerExit | None] = [None] * len(handles)
    while time.monotonic() < deadline and any(e is None for e in exits):
        exits = [launcher.poll(h) for h in handles]
        time.sleep(0.1)
    assert all(e is not None for e in exits), f"jobs did not finish in {seconds}s"
    return [e for e in exits if e is not None]
