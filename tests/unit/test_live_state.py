"""The live page's pure parts: block states, tiles, rates and the ETA range (issue 39)."""

from __future__ import annotations

import numpy as np

from bellis._report._live import (
    DONE,
    FAILED,
    MAP_CELLS,
    NO_BLOCK,
    PARTLY,
    RETRIED,
    UNTOUCHED,
    eta_range,
    state_codes,
    tile_codes,
    window_rates,
)


def test_state_codes_follow_done_failures_and_the_block_mask() -> None:
    done = np.array([[1, 1, 0, 0]], dtype=np.uint8)
    failures = np.array([[0, 2, 3, 0]], dtype=np.uint32)
    block = np.array([[True, True, True, False]])
    codes = state_codes(done, failures, block)
    assert codes.tolist() == [[DONE, RETRIED, FAILED, NO_BLOCK]]
    assert state_codes(done, failures, None).tolist() == [[DONE, RETRIED, FAILED, UNTOUCHED]]


def test_a_small_grid_is_not_tiled() -> None:
    codes = np.full((2, 3, 4), DONE, dtype=np.uint8)
    tiles, factors = tile_codes(codes)
    assert factors == (1, 1, 1)
    assert tiles is codes


def test_a_million_blocks_are_tiled_below_the_cap_and_keep_every_failure() -> None:
    codes = np.full((100, 100, 100), DONE, dtype=np.uint8)
    codes[50:, :, :] = UNTOUCHED  # half the volume not done yet
    codes[7, 33, 91] = FAILED
    codes[3, 3, 3] = RETRIED
    tiles, factors = tile_codes(codes)
    assert tiles.size <= MAP_CELLS
    assert tiles.shape == tuple(-(-s // f) for s, f in zip(codes.shape, factors, strict=True))
    failed_tile = (7 // factors[0], 33 // factors[1], 91 // factors[2])
    assert tiles[failed_tile] == FAILED
    assert int(np.count_nonzero(tiles == FAILED)) == 1
    assert tiles[3 // factors[0], 3 // factors[1], 3 // factors[2]] == RETRIED
    assert tiles[-1, 0, 0] == UNTOUCHED
    assert tiles[0, -1, -1] == DONE


def test_a_tile_across_the_done_edge_is_partly_done_and_a_tile_of_no_block_stays_empty() -> None:
    codes = np.full((1, 4, 4), UNTOUCHED, dtype=np.uint8)
    codes[0, 0, 0] = DONE
    codes[0, 2:, 2:] = NO_BLOCK
    tiles, factors = tile_codes(codes, max_cells=4)
    assert factors == (1, 2, 2)
    assert tiles.tolist() == [[[PARTLY, UNTOUCHED], [UNTOUCHED, NO_BLOCK]]]


def test_an_odd_grid_is_padded_with_no_block() -> None:
    codes = np.full((1, 1, 5), DONE, dtype=np.uint8)
    tiles, factors = tile_codes(codes, max_cells=3)
    assert factors == (1, 1, 2)
    assert tiles.tolist() == [[[DONE, DONE, DONE]]]


def test_window_rates_from_done_counts() -> None:
    points = [(0.0, 0), (10.0, 10), (20.0, 30), (30.0, 30), (40.0, 70)]
    # windows of 20 s before t=40: [20, 40] and [0, 20]
    assert window_rates(points, 40.0, 2, 20.0) == [2.0, 1.5]
    assert window_rates([(0.0, 5)], 1.0, 2, 20.0) == []


def test_eta_is_a_range_from_the_fastest_and_the_slowest_window() -> None:
    assert eta_range(100, [2.0, 1.0, 4.0]) == (25.0, 100.0)
    assert eta_range(100, [2.0, 0.0]) == (50.0, None)
    assert eta_range(100, []) is None
    assert eta_range(100, [0.0]) is None
    assert eta_range(0, []) == (0.0, 0.0)
