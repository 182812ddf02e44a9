"""The forecast's pure parts (``bellis._plan._forecast``): how many blocks a sample takes,
which ones, how warm-up blocks are told apart, and the cost model. numpy only."""

from __future__ import annotations

import numpy as np
import pytest

from bellis import Roi, Task
from bellis._plan._forecast import _hints, _pick, _predict_costs, _warm_up, sample_size
from bellis.errors import ConfigurationError


def test_the_default_sample_is_two_percent_and_at_least_twenty() -> None:
    assert sample_size(100_000, True) == 2000
    assert sample_size(3000, True) == 60
    assert sample_size(500, True) == 20
    assert sample_size(7, True) == 7  # never more than is left
    assert sample_size(3000, 5) == 5 and sample_size(0, True) == 0


def test_a_sample_covers_the_grid_and_only_blocks_left() -> None:
    left = np.ones((40, 50), dtype=bool)
    left[:, :10] = False  # done
    picks = _pick(left, 40, None, np.random.default_rng(0))
    assert len(picks) == len(set(picks.tolist())) == 40
    coords = np.stack(np.unravel_index(picks, left.shape), axis=1)
    assert left.reshape(-1)[picks].all()
    # one pick per equal slice of the blocks left in grid order: here one per row
    assert sorted(coords[:, 0].tolist()) == list(range(40))
    assert coords[:, 1].min() >= 10


def test_a_cost_hint_steers_the_sample_to_costly_blocks() -> None:
    left = np.ones(2000, dtype=bool)
    hint = np.ones(2000)
    hot = np.arange(0, 2000, 20)  # 5% of the blocks, 20x the cost
    hint[hot] = 20.0
    rng = np.random.default_rng(1)
    with_hint = _pick(left, 40, hint, rng)
    without = _pick(left, 40, None, np.random.default_rng(1))
    assert len(with_hint) == 40
    assert np.isin(with_hint, hot).sum() > 3 * max(1, np.isin(without, hot).sum())


def test_each_workers_first_block_is_its_warm_up() -> None:
    # two workers, each first block 0.2 s slower; the rest 0.01 s
    worker = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    sent = np.array([0.0, 0.0, 0.3, 0.3, 0.4, 0.4, 0.5, 0.5])
    returned = sent + np.array([0.21, 0.21, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01])
    wall = returned - sent
    warm, steady = _warm_up(worker, sent, wall)
    assert warm == pytest.approx(0.2)
    assert steady.tolist() == [False, False, True, True, True, True, True, True]
    # too few blocks to tell: nothing is left out
    warm, steady = _warm_up(worker[:2], sent[:2], wall[:2])
    assert warm is None and steady.all()


def test_costs_come_from_the_nearest_sampled_block_or_a_line_in_the_hint() -> None:
    grid = (10, 10)
    sampled = np.array([0, 99])  # (0, 0) costs 1, (9, 9) costs 5
    costs = np.array([1.0, 5.0])
    targets = np.array([1, 10, 98, 89])  # two near each corner
    pred, model = _predict_costs(grid, targets, sampled, costs, None)
    assert model == "the nearest sampled block" and pred.tolist() == [1.0, 1.0, 5.0, 5.0]
    hint = np.arange(100, dtype=float)
    sampled = np.array([0, 50, 99])
    pred, model = _predict_costs(grid, np.array([20, 70]), sampled, 2 + hint[sampled], hint)
    assert model == "a line in cost_hint" and pred == pytest.approx([22.0, 72.0])


def test_a_cost_hint_of_the_wrong_shape_names_the_parameter_and_the_fix() -> None:
    t = Task("t", Roi((0, 0), (40, 40)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)))
    with pytest.raises(
        ConfigurationError,
        match=r"cost_hint has shape \[3, 3\] but task 't' has a block grid of shape \[4, 4\]",
    ):
        _hints(np.ones((3, 3)), [t])
    with pytest.raises(ConfigurationError, match="cost_hint names task 'u'"):
        _hints({"u": np.ones((4, 4))}, [t])
    with pytest.raises(ConfigurationError, match="negative or non-finite"):
        _hints(-np.ones((4, 4)), [t])
    assert _hints(np.ones((4, 4)), [t])["t"].shape == (16,)


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
    from bellis._run._runner import RunPlan

    # 1-d, blocks of 10 with 5 of context: conflict levels, and b reads a's neighbours
    kw = {"process_function": _noop, "tracking_path": False}
    a = Task("a", Roi((0,), (210,)), Roi((0,), (20,)), Roi((5,), (10,)), **kw)
    b = Task("b", Roi((0,), (210,)), Roi((0,), (20,)), Roi((5,), (10,)), **kw)
    rp = RunPlan.build(a + b, multiprocessing=False, block_tracking=False)
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
