"""The job time limit decision (``bellis._worker._walltime``) with a scripted clock, and the SLURM
text it relies on (``bellis._launchers._slurm_text``)."""

from __future__ import annotations

import math
import time

import pytest

from bellis._launchers._slurm_text import (
    array_ranges,
    default_margin,
    exit_status,
    time_limit_seconds,
)
from bellis._worker._walltime import LEAVING_MARKER, JobWalltime, from_env


def _run(guard: JobWalltime, walls: list[float], start: float = 0.0) -> tuple[int, float]:
    """Blocks of ``walls`` back to back from ``start``, each checked the way the client
    does (only past ``next_check``); how many ran and when the worker left (inf: never)."""
    now = start
    for n, wall in enumerate(walls):
        if now > guard.next_check and guard.check(now):
            return n, now
        now += wall
    return len(walls), math.inf


def test_a_worker_leaves_when_margin_plus_p95_no_longer_fits() -> None:
    guard = JobWalltime(end=60.0, margin=10.0)
    ran, left = _run(guard, [2.0] * 100)
    # blocks start at 0, 2, 4, ...; the one at 48 would end after 60 - 10
    assert (ran, left) == (24, 48.0)
    assert guard.p95 == pytest.approx(2.0) and guard.samples == 24
    assert left + guard.p95 <= 60.0 - 10.0


def test_the_p95_ignores_rare_long_blocks_but_follows_a_slowdown() -> None:
    # one slow block in 40 does not move the p95 ...
    walls = [1.0] * 19 + [9.0] + [1.0] * 20
    guard = JobWalltime(end=1000.0, margin=0.0)
    assert _run(guard, walls) == (40, math.inf)
    assert guard.p95 == pytest.approx(1.0)
    # ... blocks that all got slower do
    guard = JobWalltime(end=1000.0, margin=0.0)
    _run(guard, [1.0] * 10 + [5.0] * 30)
    assert guard.p95 == pytest.approx(5.0)


def test_fast_blocks_are_sampled_once_per_second_after_the_first_ones() -> None:
    guard = JobWalltime(end=10_000.0, margin=30.0)
    checks = 0
    now = 0.0
    for _ in range(100_000):  # 10 ms blocks: 1,000 s
        if now > guard.next_check:
            checks += 1
            assert not guard.check(now)
        now += 0.01
    # the first 32 blocks, then about one per second (each sample takes two checks)
    assert 32 < checks < 32 + 2 * 1000 + 10
    assert guard.p95 == pytest.approx(0.01)
    # between samples the threshold is the next sample or the time to leave
    assert guard.next_check <= 10_000.0 - 30.0 - guard.p95


def test_between_samples_the_leave_time_still_applies() -> None:
    guard = JobWalltime(end=100.0, margin=5.0)
    ran, left = _run(guard, [0.01] * 20_000)
    assert left == pytest.approx(100.0 - 5.0 - 0.01, abs=0.02)
    assert ran == pytest.approx(9499, abs=2)


def test_a_first_block_runs_with_only_the_margin_left_out() -> None:
    # no wall known yet: only the margin counts
    guard = JobWalltime(end=20.0, margin=5.0)
    assert not guard.check(14.0)
    assert JobWalltime(end=20.0, margin=5.0).check(15.0)


def test_the_leaving_line_says_why() -> None:
    guard = JobWalltime(end=60.0, margin=10.0)
    _run(guard, [2.0] * 100)
    line = guard.leaving(48.0, worker_id=7)
    assert line.startswith(LEAVING_MARKER)
    assert "worker 7's job ends in 12.0 s" in line
    assert "margin (10 s) plus the p95 block wall (2.00 s over 24 blocks)" in line


def test_the_end_comes_from_the_environment() -> None:
    now = time.time()
    mono = time.monotonic()
    assert from_env({}) is None
    # the launcher's limit after the job script's start stamp
    env = {"BELLIS_WALLTIME_MARGIN": "10", "BELLIS_JOB_TIME_LIMIT": "60"}
    assert from_env(env) is None  # no start known: not walltime-aware
    guard = from_env({**env, "BELLIS_JOB_STARTED": str(int(now) - 20)})
    assert guard is not None and guard.margin == 10.0
    assert guard.end - mono == pytest.approx(int(now) - 20 + 60 - now, abs=0.5)
    # SLURM's own start time wins over the script's stamp, its end time over both
    guard = from_env(
        {**env, "BELLIS_JOB_STARTED": str(int(now)), "SLURM_JOB_START_TIME": str(int(now) - 30)}
    )
    assert guard is not None and guard.end - mono == pytest.approx(30 - (now - int(now)), abs=0.5)
    guard = from_env({**env, "BELLIS_JOB_STARTED": "1", "SLURM_JOB_END_TIME": str(now + 100)})
    assert guard is not None and guard.end - mono == pytest.approx(100, abs=0.5)
    with pytest.raises(ValueError, match=r"BELLIS_WALLTIME_MARGIN='-1' is not seconds >= 0"):
        from_env({"BELLIS_WALLTIME_MARGIN": "-1"})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1", 60),
        ("90", 5400),
        ("5:30", 330),
        ("02:00:00", 7200),
        ("1-0", 86400),
        ("1-2", 93600),
        ("1-2:30", 95400),
        ("2-00:00:10", 172810),
    ],
)
def test_slurm_time_limits_in_seconds(text: str, seconds: int) -> None:
    assert time_limit_seconds(text) == seconds


def test_default_margin_is_five_percent_within_ten_to_sixty_seconds() -> None:
    assert [default_margin(s) for s in (60, 600, 3600, 86400)] == [10.0, 30.0, 60.0, 60.0]


@pytest.mark.parametrize(
    ("text", "status"),
    [("0", "0:0"), ("768", "3:0"), ("9", "0:9"), ("22272", "87:0"), ("1:0", "1:0"), ("", "")],
)
def test_squeue_exit_codes_read_as_scontrol_writes_them(text: str, status: str) -> None:
    assert exit_status(text) == status


def test_array_indices_as_ranges() -> None:
    assert array_ranges(list(range(200))) == "0-199"
    assert array_ranges([7, 0, 1, 2, 3, 9, 10]) == "0-3,7,9-10"
    assert array_ranges([5]) == "5"
