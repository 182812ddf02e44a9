"""Which tracking cells hold blocks, and their write ROIs (issue 24 items 1 and 2).

The tracking grid is anchored at the total ROI, so read context (and a ``valid`` fit's
dropped partial block) leaves cells no block maps to. ``StoreLayout.block_cells`` and
``write_interval`` are checked against the scheduler's own block grid (``TaskGeometry``),
block by block, in every fit mode with context none, less than a block, more than a
block, and uneven; and again from the ``bellis_layout`` record alone, as readers see it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from funlib.geometry import Roi

from bellis._graph import TaskGeometry
from bellis._report._figures import NO_BLOCK, _state_codes
from bellis._tracking._layout import StoreLayout, format_roi, layout_record
from bellis._tracking._status import _render_map

FITS = ("valid", "overhang", "shrink")
# (upper-left, lower-right) context per axis, in a block of 8
CONTEXTS = [((0, 0), (0, 0)), ((3, 3), (3, 3)), ((11, 11), (11, 11)), ((1, 9), (17, 0))]


def _pair(fit: str, ul: tuple[int, int], lr: tuple[int, int]) -> tuple[TaskGeometry, StoreLayout]:
    total = Roi((-5, 2), (20 + ul[0] + lr[0], 29 + ul[1] + lr[1]))
    read = Roi((0, 0), (8 + ul[0] + lr[0], 8 + ul[1] + lr[1]))
    write = Roi(ul, (8, 8))
    geom = TaskGeometry("t", total, read, write, fit=fit, read_write_conflict=False)
    layout = StoreLayout(
        tuple(total.offset),
        tuple(total.shape),
        tuple(read.offset),
        tuple(read.shape),
        tuple(write.offset),
        tuple(write.shape),
        fit,
    )
    return geom, layout


@pytest.mark.parametrize("fit", FITS)
@pytest.mark.parametrize(("ul", "lr"), CONTEXTS)
@pytest.mark.parametrize("from_record", [False, True], ids=["layout", "record"])
def test_blocks_and_their_write_rois_are_the_schedulers(
    fit: str, ul: tuple[int, int], lr: tuple[int, int], from_record: bool
) -> None:
    geom, layout = _pair(fit, ul, lr)
    if from_record:
        restored = StoreLayout.from_record(layout_record(layout))
        assert restored is not None
        layout = restored
    assert layout.block_grid == geom.grid
    assert layout.block_count == geom.num_blocks
    blocks = {}
    for k in range(geom.num_blocks):
        roi = geom.write_roi_of(k)
        cell = layout.tracking_cell(tuple(int(v) for v in roi.offset))
        assert cell >= 0
        coord = tuple(int(v) for v in np.unravel_index(cell, layout.grid_shape))
        blocks[coord] = (tuple(int(v) for v in roi.begin), tuple(int(v) for v in roi.end))
    assert len(blocks) == geom.num_blocks  # no two blocks share a cell
    masks = layout.block_axis_masks()
    for coord in itertools.product(*(range(g) for g in layout.grid_shape)):
        assert layout.write_roi_of_cell(coord) == blocks.get(coord), coord
        assert all(m[c] for m, c in zip(masks, coord, strict=True)) == (coord in blocks)
    assert math.prod(layout.grid_shape) - len(blocks) == sum(
        layout.write_roi_of_cell(c) is None
        for c in itertools.product(*(range(g) for g in layout.grid_shape))
    )


def test_a_record_of_another_grid_or_version_gives_no_layout() -> None:
    _, layout = _pair("valid", (3, 3), (3, 3))
    record = layout_record(layout)
    assert StoreLayout.from_record(None) is None
    assert StoreLayout.from_record({**record, "version": 99}) is None
    assert StoreLayout.from_record({**record, "grid_shape": [1, 1]}) is None
    assert StoreLayout.from_record({**record, "fit": "wobbly"}) is None
    assert StoreLayout.from_record({**record, "write_stride": [0, 8]}) is None
    assert StoreLayout.from_record({**record, "context_ul": [3]}) is None


def test_format_roi_is_half_open() -> None:
    assert format_roi((0, -8), (32, 0)) == "[0:32, -8:0)"


def test_the_map_draws_cells_of_no_block_apart_from_untouched_ones() -> None:
    done = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=bool)
    failed = np.zeros_like(done)
    failed[1, 1] = True
    block = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=bool)
    lines, k = _render_map(done, failed, 80, 40, block)
    assert k == 1 and [s.strip() for s in lines] == ["##-", "#x-", "---"]
    # downsampled: a square counts its blocks only
    big = np.zeros((4, 4), dtype=bool)
    big_block = np.zeros((4, 4), dtype=bool)
    big_block[:2, :3] = True
    big[:2, :3] = True
    lines, k = _render_map(big, np.zeros_like(big), 6, 40, big_block)
    assert k == 2 and [s.strip() for s in lines] == ["##", "--"]
    # without a layout every cell counts, and a cell not done is "."
    lines, _ = _render_map(done, np.zeros_like(done), 80, 40, None)
    assert [s.strip() for s in lines] == ["##.", "#..", "..."]


def test_state_codes_mark_cells_of_no_block() -> None:
    done = np.array([True, False, False, True])
    failures = np.array([0, 0, 2, 1])
    block = np.array([True, True, True, False])
    assert _state_codes(done, failures, block).tolist() == [1.0, 0.0, 3.0, NO_BLOCK]
