"""Whole-grid arithmetic with numpy over the block grids of :mod:`bellis._graph`.

Owns: which blocks of a downstream task read which blocks of an upstream one
(:func:`downstream_readers`, used at run start for stale blocks and by
``bellis verify --reset``), the tracking-grid view of a block grid (:func:`block_view`),
and the in-place bulk dependency counts the scheduler initialises a run with.
May import: the model (``_block``, ``_graph``). Imported by ``_scheduling``, ``_run``
and ``_outputs``; never by ``_graph`` itself, which stays free of numpy at import.
"""

from __future__ import annotations

import itertools
import mmap
from typing import Any

import numpy as np

from ._graph import InterTaskEdge, TaskGeometry

__all__ = [
    "add_product",
    "block_view",
    "downstream_readers",
    "edge_axis_counts",
    "store_product",
    "subtract_shifted",
    "zeroed",
]


# -- which blocks read which (whole grids, numpy) ------------------------------------


def block_view(
    g: TaskGeometry, cells: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], tuple[slice, ...]]:
    """The part of a tracking-grid array ``cells`` (any shape with the grid's cell count
    per axis) that covers the block grid of ``g``, and the block-grid slices it covers.

    Cell ``c`` of the tracking grid holds block ``c - g.sid_shift``; blocks past the
    tracking grid (possible with ``overhang``) have no cell and are left out.
    """
    src, dst = [], []
    for s, n, gn in zip(g.sid_shift, cells.shape, g.grid, strict=True):
        m = max(0, min(gn, n - s))
        src.append(slice(s, s + m))
        dst.append(slice(0, m))
    return cells[tuple(src)], tuple(dst)


def downstream_readers(
    up: TaskGeometry, down: TaskGeometry, redone: Any
) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Which blocks of ``down`` read at least one of the blocks ``redone`` of ``up``.

    ``redone`` is a boolean array over ``up.grid`` or an iterable of flat block indices
    of ``up`` (C order, as :meth:`TaskGeometry.index_of`); the answer is a boolean array
    over ``down.grid``. A block of ``down`` reads a block of ``up`` when its read ROI
    meets that block's write ROI: the dependency the scheduler orders them by (without
    ``write_safety`` widening, which orders but does not read). Linear in the two grids
    (a summed-area table), with no Python per block.

    Used at run start to find the done blocks that read a block redone after them
    (``_run/_provenance``), and by whatever invalidates blocks of an upstream task
    (``bellis verify --reset``) to find what must be redone downstream.
    """
    mask = redone
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
        mask = np.zeros(up.grid, dtype=bool)
        flat = np.fromiter((int(k) for k in redone), dtype=np.intp)
        if flat.size and (flat.min() < 0 or flat.max() >= up.num_blocks):
            raise ValueError(
                f"redone holds block indices outside task {up.task_id!r} (0 .. {up.num_blocks - 1})"
            )
        mask.reshape(-1)[flat] = True
    elif tuple(mask.shape) != tuple(up.grid):
        raise ValueError(
            f"redone has shape {list(mask.shape)}; task {up.task_id!r} has a block grid "
            f"of {list(up.grid)}"
        )
    if not down.num_blocks or not up.num_blocks or not mask.any():
        return np.zeros(down.grid, dtype=bool)
    return InterTaskEdge(up, down).done_counts(mask) > 0


# -- bulk dependency counts (numpy, in place; used by the scheduler) -------------------


def store_product(dst: np.ndarray[Any, Any], vecs: list[np.ndarray[Any, Any]]) -> None:
    """``dst[...] = vecs[0][:, None, ...] * vecs[1][None, :, ...] * ...`` in one pass.

    The product of all axes but the last is formed first (a ``1/n``-th of ``dst``),
    then multiplied by the last axis straight into ``dst``.
    """
    import numpy as np

    dtype = dst.dtype
    if dst.ndim == 1:
        dst[...] = vecs[0].astype(dtype)
        return
    outer = vecs[0]
    for v in vecs[1:-1]:
        outer = np.multiply.outer(outer, v)
    np.multiply(outer.astype(dtype)[..., None], vecs[-1].astype(dtype), out=dst)


def add_product(dst: np.ndarray[Any, Any], vecs: list[np.ndarray[Any, Any]]) -> None:
    """``dst += outer product of vecs``, one axis-0 slab at a time (no grid-size temporary)."""
    import numpy as np

    rest = vecs[1:]
    tail = np.ones(dst.shape[1:], dtype=dst.dtype)
    if rest:
        store_product(tail, rest)
    for i, c in enumerate(vecs[0].tolist()):
        if c:
            dst[i] += tail * dst.dtype.type(c)


def edge_axis_counts(edge: InterTaskEdge) -> list[np.ndarray[Any, Any]]:
    """Per axis of the downstream grid: how many upstream coordinates each one reads."""
    import numpy as np

    return [
        np.asarray(hi, dtype=np.int64) - np.asarray(lo, dtype=np.int64)
        for lo, hi in zip(edge.up_lo, edge.up_hi, strict=True)
    ]


def subtract_shifted(
    g: TaskGeometry, lvl: int, done: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]
) -> None:
    """Subtract from every block of level ``lvl`` (``dst``, the level's view of the
    dependency counts) how many of its upstream blocks are in ``done``; in place."""
    import numpy as np

    shape = g.level_shape(lvl)
    off = g.level_offsets[lvl]
    for combo in itertools.product(*g.up_offsets[lvl]):
        src = []
        dsl = []
        for i in range(g.dims):
            e = combo[i]
            s = g.level_stride[i]
            # level coords j -> grid coords off + j*s + e, valid when in [0, grid)
            lo = 0
            while lo < shape[i] and off[i] + lo * s + e < 0:
                lo += 1
            hi = shape[i]
            while hi > lo and off[i] + (hi - 1) * s + e >= g.grid[i]:
                hi -= 1
            dsl.append(slice(lo, hi))
            start = off[i] + lo * s + e
            src.append(slice(start, start + (hi - lo - 1) * s + 1 if hi > lo else start, s))
        if any(d.stop <= d.start for d in dsl):
            continue
        part = dst[tuple(dsl)]
        np.subtract(part, done[tuple(src)], out=part, casting="unsafe")


#: arrays of at least this many bytes are anonymous maps (see :func:`zeroed`)
_MAP_BYTES = 1 << 24


def zeroed(n: int, dtype: Any) -> np.ndarray[Any, Any]:
    """A zeroed 1-D array of ``n`` elements for per-block state.

    A large one is an anonymous memory map rather than numpy's allocation: numpy asks
    for transparent huge pages on large arrays, and where the kernel compacts memory to
    find them at first touch (THP ``defrag=madvise``), touching 1 GB of them took 8-9 s
    instead of 3-4 s with ordinary pages. The map is freed with the array.
    """
    import numpy as np

    nbytes = n * np.dtype(dtype).itemsize
    if nbytes < _MAP_BYTES:
        return np.zeros(n, dtype=dtype)
    buf = mmap.mmap(-1, nbytes)
    return np.frombuffer(buf, dtype=dtype, count=n)
