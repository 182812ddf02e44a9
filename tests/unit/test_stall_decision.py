"""Stall detection, pure parts: the decision fed scripted readings on a fake clock, the
sampler's subtraction of its own work, ``Task(stall_timeout=...)`` validation, and how a
stall is named in the exit kinds, the run line and the summary."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import bellis
from bellis import Roi
from bellis._block import heartbeats
from bellis._launchers._base import WorkerSpec, describe_exit
from bellis._run._summary import format_summary
from bellis._state import TaskState
from bellis._stats._runlog import COUNTER_KEYS, EXIT_KINDS, validate_run_line
from bellis._worker._stall import CPU_EPSILON, ProcessSampler, Reading, StallMonitor
from bellis.errors import ConfigurationError


class Script:
    """Readings a test sets by hand: the process CPU, reaped children's CPU, IO,
    heartbeats, and the live children's CPU (counting how often each was read)."""

    def __init__(self) -> None:
        self.cpu = 1.0
        self.reaped = 0.0
        self.io = 1000
        self.beats = 0
        self.live = 0.0
        self.live_reads = 0

    def cheap(self) -> Reading:
        return (self.cpu, self.reaped, self.io, self.beats)

    def live_children(self) -> float:
        self.live_reads += 1
        return self.live


def monitor(stall: float = 2.0) -> tuple[StallMonitor, Script]:
    s = Script()
    m = StallMonitor(stall, s.cheap, s.live_children)
    m.begin(100.0)
    return m, s


def test_nothing_moving_is_a_stall_after_stall_timeout_and_not_before() -> None:
    m, _ = monitor(2.0)
    ticks = [100.0 + 0.2 * i for i in range(1, 10)]  # up to 101.8
    assert not any(m.check(t) for t in ticks)
    assert m.check(102.0)
    assert m.idle_seconds(102.5) == pytest.approx(2.5)


@pytest.mark.parametrize(
    "move",
    [
        pytest.param(lambda s: setattr(s, "cpu", s.cpu + 0.01), id="cpu"),
        pytest.param(lambda s: setattr(s, "reaped", s.reaped + 0.01), id="reaped-children"),
        pytest.param(lambda s: setattr(s, "io", s.io + 1), id="one-byte-of-io"),
        pytest.param(lambda s: setattr(s, "beats", s.beats + 1), id="heartbeat"),
    ],
)
def test_any_one_sign_of_life_restarts_the_clock(move: Any) -> None:
    m, s = monitor(2.0)
    assert not m.check(101.5)
    move(s)
    assert not m.check(101.9)
    # 2 s after the movement, not after the start
    assert not m.check(103.8)
    assert m.check(103.9)


def test_cpu_below_epsilon_is_not_movement_but_it_accumulates() -> None:
    m, s = monitor(2.0)
    s.cpu += CPU_EPSILON / 2  # a sleeping loop's wake-ups
    assert not m.check(101.0)
    assert m.check(102.0)
    m.begin(200.0)
    # the reference stays where the block last moved: small amounts add up to movement
    for i in range(1, 4):
        s.cpu += CPU_EPSILON * 0.4
        assert not m.check(200.0 + 0.5 * i)
    assert m.last_moved == pytest.approx(201.5)


def test_cpu_going_backwards_is_not_movement() -> None:
    # the sampler subtracts its own CPU after reading the total: its error is downwards
    m, s = monitor(1.0)
    s.cpu -= 0.5
    assert m.check(101.0)


def test_live_children_are_read_only_when_nothing_cheap_moved() -> None:
    m, s = monitor(2.0)
    s.cpu += 1.0
    assert not m.check(100.5)
    assert s.live_reads == 0
    assert not m.check(101.0)
    assert s.live_reads == 1


def test_a_working_child_keeps_the_block_alive_and_an_idle_one_does_not() -> None:
    m, s = monitor(2.0)
    t = 100.0
    for _ in range(20):  # the parent waits on a child that works for 4 s
        t += 0.2
        s.live += 0.2
        assert not m.check(t)
    # the child now waits too: a stall 2 s after its last movement
    assert not m.check(t + 1.9)
    assert m.check(t + 2.0)


def test_the_first_look_at_live_children_is_a_reference_not_movement() -> None:
    m, s = monitor(2.0)
    s.live = 50.0  # a long-lived idle child started before the block
    assert not m.check(101.0)
    assert m.check(102.0)


def test_begin_starts_a_new_block_afresh() -> None:
    m, s = monitor(2.0)
    assert m.check(102.5)
    s.io += 10  # the next block's start
    m.begin(103.0)
    assert not m.check(104.9)
    assert m.check(105.0)


def test_stall_timeout_must_be_positive() -> None:
    s = Script()
    with pytest.raises(ValueError, match="stall_timeout must be positive"):
        StallMonitor(0.0, s.cheap, s.live_children)


def test_the_sampler_does_not_count_its_own_reads_or_its_own_cpu() -> None:
    sampler = ProcessSampler()
    first = sampler.cheap()
    end = sum(range(200_000))  # CPU in this (the sampling) thread is the sampler's own
    sampler.live_children()  # reads /proc: the sampler's own IO
    second = sampler.cheap()
    assert end > 0
    assert second[0] - first[0] <= CPU_EPSILON
    assert second[2] == first[2]


def test_heartbeat_advances_the_counter_the_watchdog_reads() -> None:
    before = heartbeats()
    bellis.heartbeat()
    block = bellis.Block(Roi((0,), (10,)), Roi((0,), (2,)), Roi((0,), (2,)))
    block.heartbeat()
    assert heartbeats() == before + 2


# ------------------------------------------------------------------ Task(stall_timeout)


def _task(**kw: Any) -> bellis.Task:
    return bellis.Task(
        "t",
        total_roi=Roi((0,), (10,)),
        read_roi=Roi((0,), (2,)),
        write_roi=Roi((0,), (2,)),
        process_function=lambda b: None,
        **kw,
    )


def test_stall_timeout_is_off_by_default_and_accepts_seconds_or_a_timedelta() -> None:
    assert _task().stall_timeout_secs is None
    assert _task(stall_timeout=None).stall_timeout_secs is None
    assert _task(stall_timeout=30).stall_timeout_secs == 30.0
    assert _task(stall_timeout=0.5).stall_timeout_secs == 0.5
    assert _task(stall_timeout=timedelta(minutes=2)).stall_timeout_secs == 120.0


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, timedelta(0)])
def test_stall_timeout_must_be_a_positive_finite_duration(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"stall_timeout=.* must be a positive") as info:
        _task(stall_timeout=bad)
    assert info.value.parameter == "stall_timeout"
    assert "None to turn stall detection off" in str(info.value)


@pytest.mark.parametrize("bad", ["2s", True, [2]])
def test_stall_timeout_of_another_type_names_what_to_pass(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="is not a duration") as info:
        _task(stall_timeout=bad)
    assert info.value.parameter == "stall_timeout"
    assert repr(bad) in str(info.value)


# ------------------------------------------------------------------ how a stall is named


def test_exit_code_88_is_a_stalled_worker(tmp_path: Path) -> None:
    spec = WorkerSpec("t", 0, {}, b"", None, tmp_path / "w.err")
    ex = describe_exit(88, spec)
    assert ex.kind == "stalled" and ex.code == 88
    assert "stalled" in ex.message
    assert describe_exit(87, spec).kind == "timeout"
    assert "stalled" in EXIT_KINDS


def test_a_run_line_without_stall_reclaims_is_still_valid() -> None:
    line: dict[str, Any] = {
        "schema": 1,
        "task_id": "t",
        "outcome": "completed",
        "mode": "serial",
        "resource_tracking": False,
        "wall_seconds": 1.0,
        "counters": {k: 0 for k in COUNTER_KEYS if k != "stall_reclaims"},
        "blocks": {"count": 0, "skipped": 0, "failed_attempts": 0},
        "workers": {"count": 0, "unmanaged_clients": 0, "exits": {"stalled": 0}, "records": []},
    }
    assert validate_run_line(line) == []
    line["counters"]["stall_reclaims"] = -1
    assert validate_run_line(line) == ["counters.stall_reclaims: must be an integer >= 0, got -1"]


def test_the_summary_says_how_many_attempts_stalled() -> None:
    state = TaskState(
        task_id="t",
        started=True,
        total_block_count=4,
        completed_count=4,
        stall_reclaim_count=2,
        stall_timeout_secs=30.0,
    )
    text = format_summary({"t": state}, ["t"], log_dir=None)
    assert "2 block attempt(s) in task 't' stalled: no CPU, IO or heartbeat for 30s" in text
    quiet = format_summary({"t": TaskState(task_id="t", started=True)}, ["t"], log_dir=None)
    assert "stalled" not in quiet
