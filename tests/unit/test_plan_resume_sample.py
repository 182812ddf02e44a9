"""Issue 35, item 2: the forecast's pure parts on a half-done store
(``bellis._plan._costs``): the sample takes only blocks left to do, and only the sample
run's own timings (its clock, its run) feed the forecast. numpy only, no clock: the
stamps are scripted."""

from __future__ import annotations

import numpy as np
import pytest

from bellis._plan._costs import choose, in_window, round_trips, sample_outcome

#: the sample run, on the server's clock (seconds since the epoch)
RUN = (1_765_000_000.0, 1_765_000_004.0)
#: a block done in an earlier run, a day before
EARLIER = 1_764_913_600.0


def test_the_sample_takes_only_blocks_left_to_do() -> None:
    left = np.ones((20, 20), dtype=bool)
    left[:10] = False  # 200 of 400 done
    left[15, 3] = False  # one masked
    for seed in range(20):
        picked = choose(left, left, 20, None, np.random.default_rng(seed))
        assert len(picked) == len(set(picked.tolist())) == 20
        assert left.reshape(-1)[picked].all(), picked


def test_a_small_first_level_is_topped_up_from_blocks_left_only() -> None:
    left = np.zeros((10, 10), dtype=bool)
    left[5:] = True
    first = np.zeros_like(left)
    first[0:2] = True  # done blocks only: not left
    first[9, :3] = True  # three left
    picked = choose(left, first, 12, None, np.random.default_rng(0))
    assert len(picked) == 12 and left.reshape(-1)[picked].all()
    assert set(np.flatnonzero(first & left).tolist()) <= set(picked.tolist())


def test_fewer_left_than_asked_takes_every_block_left() -> None:
    left = np.zeros(400, dtype=bool)
    left[[3, 77, 150, 399]] = True
    picked = choose(left, left, 20, None, np.random.default_rng(0))
    assert picked.tolist() == [3, 77, 150, 399]
    assert choose(np.zeros(9, dtype=bool), np.zeros(9, dtype=bool), 5, None, None).size == 0


def test_only_blocks_stamped_inside_the_sample_run_count_as_run() -> None:
    # picked blocks after the sample run: 0 and 1 ran and are done; 2 ran and failed;
    # 3 is done without running in it (a check_function: never stamped); 4 is done
    # with an earlier run's stamps; 5 never ran
    done = np.array([1, 1, 0, 1, 1, 0], dtype=np.uint8)
    sent = np.array([RUN[0] + 0.1, RUN[0] + 0.2, RUN[0] + 0.3, 0.0, EARLIER, 0.0])
    back = np.array([RUN[0] + 0.2, RUN[0] + 0.3, RUN[0] + 0.4, 0.0, EARLIER + 0.1, 0.0])
    ran, completed, found_done = sample_outcome(done, sent, back, RUN)
    assert ran.tolist() == [True, True, True, False, False, False]
    assert completed.tolist() == [True, True, False, False, False, False]
    assert found_done.tolist() == [False, False, False, True, True, False]
    # without stamps (no resource tracking) a done block is taken as run
    ran, completed, found_done = sample_outcome(done, None, None, None)
    assert ran.tolist() == completed.tolist() == (done != 0).tolist()
    assert not found_done.any()


def test_stamps_out_of_order_or_not_finite_are_not_the_sample_runs() -> None:
    sent = np.array([RUN[0] + 1, RUN[0] + 1, np.nan, RUN[1] + 60, RUN[0] - 60])
    back = np.array([RUN[0] + 2, RUN[0] + 0.5, RUN[0] + 2, RUN[1] + 61, RUN[0] + 1])
    assert in_window(sent, back, RUN).tolist() == [True, False, False, False, False]


def test_a_round_trip_is_the_sample_runs_own() -> None:
    # one worker, two batches of 10 ms blocks, 1 ms out of the function per batch
    t = RUN[0] + 0.5
    worker = np.zeros(4, dtype=np.int64)
    sent = np.array([t, t, t + 0.021, t + 0.021])
    back = np.array([t + 0.021, t + 0.021, t + 0.042, t + 0.042])
    wall = np.full(4, 0.01)
    (rt,) = round_trips(worker, sent, back, wall, RUN)
    assert rt == pytest.approx(0.001, abs=1e-6)


def test_a_round_trip_over_foreign_stamps_raises_instead_of_lasting_months() -> None:
    # a block done before the sample, in another run (stamps 0: no resource tracking),
    # beside the sample's own: its span would be 56 years
    worker = np.zeros(4, dtype=np.int64)
    sent = np.array([0.0, RUN[0] + 0.1, RUN[0] + 0.2, RUN[0] + 0.3])
    back = np.array([0.0, RUN[0] + 0.2, RUN[0] + 0.3, RUN[0] + 0.4])
    with pytest.raises(ValueError, match="1 of 4 blocks have stamps outside the sample run"):
        round_trips(worker, sent, back, np.full(4, 0.01), RUN)
    sent[0], back[0] = EARLIER, EARLIER + 0.01
    with pytest.raises(ValueError, match="not the sample's own timings"):
        round_trips(worker, sent, back, np.full(4, 0.01), RUN)
