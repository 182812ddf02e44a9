"""The live page's map and counts updated from what changed (``_report._live_delta``).

Scripted sequences of the ``done`` and ``failures`` arrays (as a run changes them)
against the from-scratch answer (``state_codes`` and ``tile_codes``, ``bellis status``'s
counts) after every refresh: the same map and counts, with only the changed cells
decoded. Change detection is by content, so a rewrite that a file's timestamp could not
show (same size, same instant) is seen all the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from bellis._report._live import state_codes, tile_codes
from bellis._report._live_delta import SLAB, MapDelta, tile_factors, tile_index


def _scratch(
    done: NDArray[Any], failures: NDArray[Any], block: NDArray[np.bool_] | None, vol: Any, cap: int
) -> tuple[NDArray[np.uint8], tuple[int, int, int, int]]:
    codes = state_codes(done, failures, block).reshape(vol)
    tiles, _ = tile_codes(codes, cap)
    is_done, failed_any = done != 0, failures > 0
    counts = (
        int(np.count_nonzero(is_done)),
        int(np.count_nonzero(failed_any & ~is_done)),
        int(np.count_nonzero(failed_any & is_done)),
        int(failures.sum()),
    )
    return tiles, counts


@pytest.mark.parametrize(
    ("vol", "cap", "masked"),
    [((1, 1, 37), 1000, False), ((1, 30, 41), 100, True), ((9, 20, 13), 50, True)],
)
def test_the_delta_matches_the_map_from_scratch_after_each_change(
    vol: tuple[int, int, int], cap: int, masked: bool
) -> None:
    rng = np.random.default_rng(7)
    n = vol[0] * vol[1] * vol[2]
    block = (rng.random(n) < 0.9) if masked else None
    delta = MapDelta(vol, tile_factors(vol, cap), block)
    done = np.zeros(n, dtype=np.uint8)
    failures = np.zeros(n, dtype=np.uint32)
    for step in range(12):
        picked = rng.choice(n, size=max(1, n // 10), replace=False)
        if step % 3 == 2:  # failed attempts on some, cleared done markers on others
            failures[picked[::2]] += 1
            done[picked[1::2]] = 0
        else:
            done[picked] = 1
        changed = delta.update(done, failures)
        assert changed > 0
        tiles, counts = _scratch(done, failures, block, vol, cap)
        assert np.array_equal(delta.tiles(), tiles), step
        assert delta.totals.as_tuple() == counts, step
        assert np.array_equal(delta.failures, failures) and np.array_equal(delta.done, done)
    # a refresh with nothing changed decodes nothing and answers the same
    before = delta.tiles().copy()
    assert delta.update(done, failures) == 0
    assert np.array_equal(delta.tiles(), before)


def test_only_the_cells_that_changed_are_decoded() -> None:
    vol = (1, 100, 100)
    delta = MapDelta(vol, tile_factors(vol, 2500), None)
    done = np.zeros(10_000, dtype=np.uint8)
    failures = np.zeros(10_000, dtype=np.uint32)
    done[:5000] = 1
    assert delta.update(done, failures) == 5000
    done[5000:5100] = 1  # 1% more
    failures[7] = 2  # and a retried one
    assert delta.update(done, failures) == 101
    assert delta.totals.as_tuple() == (5100, 0, 1, 2)


def test_a_rewrite_no_timestamp_shows_is_seen() -> None:
    """Two refreshes of one array whose bytes change in place between them, its size the
    same (a mapped chunk's ``mtime`` need not move): the second shows the new state."""
    vol = (1, 1, 8)
    delta = MapDelta(vol, (1, 1, 1), None)
    done = np.zeros(8, dtype=np.uint8)
    failures = np.zeros(8, dtype=np.uint32)
    failures[3] = 1
    delta.update(done, failures)
    assert delta.tiles().reshape(-1).tolist() == [1, 1, 1, 4, 1, 1, 1, 1]
    done[3] = 1  # the retry succeeded: one byte, same file size
    delta.update(done, failures)
    assert delta.tiles().reshape(-1).tolist() == [1, 1, 1, 3, 1, 1, 1, 1]
    assert delta.totals.as_tuple() == (1, 0, 1, 1)


def test_a_hole_reads_as_zeros() -> None:
    vol = (1, 1, 10)
    delta = MapDelta(vol, (1, 1, 1), None)
    delta.update_slab(0, np.ones(10, dtype=np.uint8), np.full(10, 2, dtype=np.uint32))
    delta.update_slab(0, np.zeros(10, dtype=np.uint8), None)  # failures: a hole
    assert delta.totals.as_tuple() == (0, 0, 0, 0)
    assert delta.tiles().reshape(-1).tolist() == [1] * 10


def test_slabs_cover_an_array_longer_than_one() -> None:
    vol = (1, 1, SLAB + 5)
    delta = MapDelta(vol, tile_factors(vol, 1000), None)
    done = np.zeros(SLAB + 5, dtype=np.uint8)
    failures = np.zeros(SLAB + 5, dtype=np.uint32)
    done[-3:] = 1
    done[:2] = 1
    assert delta.update(done, failures) == 5
    assert delta.totals.done == 5


def test_tile_index_is_the_tile_of_each_cell() -> None:
    vol, factors = (5, 7, 9), (2, 4, 2)
    tiles_shape = tuple(-(-s // f) for s, f in zip(vol, factors, strict=True))
    cells = np.arange(5 * 7 * 9)
    coords = np.unravel_index(cells, vol)
    expect = np.ravel_multi_index(
        tuple(c // f for c, f in zip(coords, factors, strict=True)), tiles_shape
    )
    assert np.array_equal(tile_index(cells, vol, factors), expect)
