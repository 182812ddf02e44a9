"""The worker timeline, driven by scripted server clock values (bellis._stats._timeline)."""

from __future__ import annotations

import pytest

from bellis._stats._reports import (
    COUNTER_KEYS,
    TaskAggregates,
    TaskReport,
    task_report_json,
    validate_run_line as validate,
)
from bellis._stats._timeline import TimelineSet, WorkerTimeline


def _script_clean_worker(tl: WorkerTimeline, start: float = 10.0) -> float:
    """spawn 10.0, acquire 10.5, three blocks with failures mixed in, shutdown, exit."""
    tl.spawned(start)
    tl.reported_setup(0.3)
    tl.first_acquire(start + 0.5)
    tl.sent(start + 0.6)  # idle 0.1
    tl.returned(start + 1.6)  # compute 1.0
    tl.sent(start + 1.65)  # idle 0.05
    tl.returned(start + 3.65, failed=True)  # compute 2.0, failed
    tl.sent(start + 3.75)  # idle 0.1
    tl.returned(start + 4.75)  # compute 1.0
    tl.shutdown_requested(start + 5.0)  # final wait 0.25
    tl.exited(start + 5.4, "clean")  # teardown 0.4
    return start + 5.4


def test_clean_worker_phases_tile_its_life() -> None:
    tl = WorkerTimeline(3)
    exit_t = _script_clean_worker(tl)
    r = tl.record()
    assert r.worker_id == 3 and r.exit == "clean"
    assert r.startup == pytest.approx(0.5)
    assert r.setup == pytest.approx(0.3) and r.launch == pytest.approx(0.2)
    assert r.idle.n == 3 and r.idle.total == pytest.approx(0.25)
    assert r.idle.max == pytest.approx(0.1) and r.idle.min == pytest.approx(0.05)
    assert r.compute.n == 3 and r.compute.total == pytest.approx(4.0)
    assert r.blocks == 2 and r.blocks_failed == 1
    assert r.final_wait == pytest.approx(0.25)
    assert r.teardown == pytest.approx(0.4)
    assert r.startup is not None and r.final_wait is not None and r.teardown is not None
    life = r.startup + r.idle.total + r.compute.total + r.final_wait + r.teardown
    assert life == pytest.approx(exit_t - 10.0)


def test_final_wait_is_not_idle() -> None:
    tl = WorkerTimeline(0, spawned_at=0.0)
    tl.first_acquire(1.0)
    tl.sent(1.0)
    tl.returned(2.0)
    tl.shutdown_requested(102.0)
    tl.exited(102.5, "clean")
    r = tl.record()
    assert r.idle.n == 1 and r.idle.total == 0.0
    assert r.final_wait == pytest.approx(100.0)


def test_only_clean_exits_have_a_teardown() -> None:
    for kind in ("timeout", "error", "interrupted"):
        tl = WorkerTimeline(1, spawned_at=0.0)
        tl.first_acquire(0.1)
        tl.shutdown_requested(0.2)
        tl.exited(0.9, kind)
        r = tl.record()
        assert r.exit == kind and r.teardown is None


def test_run_shutdown_starts_the_teardown_of_a_worker_never_told() -> None:
    tl = WorkerTimeline(0, spawned_at=0.0)
    tl.first_acquire(1.0)
    tl.sent(1.0)
    tl.returned(2.0)
    tl.run_shutdown(3.0)
    tl.shutdown_requested(4.0)  # later stamps do not move it
    tl.exited(3.5, "clean")
    r = tl.record()
    assert r.final_wait == pytest.approx(1.0) and r.teardown == pytest.approx(0.5)


def test_a_worker_with_a_block_in_flight_has_no_final_wait() -> None:
    tl = WorkerTimeline(0, spawned_at=0.0)
    tl.first_acquire(1.0)
    tl.sent(1.5)
    tl.run_shutdown(2.0)
    tl.exited(3.0, "interrupted")
    r = tl.record()
    assert r.final_wait is None and r.compute.n == 0 and r.idle.total == pytest.approx(0.5)


def test_setup_is_capped_at_the_startup_the_server_saw() -> None:
    tl = WorkerTimeline(0, spawned_at=5.0)
    tl.reported_setup(2.0)
    tl.first_acquire(6.0)
    assert tl.setup == pytest.approx(1.0) and tl.launch == 0.0
    tl2 = WorkerTimeline(1)
    tl2.reported_setup(0.4)
    tl2.first_acquire(3.0)
    assert tl2.startup is None and tl2.setup == pytest.approx(0.4) and tl2.launch is None
    tl3 = WorkerTimeline(2, spawned_at=0.0)
    tl3.first_acquire(1.0)
    assert tl3.setup is None and tl3.launch is None and tl3.startup == 1.0


def test_a_send_without_an_acquire_counts_as_the_first_acquire() -> None:
    tl = WorkerTimeline(0, spawned_at=0.0)
    tl.sent(0.7)
    tl.returned(1.0)
    r = tl.record()
    assert r.startup == pytest.approx(0.7) and r.idle.total == 0.0 and r.blocks == 1


def test_first_acquire_and_exit_keep_the_first_stamp() -> None:
    tl = WorkerTimeline(0, spawned_at=0.0)
    tl.first_acquire(1.0)
    tl.first_acquire(9.0)
    tl.exited(2.0, "error")
    tl.exited(3.0, "clean")
    r = tl.record()
    assert r.startup == 1.0 and r.exit == "error"


def test_contract_violations_raise() -> None:
    tl = WorkerTimeline(4, spawned_at=0.0)
    with pytest.raises(ValueError, match="never sent"):
        tl.returned(1.0)
    tl.sent(1.0)
    with pytest.raises(ValueError, match="in flight"):
        tl.sent(2.0)
    with pytest.raises(ValueError, match="exit kind"):
        tl.exited(3.0, "vanished")
    ts = TimelineSet()
    ts.spawned(0, 0.0)
    with pytest.raises(ValueError, match="already spawned"):
        ts.spawned(0, 1.0)


def test_timeline_set_folds_workers_into_the_workers_section() -> None:
    ts = TimelineSet()
    _script_clean_worker(ts.spawned(0, 10.0), start=10.0)
    w1 = ts.spawned(1, 10.0)
    w1.first_acquire(11.0)
    w1.sent(11.5)
    w1.returned(12.0)
    w1.exited(12.5, "error")
    w2 = ts.spawned(2, 10.0)
    w2.first_acquire(10.8)
    w2.sent(10.9)
    ts.unmanaged_client()
    ts.unmanaged_client()
    ts.run_shutdown(20.0)
    ts.exit_open(21.0)
    assert 2 in ts and len(ts) == 3 and ts[1] is w1 and ts.get(9) is None
    j = ts.to_json()
    assert j["count"] == 3 and j["unmanaged_clients"] == 2
    assert j["exits"] == {"clean": 1, "error": 1, "interrupted": 1}
    assert j["startup"]["n"] == 3
    assert j["startup"]["mean"] == pytest.approx((0.5 + 1.0 + 0.8) / 3)
    assert j["setup"]["n"] == 1 and j["launch"]["mean"] == pytest.approx(0.2)
    # idle pools every gap of every worker: 3 from worker 0, 1 each from workers 1 and 2
    assert j["idle"]["n"] == 5
    assert j["idle"]["total"] == pytest.approx(0.25 + 0.5 + 0.1)
    assert j["teardown"]["n"] == 1 and j["teardown"]["mean"] == pytest.approx(0.4)
    assert [r["worker_id"] for r in j["records"]] == [0, 1, 2]
    assert j["records"][2]["exit"] == "interrupted" and j["records"][2]["final_wait"] is None
    line = task_report_json(
        task_id="t",
        outcome="interrupted",
        mode="distributed",
        run_started_at=0.0,
        run_finished_at=21.0,
        resource_tracking=False,
        counters=dict.fromkeys(COUNTER_KEYS, 0),
        blocks=TaskAggregates(),
        workers=j,
    )
    assert validate(line) == []
    report = TaskReport(line)
    assert report.worker(1).exit == "error" and report.worker(1).teardown is None
    assert report.workers.unmanaged_clients == 2
    assert report.workers.idle is not None and report.workers.idle.n == 5


def test_empty_timeline_set() -> None:
    j = TimelineSet().to_json()
    assert j["count"] == 0 and j["records"] == [] and j["exits"] == {}
    for key in ("startup", "launch", "setup", "idle", "teardown"):
        assert j[key] is None
