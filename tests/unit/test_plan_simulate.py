"""The forecast's schedule simulation (``bellis._plan._simulate``), against schedules
worked out by hand. Pure: no clock, no processes."""

from __future__ import annotations

import numpy as np
import pytest

from bellis._plan._simulate import _event_loop, _independent, simulate


def test_independent_blocks_share_the_workers() -> None:
    # 2 workers, costs 3,1,1,1: w0 takes b0 (0-3); w1 takes b1 (0-1), b2 (1-2), b3 (2-3)
    r = simulate([3.0, 1.0, 1.0, 1.0], [[], [], [], []], [0, 0, 0, 0], [2])
    assert r.wall == 3.0 and r.busy == 6.0 and r.peak_parallel == (2,)
    # one worker: the sum
    assert simulate([3.0, 1.0, 1.0, 1.0], [[]] * 4, [0] * 4, [1]).wall == 6.0


def test_a_chain_runs_one_block_at_a_time_whatever_the_workers() -> None:
    r = simulate([1.0, 2.0, 3.0], [[], [0], [1]], [0, 0, 0], [8])
    assert r.wall == 6.0 and r.peak_parallel == (1,)


def test_levels_wait_for_their_neighbours() -> None:
    # 1-d conflict levels: even blocks (level 0), then odd ones, each waiting for both
    # neighbours. Level 0 costs 1 except b2 (5): b1 waits for b0 and b2 (until 5),
    # b3 for b2 and b4 (until 5); b5 only for b4 (until 1)
    costs = [1.0, 1.0, 5.0, 1.0, 1.0, 1.0]
    deps = [[], [0, 2], [], [2, 4], [], [4]]
    r = simulate(costs, deps, [0] * 6, [3])
    # w0: b0 0-1, then b5 1-2 (ready at 1, before b1 and b3); w1: b2 0-5, b1 5-6;
    # w2: b4 0-1, idle until 5, b3 5-6
    assert r.wall == 6.0 and r.busy == 10.0


def test_worker_start_and_per_block_overhead_are_counted() -> None:
    r = simulate([1.0] * 4, [[]] * 4, [0] * 4, [2], start_delay=0.5, overhead=0.25)
    assert r.wall == pytest.approx(0.5 + 2 * 1.25)
    assert r.started == (0.5,) and r.finished == (3.0,)
    assert r.worker_seconds([2]) == pytest.approx(2 * 2.5)


def test_a_downstream_task_asks_for_its_workers_when_its_first_block_is_ready() -> None:
    # task 0: two blocks of 2 s, one worker; task 1: one block waiting for both
    r = simulate([2.0, 2.0, 1.0], [[], [], [0, 1]], [0, 0, 1], [1, 4], start_delay=1.0)
    # task 0 starts at 1, ends 5; task 1's workers are asked at 5, ready at 6, done at 7
    assert r.started == (1.0, 6.0) and r.finished == (5.0, 7.0) and r.wall == 7.0


def test_more_workers_never_make_it_slower_here_and_help_a_wide_level() -> None:
    costs = [1.0] * 12
    walls = [simulate(costs, [[]] * 12, [0] * 12, [w]).wall for w in (1, 2, 3, 4, 12)]
    assert walls == [12.0, 6.0, 4.0, 3.0, 1.0]


def test_a_block_that_can_never_run_is_an_error() -> None:
    with pytest.raises(ValueError, match="never ran"):
        simulate([1.0, 1.0], [[1], [0]], [0, 0], [1])
    with pytest.raises(ValueError, match="one entry per block"):
        simulate([1.0], [], [0], [1])


def test_workers_that_start_late_take_what_is_left() -> None:
    costs, deps, group = [1.0] * 4, [[]] * 4, [0] * 4
    # the second worker arrives after the first has done everything
    late = simulate(costs, deps, group, [2], arrivals=[[0.0, 5.0]])
    assert late.wall == 4.0 and late.peak_parallel == (1,) and late.started == (0.0,)
    # it arrives after 1 s: b0 on w0 (0-1); b1 and b2 (1-2); b3 (2-3)
    assert simulate(costs, deps, group, [2], arrivals=[[0.0, 1.0]]).wall == 3.0
    # fewer arrivals than workers: the last one repeats; none: start_delay
    assert simulate(costs, deps, group, [4], arrivals=[[2.0]]).wall == 3.0
    assert simulate(costs, deps, group, [4], arrivals=[[]], start_delay=0.5).wall == 1.5


def test_the_fast_path_for_independent_blocks_is_the_event_loops_schedule() -> None:
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(0, 60))
        groups = int(rng.integers(1, 4))
        costs = [float(c) for c in rng.choice([0.5, 1.0, 2.0, 7.0], size=n)]
        group = [int(g) for g in rng.integers(0, groups, size=n)]
        workers = [int(w) for w in rng.integers(1, 6, size=groups)]
        arrivals = [[float(a) for a in rng.choice([0.0, 0.5, 3.0], size=w)] for w in workers]
        args = (costs, group, workers, 0.25, 0.125, arrivals if trial % 2 else None)
        fast = _independent(*args)
        slow = _event_loop(costs, [[]] * n, *args[1:])
        assert fast == slow, (trial, fast, slow)
    # simulate takes the fast path for deps=None and for no dependencies at all
    assert simulate([1.0] * 5, None, [0] * 5, [2]) == _event_loop(
        [1.0] * 5, [[]] * 5, [0] * 5, [2], 0.0, 0.0, None
    )
