"""Straggler backups by scripted events: a dispatcher over a task with
``speculative=True``, a fake clock (plain floats), and the instructions that come back. No
sockets, processes or sleeps."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

import bellis as daisy
from bellis._protocol import (
    ACQUIRE,
    BYE,
    TIMED_OUT,
    WorkerExit,
)
from bellis._scheduling._backups import MIN_FINISHED, SAMPLE, Backups
from bellis._scheduling._dispatch import KILL
from bellis._scheduling._records import Peer
from bellis._scheduling._task_run import FINISHED, PENDING
from bellis._stats._reports import counters_from_state, task_report_json
from bellis._stats._runlog import validate_run_line
from bellis.errors import ConfigurationError
from kit.dispatch import (
    CREATED,
    FAIL,
    OK,
    Script,
    closed,
    killed,
    send_of,
    sent,
    task as dispatch_task,
    told_to_stop,
)

STEP = 0.05  # each ordinary block takes this long: slower than a batch's target, so alone


def task(blocks: int = MIN_FINISHED + 1, **kw: Any) -> daisy.Task:
    kw.setdefault("max_workers", 2)
    return dispatch_task("t", blocks, **kw)


class Race:
    """Two managed workers: ``a`` took block ``x`` first and sits on it; ``b`` then ran
    every other block, ``STEP`` seconds each, and ``last`` is what ``b`` was sent last
    (its reply to the last of them)."""

    def __init__(self, blocks: int = MIN_FINISHED + 1, **kw: Any) -> None:
        self.sc = sc = Script(task(blocks, **kw))
        self.wa, self.wb = sc.start_workers()
        self.a, self.b = sc.connect(worker=self.wa), sc.connect(worker=self.wb)
        (self.x,) = send_of(sc.acquire(self.a), self.a)
        self.t0 = sc.now
        (k,) = send_of(sc.acquire(self.b), self.b)
        for _ in range(blocks - 2):
            sc.now += STEP
            (k,) = send_of(sc.acquire(self.b, (k, OK, -1, None)), self.b)
        sc.now += STEP
        self.last = sc.acquire(self.b, (k, OK, -1, None))


# -- configuration --------------------------------------------------------------------
def test_backups_are_off_by_default_and_speculative_means_a_factor_of_three() -> None:
    assert task().backup_after is None
    assert task(speculative=True).backup_after == 3.0
    assert task(backup_after=2).backup_after == 2.0
    assert task(speculative=True, backup_after=5.5).backup_after == 5.5


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"speculative": "yes"}, "speculative"),
        ({"speculative": 1}, "speculative"),
        ({"backup_after": 1.0}, "backup_after"),
        ({"backup_after": 0.5}, "backup_after"),
        ({"backup_after": float("inf")}, "backup_after"),
        ({"backup_after": float("nan")}, "backup_after"),
        ({"backup_after": True}, "backup_after"),
        ({"backup_after": "3"}, "backup_after"),
    ],
)
def test_a_bad_backup_setting_names_the_parameter_value_and_fix(
    kw: dict[str, Any], name: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        task(**kw)
    text = str(info.value)
    assert info.value.parameter == name and f"{name}={next(iter(kw.values()))!r}" in text
    assert "True or False" in text or "above 1" in text


# -- the median ------------------------------------------------------------------------
def test_the_threshold_is_the_factor_times_the_median_once_enough_finished() -> None:
    sc = Script(task(speculative=True))
    bk = sc.plans["t"].backups
    assert isinstance(bk, Backups)
    bk.add_finished(1.0, MIN_FINISHED - 1)
    assert bk.threshold() is None
    bk.add_finished(5.0, 1)
    bk.add_finished(0.5, 2)
    # 19 x 1.0, 1 x 5.0, 2 x 0.5: the median is 1.0
    assert bk.threshold() == 3.0


def test_the_median_looks_at_a_bounded_sample_of_the_latest_blocks() -> None:
    sc = Script(task(backup_after=2.0))
    bk = sc.plans["t"].backups
    bk.add_finished(10.0, 5 * SAMPLE)
    bk.add_finished(1.0, SAMPLE // 2 + 1)
    assert len(bk.walls) == SAMPLE and bk.finished == 5 * SAMPLE + SAMPLE // 2 + 1
    assert bk.threshold() == 2.0


# -- who gets a copy -------------------------------------------------------------------
def test_without_backups_the_idle_worker_is_told_to_stop_while_the_straggler_runs() -> None:
    r = Race()
    assert r.sc.plans["t"].backups is None
    assert told_to_stop(r.last, r.b)


def test_an_idle_worker_gets_a_copy_of_the_straggler_alone() -> None:
    r = Race(speculative=True)
    assert send_of(r.last, r.b) == [r.x]
    assert r.a.held == [r.x] and r.b.held == [r.x]
    assert r.sc.run().processing == 1 and r.sc.run().backups_started == 1
    assert r.sc.plans["t"].backups.copies == {r.x: (r.a, r.b)}


def test_no_copy_before_enough_blocks_finished() -> None:
    r = Race(blocks=MIN_FINISHED, speculative=True)  # 19 finished when b goes idle
    assert not sent(r.last, r.b)  # it waits: the block out may make it 20
    assert r.sc.run().backups_started == 0
    r.sc.now += 100.0
    assert not sent(r.sc.tick(), r.b)  # and waits on: no median yet


def test_an_idle_worker_stops_when_too_few_blocks_are_left_for_a_median() -> None:
    r = Race(blocks=MIN_FINISHED - 1, speculative=True)  # 18 finished, 1 out: never 20
    assert told_to_stop(r.last, r.b)
    assert r.sc.run().backups_started == 0


def test_an_idle_worker_waits_until_the_block_is_a_straggler_then_gets_the_copy() -> None:
    r = Race(backup_after=1000.0)  # out for ~1 s, far below 1000 x 0.05 s
    assert not sent(r.last, r.b) and r.b.parked
    assert r.sc.run().backups_started == 0
    r.sc.now = r.t0 + 1000 * STEP - 0.01
    assert not sent(r.sc.tick(), r.b)
    r.sc.now = r.t0 + 1000 * STEP + 0.01
    assert send_of(r.sc.tick(), r.b) == [r.x] and not r.b.parked


def test_a_waiting_worker_is_told_to_stop_when_the_run_shuts_down() -> None:
    r = Race(backup_after=1000.0)
    r.sc.dispatcher.begin_shutdown(r.sc.now)
    assert told_to_stop(r.sc.take(), r.b)


def test_a_block_out_in_a_batch_is_not_backed_up_and_the_idle_worker_stops() -> None:
    sc = Script(task(blocks=MIN_FINISHED + 4, speculative=True))
    wa, wb = sc.start_workers()
    a, b = sc.connect(worker=wa), sc.connect(worker=wb)
    a.batch = 4
    assert len(send_of(sc.acquire(a), a)) == 4  # which of them is slow is unknown
    (k,) = send_of(sc.acquire(b), b)
    for _ in range(MIN_FINISHED - 1):
        sc.now += STEP
        (k,) = send_of(sc.acquire(b, (k, OK, -1, None)), b)
    sc.now += 10.0
    assert told_to_stop(sc.acquire(b, (k, OK, -1, None)), b)
    assert sc.run().backups_started == 0


def test_an_unmanaged_client_gets_no_copy_and_its_block_gets_none() -> None:
    sc = Script(task(speculative=True))
    w = sc.start_workers()[0]
    stranger = sc.connect()  # an unmanaged client holds the slow block
    (x,) = send_of(sc.acquire(stranger), stranger)
    b = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(b), b)
    for _ in range(MIN_FINISHED - 1):
        sc.now += STEP
        (k,) = send_of(sc.acquire(b, (k, OK, -1, None)), b)
    sc.now += 10.0
    assert told_to_stop(sc.acquire(b, (k, OK, -1, None)), b)  # nothing it could copy
    assert sc.run().backups_started == 0 and stranger.held == [x]


# -- first success wins ----------------------------------------------------------------
def _state_after(r: Race) -> Any:
    return r.sc.run().snapshot()


def test_the_copy_finishes_first_the_original_is_preempted_and_nothing_is_charged() -> None:
    r = Race(speculative=True)
    sc = r.sc
    send_of(r.last, r.b)
    free = sc.plans["t"].free_starts
    sc.now += STEP
    out = sc.acquire(r.b, (r.x, OK, -1, None))
    assert killed(out, r.wa) and closed(out, r.a) and r.a.held == []
    assert r.wa.exit is not None and r.wa.exit.kind == "preempted"
    assert told_to_stop(out, r.b)  # the task is done
    st = _state_after(r)
    assert sc.run().status == FINISHED and st.completed_count == MIN_FINISHED + 1
    assert (st.backups_started, st.backups_won, st.backups_lost) == (1, 1, 0)
    assert st.backup_loser_seconds == pytest.approx(sc.now - r.t0)
    assert st.failed_count == st.failed_attempt_count == st.worker_failure_count == 0
    assert sc.plans["t"].free_starts == free + 1  # the preempted worker is no restart
    assert not sc.errors.groups("t")
    # the killed worker is seen to end later: nothing more is charged
    assert sc.dispatcher.worker_exited(r.wa, WorkerExit("error", -9, "killed")) is False
    assert _state_after(r).worker_failure_count == 0 and sc.plans["t"].retired_unseen == 0


class _Watched(deque[Any]):
    """The run's lanes (``TaskRun.recent``), noting how many races were posted when each
    block came in."""

    def __init__(self, races: deque[Any]) -> None:
        super().__init__()
        self.races = races
        self.races_at: list[tuple[int, int]] = []

    def append(self, item: Any) -> None:
        self.races_at.append((item[3], len(self.races)))
        super().append(item)


@pytest.mark.parametrize("winner", ["copy", "original"])
def test_a_race_reaches_the_live_page_only_after_its_winners_block(winner: str) -> None:
    # the page copies the races, then the blocks (another thread): a race posted before
    # its winner's release would be drawn without the winner's block
    r = Race(speculative=True)
    sc = r.sc
    run = sc.run()
    run.races = deque()
    run.recent = lanes = _Watched(run.races)
    send_of(r.last, r.b)
    sc.now += STEP
    out = sc.acquire(r.b if winner == "copy" else r.a, (r.x, OK, -1, None))
    assert killed(out, r.wa if winner == "copy" else r.wb)
    assert lanes.races_at == [(r.x, 0)]  # the block came in before the race was posted
    (race,) = run.races
    assert race[0] == r.x and race[6] is (winner == "copy")
    winner_worker = (r.wb if winner == "copy" else r.wa).worker_id
    assert race[1] == winner_worker and lanes[-1][0] == winner_worker


def test_the_original_finishes_first_and_the_copy_is_preempted() -> None:
    r = Race(speculative=True)
    sc = r.sc
    send_of(r.last, r.b)
    copy_sent = sc.now
    sc.now += 0.2
    out = sc.acquire(r.a, (r.x, OK, -1, None))
    assert killed(out, r.wb) and closed(out, r.b) and r.b.held == []
    assert r.wb.exit is not None and r.wb.exit.kind == "preempted"
    st = _state_after(r)
    assert st.completed_count == MIN_FINISHED + 1 and sc.run().status == FINISHED
    assert (st.backups_started, st.backups_won, st.backups_lost) == (1, 0, 1)
    assert st.backup_loser_seconds == pytest.approx(sc.now - copy_sent)
    assert st.failed_attempt_count == st.worker_failure_count == 0


def test_a_late_success_of_the_loser_cannot_come_back() -> None:
    r = Race(speculative=True)
    sc = r.sc
    send_of(r.last, r.b)
    sc.acquire(r.b, (r.x, OK, -1, None))
    # the shell reads nothing more from a closed connection; were it to, the block is no
    # longer held there: the message is refused, and nothing is released twice
    assert r.a.closed and r.a.held == []
    sc.dispatcher.receive(r.a, [ACQUIRE, r.x, OK, -1, None], sc.now)
    assert not sent(sc.take(), r.a)
    assert sc.run().completed == sc.plans["t"].aggregates.count == MIN_FINISHED + 1
    assert sc.run().backups_won == 1 and sc.run().backups_lost == 0


@pytest.mark.parametrize("first", ["original", "copy"])
def test_a_failed_copy_is_not_charged_and_the_other_goes_on_to_win(first: str) -> None:
    r = Race(speculative=True, max_retries=0)
    sc = r.sc
    send_of(r.last, r.b)
    failer, other = (r.a, r.b) if first == "original" else (r.b, r.a)
    sc.now += STEP
    out = sc.acquire(failer, (r.x, FAIL, -1, "ValueError: flaky"))
    assert not any(i[0] == KILL for i in out)
    assert sc.run().failed_attempts == 0 and sc.run().failed == 0 and sc.run().ready == 0
    assert failer.held == [] and other.held == [r.x] and not sc.plans["t"].backups.copies
    assert not sc.errors.groups("t")
    sc.now += STEP
    out = sc.acquire(other, (r.x, OK, -1, None))
    assert not any(i[0] == KILL for i in out)
    st = _state_after(r)
    assert sc.run().status == FINISHED and st.failed_count == st.failed_attempt_count == 0
    assert (st.backups_started, st.backups_won, st.backups_lost) == (1, 0, 0)


def test_when_both_copies_fail_the_block_is_charged_once() -> None:
    r = Race(speculative=True, max_retries=1)
    sc = r.sc
    send_of(r.last, r.b)
    sc.acquire(r.a, (r.x, FAIL, -1, "ValueError: 1"))
    out = sc.acquire(r.b, (r.x, FAIL, -1, "ValueError: 2"))
    assert sc.run().failed_attempts == 1 and sc.run().failed == 0
    assert send_of(out, r.b) == [r.x]  # the retry, an ordinary attempt


@pytest.mark.parametrize("lost", ["original", "copy"])
def test_a_lost_connection_drops_that_copy_only(lost: str) -> None:
    r = Race(speculative=True, max_retries=0)
    sc = r.sc
    send_of(r.last, r.b)
    gone, other = (r.a, r.b) if lost == "original" else (r.b, r.a)
    sc.dispatcher.close(gone, sc.now)
    sc.take()
    assert gone.held == [] and other.held == [r.x]
    assert sc.run().failed_attempts == 0 and sc.run().ready == 0 and sc.run().processing == 1
    sc.acquire(other, (r.x, OK, -1, None))
    assert sc.run().status == FINISHED and sc.run().failed == 0


@pytest.mark.parametrize("late", ["original", "copy"])
def test_a_copy_past_its_deadline_is_dropped_and_its_worker_stopped(late: str) -> None:
    r = Race(speculative=True, max_retries=0, timeout=1000)
    sc = r.sc
    send_of(r.last, r.b)
    peer, other = (r.a, r.b) if late == "original" else (r.b, r.a)
    other.deadline = float("inf")  # only ``peer``'s copy runs late
    sc.now = peer.deadline + 10.0
    out = sc.tick()
    assert killed(out, peer.worker) and closed(out, peer)
    assert peer.worker is not None and peer.worker.exit is not None
    assert peer.worker.exit.kind == "timeout"  # its worker timed out: replaced as usual
    assert other.held == [r.x] and sc.run().failed_attempts == 0
    assert sc.run().timeout_reclaims == 0
    sc.acquire(other, (r.x, OK, -1, None))
    assert sc.run().status == FINISHED and sc.run().failed == 0


def test_a_copy_reported_timed_out_by_its_watchdog_is_dropped_uncharged() -> None:
    r = Race(speculative=True, max_retries=0)
    sc = r.sc
    send_of(r.last, r.b)
    out = sc.acquire(r.a, (r.x, TIMED_OUT, -1, None), op=BYE)
    assert killed(out, r.wa) and r.wa.exit is not None and r.wa.exit.kind == "timeout"
    assert sc.run().failed_attempts == 0 and r.b.held == [r.x]


def test_a_copy_given_back_unstarted_leaves_the_block_with_the_other() -> None:
    r = Race(speculative=True)
    sc = r.sc
    send_of(r.last, r.b)
    out = sc.acquire(r.b, (r.x, CREATED, -1, None), op=BYE)
    assert closed(out, r.b) and sc.run().ready == 0 and r.a.held == [r.x]
    sc.now += 0.1
    sc.acquire(r.a, (r.x, OK, -1, None))
    assert sc.run().status == FINISHED


def test_the_worker_exit_of_a_preempted_worker_names_why_in_its_slot() -> None:
    r = Race(speculative=True)
    sc = r.sc
    send_of(r.last, r.b)
    sc.acquire(r.b, (r.x, OK, -1, None))
    sc.dispatcher.worker_exited(r.wa, WorkerExit("error", -9, "killed"))
    _slot, why = sc.plans["t"].take_slot()
    assert why is not None and "other copy of its block finished first" in why


# -- conflicts -------------------------------------------------------------------------
def _conflict_run(factor: float) -> tuple[Script, Peer, Peer, int, list[Any]]:
    """1-D with read/write conflicts (each block reads its neighbours' write ROIs): ``a``
    sits on the first block, ``b`` runs every block it can until the rest wait on it."""
    blocks = 2 * MIN_FINISHED + 6
    t = daisy.Task(
        "t",
        daisy.Roi((0,), (10 * blocks + 10,)),
        daisy.Roi((0,), (20,)),
        daisy.Roi((5,), (10,)),
        process_function=lambda b: None,
        read_write_conflict=True,
        max_workers=2,
        backup_after=factor,
    )
    sc = Script(t)
    wa, wb = sc.start_workers()
    a, b = sc.connect(worker=wa), sc.connect(worker=wb)
    (x,) = send_of(sc.acquire(a), a)
    (k,) = send_of(sc.acquire(b), b)
    while True:
        sc.now += STEP
        out = sc.acquire(b, (k, OK, -1, None))
        got = sent(out, b)
        if not got or got[0][1:] == [x]:
            return sc, a, b, x, got
        (k,) = got[0][1:]


@pytest.mark.parametrize("factor", [3.0, 100.0])
def test_with_read_write_conflicts_the_neighbours_wait_for_the_block_and_its_copy(
    factor: float,
) -> None:
    sc, a, b, x, got = _conflict_run(factor)
    neighbours = sc.run().geom.downstream_of(x)
    assert neighbours and all(sc.run().state[n] == PENDING for n in neighbours)
    if factor > 50:
        # not a straggler yet: b waits (parked: the blocks left wait on x), and the tick
        # hands it the copy once x is one
        assert not got and b.parked and sc.run().ready == 0 and sc.run().pending > 0
        sc.now += 10.0  # past 100 x the median (0.05 s), within the timeout
        assert send_of(sc.tick(), b) == [x] and not b.parked
    # the copy is out: the scheduler still counts x as running, its neighbours wait
    assert a.held == b.held == [x] and sc.run().processing == 1
    assert all(sc.run().state[n] == PENDING for n in neighbours)
    sc.acquire(b, (x, OK, -1, None))
    assert sc.run().backups_won == 1 and all(sc.run().state[n] != PENDING for n in neighbours)


# -- what the report says --------------------------------------------------------------
def test_the_counters_reach_the_run_line_and_it_validates() -> None:
    r = Race(speculative=True)
    send_of(r.last, r.b)
    r.sc.now += 0.5
    r.sc.acquire(r.b, (r.x, OK, -1, None))
    counters = counters_from_state(r.sc.run().snapshot())
    assert counters["backups_started"] == counters["backups_won"] == 1
    assert counters["backups_lost"] == 0 and counters["backup_loser_seconds"] > 1.0
    r.sc.dispatcher.worker_exited(r.wa, WorkerExit("error", -9, "killed"))
    line = task_report_json(
        task_id="t",
        outcome="completed",
        mode="distributed",
        run_started_at=0.0,
        run_finished_at=1.0,
        resource_tracking=False,
        counters=counters,
        blocks=r.sc.plans["t"].aggregates,
        workers=r.sc.plans["t"].timelines.to_json(),
    )
    assert line["workers"]["exits"].get("preempted") == 1
    assert line["counters"]["backup_loser_seconds"] == counters["backup_loser_seconds"]
    assert validate_run_line(line) == []
    bad = dict(line, counters=dict(counters, backup_loser_seconds=-1.0))
    assert validate_run_line(bad)
