"""The live page's wall-time distribution and trend (``_report._live_recent``), on
fabricated blocks: the fit's slope, the rising flag, the histogram and the lanes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bellis._block import NO_WORKER
from bellis._report._live_recent import (
    MIN_TREND_BLOCKS,
    driver_recent,
    lanes,
    race_marks,
    wall_histogram,
    wall_trend,
)


def test_a_steady_wall_time_is_no_trend() -> None:
    rng = random.Random(3)
    times = [1000.0 + i for i in range(200)]
    walls = [2.0 + rng.uniform(-0.3, 0.3) for _ in times]
    fit = wall_trend(times, walls)
    assert fit is not None and fit["blocks"] == 200
    assert abs(fit["slope_per_minute"]) < 0.1
    assert fit["rising"] is False


def test_a_wall_time_that_grows_is_a_rising_trend_with_its_slope() -> None:
    rng = random.Random(4)
    times = [5000.0 + 0.5 * i for i in range(240)]  # two minutes of blocks
    # 1 s at first, 0.02 s more per second of the run: 1.2 s per minute
    walls = [1.0 + 0.02 * (t - times[0]) + rng.uniform(-0.1, 0.1) for t in times]
    fit = wall_trend(times, walls)
    assert fit is not None
    assert fit["slope_per_minute"] == pytest.approx(1.2, rel=0.05)
    assert fit["r"] > 0.9 and fit["rise"] > 1.0
    assert fit["rising"] is True


def test_a_falling_wall_time_is_not_flagged() -> None:
    times = [float(i) for i in range(100)]
    walls = [10.0 - 0.05 * t for t in times]
    fit = wall_trend(times, walls)
    assert fit is not None and fit["slope_per_minute"] == pytest.approx(-3.0)
    assert fit["r"] == pytest.approx(-1.0) and fit["rising"] is False


def test_too_few_blocks_give_no_fit_or_no_flag() -> None:
    assert wall_trend([1.0, 2.0], [1.0, 5.0]) is None
    assert wall_trend([3.0, 3.0, 3.0], [1.0, 2.0, 3.0]) is None  # no span of time
    n = MIN_TREND_BLOCKS - 1
    fit = wall_trend([float(i) for i in range(n)], [1.0 + i for i in range(n)])
    assert fit is not None and fit["r"] == pytest.approx(1.0)
    assert fit["rising"] is False  # a steep rise, but over too few blocks


def test_the_histogram_counts_every_wall_time() -> None:
    walls = [0.1, 0.2, 0.2, 0.9, 1.0]
    h = wall_histogram(walls, bins=5)
    assert len(h["edges"]) == 6 and h["edges"][0] == 0.0 and h["edges"][-1] == 1.0
    assert h["counts"] == [1, 2, 0, 0, 2]
    assert sum(wall_histogram([0.5] * 37)["counts"]) == 37
    assert wall_histogram([]) == {"edges": [], "counts": []}


def test_lanes_group_blocks_by_worker_in_start_order() -> None:
    worker = np.array([7, 3, 7, NO_WORKER, 3])
    sent = np.array([20.0, 1.0, 10.0, 5.0, 30.0])
    returned = sent + 2.0
    cells = np.array([4, 0, 9, 2, 5])
    rss = np.array([2**20, 2 * 2**20, 3 * 2**20, 0, 2**21])
    wall = np.array([2.0, 2.0, 2.0, 2.0, 0.0])
    cpu = np.array([1.0, 2.0, 0.5, 1.0, 1.0])
    got = lanes(worker, sent, returned, cells, rss, cpu, wall)
    assert [lane["worker"] for lane in got] == ["3", "7", "driver"]
    assert [[b[2] for b in lane["blocks"]] for lane in got] == [[0, 5], [9, 4], [2]]
    assert list(got[1]["blocks"][0]) == [10.0, 12.0, 9, 3.0, 0.25, None]
    assert got[0]["blocks"][1][4] is None  # no wall time: no CPU share
    bare = lanes(worker, sent, returned, cells, None, None, wall, np.array([0, 0, 0, 0, 1]), 1.0)
    assert list(bare[0]["blocks"][0]) == [0.0, 2.0, 0, None, None, False]  # after origin 1.0
    assert bare[0]["blocks"][1][5] is True  # the failed one (index 4)


def test_driver_lanes_and_race_marks() -> None:
    # (worker, sent, returned, k, ok): what the scheduler appends as it takes blocks back
    entries = [(0, 100.0, 101.0, 3, True), (1, 100.5, 102.0, 4, False), (0, 101.0, 101.5, 5, True)]
    got = driver_recent(entries, lambda k: k * 10)
    assert got is not None and got["source"] == "driver"
    assert (got["start"], got["end"], got["blocks"], got["workers"]) == (100.0, 102.0, 3, 2)
    rows = {lane["worker"]: [list(b) for b in lane["blocks"]] for lane in got["lanes"]}
    assert rows == {
        "0": [[0.0, 1.0, 30, None, None, False], [1.0, 1.5, 50, None, None, False]],
        "1": [[0.5, 2.0, 40, None, None, True]],
    }
    assert sum(got["histogram"]["counts"]) == 3
    assert driver_recent([], lambda k: k) is None
    serial = driver_recent([(-1, 1.0, 2.0, 0, True)], lambda k: k)
    assert serial is not None and serial["lanes"][0]["worker"] == "driver"
    # a race: block 4, the copy on worker 1 (sent 105) won over the original on worker 0
    # (sent 100), the race ending at 107
    marks = race_marks([(4, 1, 105.0, 0, 100.0, 107.0, True)], lambda k: k * 10)
    assert marks == [
        {"cell": 40, "worker": "1", "start": 105.0, "end": 107.0, "kind": "backup", "won": True},
        {
            "cell": 40,
            "worker": "0",
            "start": 100.0,
            "end": 107.0,
            "kind": "straggler",
            "won": False,
        },
    ]
    # the original won: it is the straggler that won, the copy lost
    marks = race_marks([(4, 0, 100.0, 1, 105.0, 107.0, False)], lambda k: k)
    assert [(m["worker"], m["kind"], m["won"]) for m in marks] == [
        ("0", "straggler", True),
        ("1", "backup", False),
    ]
