"""A plan's sample run gates each task's first blocks until its workers are all there
(``bellis._scheduling._gate``), by scripted events on a fake clock. No sockets, processes or
sleeps."""

from __future__ import annotations

import pytest

from bellis._scheduling._gate import StartGate
from kit.dispatch import Script, send_of, task


def _gated(blocks: int = 30, wait: float = 30.0) -> Script:
    sc = Script(task(blocks=blocks, max_workers=3))
    for plan in sc.plans.values():
        plan.gate = StartGate(wait)
    return sc


def test_the_first_requests_wait_until_every_worker_is_there_then_all_are_served() -> None:
    sc = _gated()
    w = sc.start_workers()
    assert len(w) == 3
    first = sc.connect(worker=w[0])
    assert sc.acquire(first) == [] and first.parked  # held: two more are coming
    sc.now += 2.0
    second = sc.connect(worker=w[1])
    assert sc.acquire(second) == [] and second.parked
    sc.tick()  # a tick does not open it either
    assert not first.held and not second.held and sc.run().processing == 0
    sc.now += 1.0
    third = sc.connect(worker=w[2])
    out = sc.acquire(third)
    # the last one in opens the gate: the two that waited are served, then it is
    assert all(len(send_of(out, p)) >= 1 for p in (first, second, third))
    assert not first.parked and not second.parked
    assert sc.plans["t"].gate is None  # dropped once open: the run pays nothing more


def test_the_gate_opens_at_its_deadline_without_a_worker_that_never_connects() -> None:
    sc = _gated(wait=30.0)
    w = sc.start_workers()
    peers = [sc.connect(worker=x) for x in w[:2]]
    for p in peers:
        assert sc.acquire(p) == []
    sc.now += 29.0
    sc.tick()
    assert all(p.parked for p in peers)
    sc.now += 1.5  # 30 s after the first request waited
    out = sc.tick()
    assert all(len(send_of(out, p)) >= 1 for p in peers)


def test_workers_the_resources_do_not_allow_are_not_waited_for() -> None:
    # 3 workers wanted, but the run's budget allows 2: the gate opens when both are there
    sc = Script(task(blocks=30, max_workers=3, requires={"cpu": 1}), resources={"cpu": 2})
    sc.plans["t"].gate = StartGate(30.0)
    w = sc.start_workers()
    assert len(w) == 2
    a = sc.connect(worker=w[0])
    assert sc.acquire(a) == []
    b = sc.connect(worker=w[1])
    out = sc.acquire(b)
    assert len(send_of(out, a)) >= 1 and len(send_of(out, b)) >= 1


def test_a_negative_wait_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="wait must be >= 0"):
        StartGate(-1.0)
