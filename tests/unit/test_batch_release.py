"""The server's one-step take-back of a batch of plain successes (``_returns._release_all``)
keeps the same figures as block-by-block: Welford, the task's aggregates, a worker's
timeline. Scripted values, no clock."""

from __future__ import annotations

import math
import random

import pytest

from bellis._stats._aggregates import TaskAggregates, Welford
from bellis._stats._timeline import WorkerTimeline


def _same(a: Welford, b: Welford) -> None:
    assert a.n == b.n
    for name in ("mean", "min", "max", "total", "variance"):
        x, y = getattr(a, name), getattr(b, name)
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12), (name, x, y)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 500])
def test_add_repeated_is_n_adds(n: int) -> None:
    rng = random.Random(n)
    one, many = Welford(), Welford()
    for _ in range(5):
        x = rng.uniform(0, 3)
        one.add(x)
        many.add(x)
    x = rng.uniform(0, 3)
    for _ in range(n):
        one.add(x)
    many.add_repeated(x, n)
    _same(one, many)


def test_add_repeated_on_an_empty_accumulator() -> None:
    one, many = Welford(), Welford()
    for _ in range(4):
        one.add(0.25)
    many.add_repeated(0.25, 4)
    _same(one, many)
    assert many.variance == 0.0


def test_round_trips_in_one_are_add_block_per_block() -> None:
    one, many = TaskAggregates(), TaskAggregates()
    rng = random.Random(3)
    # more than one fold's worth, with failures and single blocks between the batches
    for batch in range(40):
        step = rng.uniform(1e-5, 1e-3)
        n = rng.randint(1, 300)
        for _ in range(n):
            one.add_block(step, None, False)
        many.add_round_trips(step, n)
        if batch % 7 == 0:
            one.add_block(None, None, True)
            many.add_block(None, None, True)
    assert one.count == many.count
    assert one.failed_attempts == many.failed_attempts
    a, b = one.to_json(), many.to_json()
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            for f in a[key]:
                x, y = a[key][f], b[key][f]
                if isinstance(x, float):
                    assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12), (key, f, x, y)
                else:
                    assert x == y, (key, f)
        else:
            assert a[key] == b[key], key
    assert math.isclose(one.trend.slope, many.trend.slope, rel_tol=1e-9, abs_tol=1e-15)


def test_a_batch_on_the_timeline_is_its_blocks_one_by_one() -> None:
    one, many = WorkerTimeline(1, 0.0), WorkerTimeline(1, 0.0)
    for tl in (one, many):
        tl.first_acquire(0.5)
    t = 0.75
    for n, step in ((3, 0.01), (1, 0.2), (50, 0.001)):
        u = t
        for _ in range(n):
            one.sent(u)
            one.returned(u + step)
            u += step
        many.ran_batch(t, step, n)
        t = u + 0.05  # the next request's wait
    assert one.blocks == many.blocks == 54
    _same(one.idle, many.idle)
    _same(one.compute, many.compute)


def test_a_batch_while_a_block_is_out_is_refused() -> None:
    tl = WorkerTimeline(2, 0.0)
    tl.sent(1.0)
    with pytest.raises(ValueError, match="in flight"):
        tl.ran_batch(1.0, 0.1, 3)
