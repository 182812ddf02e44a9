"""Helpers that build a ``Task(skip_mask=...)`` from ROIs or a block-resolution volume.

The mask grid is ``Task.block_grid_shape``, anchored at the task's first block (the
write ROI of cell ``(0, ...)`` starts at ``total_write_roi.offset``), unlike the
tracking store's grid, which is anchored at ``total_roi`` (see docs/tracking.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ._block import _as_roi
from ._graph import TaskGeometry

__all__ = ["skip_mask_from_rois", "skip_mask_from_volume"]


def skip_mask_from_rois(
    task: Any, rois: Iterable[Any], *, skip_inside: bool = False
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A mask that skips every block whose write ROI misses all ``rois`` (or, with
    ``skip_inside=True``, every block whose write ROI touches one of them)."""
    g = TaskGeometry(
        task.task_id,
        task.total_roi,
        task.read_roi,
        task.write_roi,
        fit=task.fit,
        read_write_conflict=task.read_write_conflict,
    )
    touched = np.zeros(g.grid, dtype=bool)
    for roi in rois:
        r = _as_roi(roi, "rois")
        sel = []
        for i in range(g.dims):
            a = int(r.offset[i])
            b = a + int(r.shape[i])
            lo, hi = g.grid[i], 0
            for c in range(g.grid[i]):
                wb, we = g.write_interval(i, c)
                if wb < b and we > a:
                    lo, hi = min(lo, c), max(hi, c + 1)
            sel.append(slice(lo, hi) if hi > lo else slice(0, 0))
        touched[tuple(sel)] = True
    mask = touched if skip_inside else ~touched
    return mask.astype(np.uint8)


def skip_mask_from_volume(task: Any, volume: Any) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A mask from a boolean volume with one voxel per block (True = has work).

    The volume must have the shape of ``task.block_grid_shape``; blocks whose cell is
    False are skipped.
    """
    arr = np.asarray(volume)
    grid = list(task.block_grid_shape)
    if list(arr.shape) != grid:
        raise ValueError(
            f"volume has shape {list(arr.shape)} but task {task.task_id!r} has a block grid of "
            f"shape {grid}: pass one cell per block (see Task.block_grid_shape)"
        )
    mask: np.ndarray[Any, np.dtype[np.uint8]] = (arr == 0).astype(np.uint8)
    return mask
