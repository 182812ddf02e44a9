"""Scenarios every launcher runs the same way (``test_dask``, ``test_slurm``): the test
makes the launcher, a scenario here runs it and checks what all launchers must do, and
the test then checks what is its launcher's own (its processes, jobs, messages)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bellis
from kit.blocks import done_count, done_ids, make_task, read_records, sleep_block


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
