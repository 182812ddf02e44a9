"""The broken-function rule (``Task(max_consecutive_failures=...)``), the order a resume
runs its blocks in, and what an abandonment says: scripted against the scheduler, no
process, socket or clock (issue 35 item 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import bellis
from bellis._scheduling._abandon import FailureStreak, describe, is_broken_reason
from bellis._scheduling._scheduler import Scheduler
from bellis._scheduling._task_run import TaskRun
from bellis._tracking import StoreLayout, TrackingStore
from bellis.errors import ConfigurationError


def task(n: int = 30, **kw: Any) -> bellis.Task:
    one = bellis.Roi((0,), (1,))
    kw.setdefault("max_retries", 1)
    return bellis.Task(
        "t",
        total_roi=bellis.Roi((0,), (n,)),
        read_roi=one,
        write_roi=one,
        process_function=lambda b: None,
        **kw,
    )


def step(s: Scheduler, ok: bool) -> int:
    """Hand out the next block and return it as ``ok`` (-1: none was ready)."""
    run = s.runs[0]
    k = s.acquire_index(run)
    if k >= 0:
        s.release_index(run, k, ok)
    return k


def run_of(s: Scheduler) -> TaskRun:
    return s.runs[0]


# -- the streak, alone ----------------------------------------------------------------


def test_the_streak_counts_first_failures_of_blocks_never_failed_before() -> None:
    streak = FailureStreak(3)
    assert not streak.failed(True, False)
    assert not streak.failed(False, False)  # a retry: not counted
    assert not streak.failed(True, True)  # failed in an earlier run: not counted
    assert not streak.failed(True, False)
    streak.succeeded()
    assert streak.count == 0
    assert [streak.failed(True, False) for _ in range(3)] == [False, False, True]


# -- scripted against the scheduler -----------------------------------------------------


def test_blocks_failing_in_a_row_abandon_the_task_with_the_rule_named() -> None:
    s = Scheduler(task(30))
    for _ in range(9):
        step(s, False)
    assert not s.task_states["t"].abandoned
    step(s, False)
    state = s.task_states["t"]
    assert state.abandoned and state.abandon_reason == "10 blocks failed in a row"
    assert is_broken_reason(state.abandon_reason)
    assert state.failed_attempt_count == 10 and state.completed_count == 0
    assert s.acquire_index(run_of(s)) == -1  # nothing more is handed out
    said = describe(run_of(s))
    assert (said["lost"], said["untried"], said["can_progress"]) == (30, 20, True)
    assert "Task(max_consecutive_failures=10)" in said["rule"]
    assert said["option"].startswith("Task(max_consecutive_failures=...)")
    assert "never tried first" in said["rerun"]


def test_a_done_block_resets_the_count() -> None:
    s = Scheduler(task(40))
    for ok in [False] * 9 + [True] + [False] * 9 + [True] + [False] * 9:
        step(s, ok)
    assert not s.task_states["t"].abandoned


def test_retries_of_a_block_neither_count_nor_reset() -> None:
    # max_retries=1: the retries come after the roots (the FIFO), and there fail for good
    s = Scheduler(task(25, max_consecutive_failures=3))
    outcomes = [False, False, True, False, False, True]
    for ok in outcomes:
        step(s, ok)
    assert not s.task_states["t"].abandoned
    # the rest of the roots succeed; then the 4 retries fail: not counted
    for _ in range(19):
        step(s, True)
    for _ in range(4):
        assert step(s, False) >= 0
    state = s.task_states["t"]
    assert not state.abandoned
    assert (state.completed_count, state.failed_count) == (21, 4)


def test_none_turns_the_rule_off() -> None:
    s = Scheduler(task(30, max_retries=0, max_consecutive_failures=None))
    while step(s, False) >= 0:
        pass
    state = s.task_states["t"]
    assert not state.abandoned and state.failed_count == 30


def test_the_rule_abandons_downstream_tasks_too() -> None:
    one = bellis.Roi((0,), (1,))
    up = task(12, max_consecutive_failures=2)
    down = bellis.Task(
        "d",
        total_roi=bellis.Roi((0,), (12,)),
        read_roi=one,
        write_roi=one,
        process_function=lambda b: None,
    )
    s = Scheduler(up + down)
    step(s, False)
    step(s, False)
    states = s.task_states
    assert states["t"].abandon_reason == "2 blocks failed in a row"
    assert states["d"].abandoned and states["d"].abandon_reason == "upstream task abandoned"


# -- a resume: blocks never tried first -----------------------------------------------


def _store(root: Path, n: int) -> TrackingStore:
    layout = StoreLayout((0,), (n,), (0,), (1,), (0,), (1,), "valid")
    return TrackingStore.open(root, layout, resource_tracking=False)


def test_a_resume_runs_blocks_that_failed_before_last(tmp_path: Path) -> None:
    n = 12
    with _store(tmp_path / "s", n) as store:
        for cell in (0, 1, 2, 7):
            store.record_failure(cell, 0, 0.0, 0.0)
        store.record_success(2, None, 0, 0.0, 0.0)  # failed once, then done: skipped
        store.flush()
    with _store(tmp_path / "s", n) as store:
        s = Scheduler(task(n, max_consecutive_failures=2), _stores={"t": store})
        run = run_of(s)
        assert run.failed_before == {0, 1, 7}
        order = []
        while (k := s.acquire_index(run)) >= 0:
            order.append(k)
            # the blocks that failed before fail again: not counted, the task goes on
            s.release_index(run, k, k not in (0, 1, 7))
        assert order[: n - 4] == [3, 4, 5, 6, 8, 9, 10, 11]
        assert order[n - 4 :] == [0, 1, 7, 0, 1, 7]  # then their retries, last too
        state = s.task_states["t"]
        assert not state.abandoned
        assert (state.completed_count, state.failed_count) == (n - 3, 3)


# -- the parameter ----------------------------------------------------------------------


def test_the_default_and_none() -> None:
    assert task().max_consecutive_failures == 10
    assert task(max_consecutive_failures=None).max_consecutive_failures is None
    assert task(max_consecutive_failures=1).max_consecutive_failures == 1


@pytest.mark.parametrize("bad", [0, -3, 2.5, "10", True])
def test_a_bad_value_is_a_configuration_error_naming_it(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^max_consecutive_failures must be an int"):
        task(max_consecutive_failures=bad)
    try:
        task(max_consecutive_failures=bad)
    except ConfigurationError as exc:
        assert exc.parameter == "max_consecutive_failures"
        assert repr(bad) in str(exc) and "None to never abandon" in str(exc)


# -- the dispatcher: workers are told to stop, no start is spent --------------------------


def test_the_dispatcher_stops_the_workers_of_a_task_whose_blocks_fail_in_a_row() -> None:
    from bellis._protocol import SHUTDOWN, WorkerExit
    from bellis._scheduling._dispatch import LAUNCH
    from kit.dispatch import FAIL, OK, Script, send_of, sent, task as dtask, told_to_stop

    sc = Script(dtask(blocks=40, max_workers=2, max_retries=1, max_consecutive_failures=3))
    w1, w2 = sc.start_workers()
    p1, p2 = sc.connect(worker=w1), sc.connect(worker=w2)
    (a,) = send_of(sc.acquire(p1), p1)
    (b,) = send_of(sc.acquire(p2), p2)
    # p1's block is done: the function works; then p2 fails every block it is given (its
    # batches grow) until 3 blocks failed in a row
    held = send_of(sc.acquire(p1, (a, OK, -1, None)), p1)
    held2 = [b]
    rounds = 0
    while True:
        out = sc.acquire(p2, *((k, FAIL, -1, "ValueError: bad tile") for k in held2))
        rounds += 1
        if sc.run().abandon_reason is not None:
            break
        held2 = send_of(out, p2)
    assert rounds <= 3
    run = sc.run()
    assert run.abandon_reason == "3 blocks failed in a row"
    assert told_to_stop(out, p2)
    # p1's batch comes back after the abandonment: ignored, and p1 is told to stop
    out = sc.acquire(p1, *((k, OK, -1, None) for k in held))
    assert [m[0] for m in sent(out, p1)] == [SHUTDOWN]
    assert run.completed == 1 and run.failed_attempts == 3
    # both exit cleanly: no worker failure, no restart, their starts given back
    sc.exit(w1, WorkerExit("clean", 0, ""))
    sc.exit(w2, WorkerExit("clean", 0, ""))
    assert (run.worker_restarts, run.worker_failures) == (0, 0)
    assert not [i for i in sc.tick() if i[0] == LAUNCH]  # no worker is started again


def test_blocks_lost_with_their_workers_do_not_count_as_a_broken_function() -> None:
    """A block whose worker went away (a crash, a killed job, a node failure: seen as 18
    blocks lost in a row when a SLURM node failed under a 200-worker array) is a failed
    attempt of that block, but says nothing of the function: the restart budget counts
    dead workers, the broken-function rule only blocks the function failed on."""
    from kit.dispatch import FAIL, Script, send_of, task as dtask

    sc = Script(dtask(blocks=40, max_workers=1, max_retries=5, max_consecutive_failures=3))
    for _ in range(12):
        peer = sc.connect()
        (k,) = send_of(sc.acquire(peer), peer)
        sc.dispatcher.close(peer, sc.now)
        sc.take()
    run = sc.run()
    assert run.failed_attempts == 12
    assert run.abandon_reason is None
    # three blocks the function fails on still fire the rule
    for _ in range(3):
        peer = sc.connect()
        (k,) = send_of(sc.acquire(peer), peer)
        sc.acquire(peer, (k, FAIL, -1, "ValueError: bad tile"))
        sc.dispatcher.close(peer, sc.now)
        sc.take()
    assert run.abandon_reason == "3 blocks failed in a row"
