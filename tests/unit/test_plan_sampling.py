"""The forecast's pure parts (``bellis._plan._forecast``): how many blocks a sample takes,
which ones, how warm-up blocks are told apart, and the cost model. numpy only."""

from __future__ import annotations

import numpy as np
import pytest

from bellis import Roi, Task
from bellis._plan._costs import per_block_overhead, pick, predict_costs, warm_up, z_order
from bellis._plan._forecast import _hints, sample_size
from bellis._task_spec import TaskSpec
from bellis.errors import ConfigurationError


def test_the_default_sample_is_two_percent_and_at_least_twenty() -> None:
    assert sample_size(100_000, True) == 2000
    assert sample_size(3000, True) == 60
    assert sample_size(500, True) == 20
    assert sample_size(7, True) == 7  # never more than is left
    assert sample_size(3000, 5) == 5 and sample_size(0, True) == 0


def test_a_sample_covers_the_grid_and_only_blocks_left() -> None:
    left = np.ones((32, 40), dtype=bool)
    left[:, 32:] = False  # done
    picks = pick(left, 64, None, np.random.default_rng(0))
    assert len(picks) == len(set(picks.tolist())) == 64
    coords = np.stack(np.unravel_index(picks, left.shape), axis=1)
    assert left.reshape(-1)[picks].all()
    # one pick per equal slice of the blocks left in Z-order: here each slice is a 4 x 4
    # square, so every 4 x 4 square of the 32 x 32 blocks left holds exactly one pick
    cells = np.zeros((8, 8), dtype=int)
    np.add.at(cells, (coords[:, 0] // 4, coords[:, 1] // 4), 1)
    assert (cells == 1).all(), cells


def test_a_cost_hint_steers_the_sample_to_costly_blocks() -> None:
    left = np.ones(2000, dtype=bool)
    hint = np.ones(2000)
    hot = np.arange(0, 2000, 20)  # 5% of the blocks, 20x the cost
    hint[hot] = 20.0
    rng = np.random.default_rng(1)
    with_hint = pick(left, 40, hint, rng)
    without = pick(left, 40, None, np.random.default_rng(1))
    assert len(with_hint) == 40
    assert np.isin(with_hint, hot).sum() > 3 * max(1, np.isin(without, hot).sum())


def test_a_workers_first_blocks_pay_its_warm_up_and_keep_their_own_cost() -> None:
    # three workers of 8 blocks each: every first block 0.2 s over its cost, every
    # second 0.05 s; costs 0.01 s, and one costly block (0.5 s) that came first to worker 2
    cost = np.full((3, 8), 0.01)
    cost[2, 0] = 0.5
    wall = cost.copy()
    wall[:, 0] += 0.2
    wall[:, 1] += 0.05
    worker = np.repeat(np.arange(3), 8)
    sent = np.tile(np.arange(8.0), 3)
    order = np.random.default_rng(3).permutation(24)  # the store's order is the grid's
    warm, steady = warm_up(worker[order], sent[order], wall.reshape(-1)[order])
    assert warm == pytest.approx(0.25)
    # each block's cost as it runs once warm: the costly block keeps its own
    assert steady == pytest.approx(cost.reshape(-1)[order])
    # too few later blocks to tell: the walls as measured
    warm, steady = warm_up(worker[:2], sent[:2], wall.reshape(-1)[:2])
    assert warm is None and steady.tolist() == wall.reshape(-1)[:2].tolist()


def test_the_sample_follows_the_z_order_so_it_covers_every_axis() -> None:
    order = z_order(np.arange(16), (4, 4))
    coords = [tuple(int(x) for x in np.unravel_index(i, (4, 4))) for i in order]
    # each quarter of the order is one 2 x 2 quadrant
    quadrants = [{(r // 2, c // 2) for r, c in coords[q : q + 4]} for q in range(0, 16, 4)]
    assert all(len(q) == 1 for q in quadrants)
    assert set().union(*quadrants) == {(0, 0), (0, 1), (1, 0), (1, 1)}


def test_fast_blocks_share_a_round_trip_and_slow_ones_pay_it_alone() -> None:
    rt = 0.004
    per = per_block_overhead(rt, np.array([0.001, 0.005, 0.02, 1.0, 0.0]))
    # a batch holds what fits in BATCH_TARGET_SECONDS (0.02 s), at most MAX_BATCH
    assert per == pytest.approx([rt / 20, rt / 4, rt, rt, rt / 64])


def test_costs_come_from_the_nearest_sampled_block_or_a_line_in_the_hint() -> None:
    grid = (10, 10)
    sampled = np.array([0, 99])  # (0, 0) costs 1, (9, 9) costs 5
    costs = np.array([1.0, 5.0])
    targets = np.array([1, 10, 98, 89])  # two near each corner
    pred, model = predict_costs(grid, targets, sampled, costs, None)
    assert model == "the nearest sampled block" and pred.tolist() == [1.0, 1.0, 5.0, 5.0]
    hint = np.arange(100, dtype=float)
    sampled = np.array([0, 50, 99])
    pred, model = predict_costs(grid, np.array([20, 70]), sampled, 2 + hint[sampled], hint)
    assert model == "a line in cost_hint" and pred == pytest.approx([22.0, 72.0])


def test_a_cost_hint_of_the_wrong_shape_names_the_parameter_and_the_fix() -> None:
    t = Task("t", Roi((0, 0), (40, 40)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)))
    with pytest.raises(
        ConfigurationError,
        match=r"cost_hint has shape \[3, 3\] but task 't' has a block grid of shape \[4, 4\]",
    ):
        _hints(np.ones((3, 3)), [TaskSpec.of(t)])
    with pytest.raises(ConfigurationError, match="cost_hint names task 'u'"):
        _hints({"u": np.ones((4, 4))}, [TaskSpec.of(t)])
    with pytest.raises(ConfigurationError, match="negative or non-finite"):
        _hints(-np.ones((4, 4)), [TaskSpec.of(t)])
    assert _hints(np.ones((4, 4)), [TaskSpec.of(t)])["t"].shape == (16,)


def _noop(block: object) -> None:
    pass


def test_a_bad_sample_or_no_store_is_refused_before_anything_runs() -> None:
    import bellis

    t = Task(
        "t",
        Roi((0,), (40,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=_noop,
        tracking_path=False,
    )
    for bad in (0, -3, 2.5, "all"):
        with pytest.raises(ConfigurationError, match=f"sample={bad!r} is not a number of blocks"):
            bellis.plan(t, sample=bad, show=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="a forecast records its sampled blocks done"):
        bellis.plan(t, sample=5, show=False)


def test_a_sampled_block_brings_every_block_it_waits_for() -> None:
    from bellis._plan._dry import DryRun
    from bellis._plan._forecast import _close, _first_level
    from bellis._run._options import RunOptions
    from bellis._run._runner import RunSettings

    # 1-d, blocks of 10 with 5 of context: conflict levels, and b reads a's neighbours
    kw = {"process_function": _noop, "tracking_path": False}
    a = Task("a", Roi((0,), (210,)), Roi((0,), (20,)), Roi((5,), (10,)), **kw)
    b = Task("b", Roi((0,), (210,)), Roi((0,), (20,)), Roi((5,), (10,)), **kw)
    rp = RunSettings.build(a + b, RunOptions(multiprocessing=False, block_tracking=False))
    with DryRun(rp) as dry:
        run_a, run_b = dry.scheduler.runs
        assert run_a.intra and run_a.geom.num_levels == 2
        free = _first_level(dry, run_a)
        assert free.sum() == 10 and all(not run_a.geom.upstream_of(k) for k in np.flatnonzero(free))
        picks = {"b": np.array([7])}
        _close(dry, picks)
        chosen_a = set(picks["a"].tolist())
        edge = run_b.up_edges[0][0]
        assert set(edge.upstream_of(7)) <= chosen_a  # what b's block reads
        for k in chosen_a:  # and, within a, every lower-level block those wait for
            assert set(run_a.geom.upstream_of(k)) <= chosen_a
        assert any(run_a.geom.upstream_of(k) for k in chosen_a)  # the closure did work
        assert picks["b"].tolist() == [7]


def test_on_a_large_grid_the_nearest_sampled_block_is_found_along_the_z_order() -> None:
    import bellis._plan._costs as costs

    grid = (64, 64)
    rng = np.random.default_rng(2)
    sampled = rng.choice(64 * 64, size=80, replace=False)
    targets = np.setdiff1d(np.arange(64 * 64), sampled)
    exact = costs.nearest(grid, targets, sampled)
    cells, costs._NEAREST_CELLS = costs._NEAREST_CELLS, 1  # the Z-order path
    try:
        near = costs.nearest(grid, targets, sampled)
    finally:
        costs._NEAREST_CELLS = cells
    tc = np.stack(np.unravel_index(targets, grid), axis=1)
    sc = np.stack(np.unravel_index(sampled, grid), axis=1)
    d_exact = np.sqrt(((tc - sc[exact]) ** 2).sum(axis=1))
    d_near = np.sqrt(((tc - sc[near]) ** 2).sum(axis=1))
    assert (d_near >= d_exact - 1e-9).all()
    # near, though not always the nearest: within a few blocks of it, mostly the same one
    excess = d_near - d_exact  # the sample spacing here is about 7 blocks
    assert np.median(excess) == 0.0 and np.percentile(excess, 95) < 1.5 * 7
