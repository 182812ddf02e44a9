"""Locality-aware hand-out: each connection gets a spatially coherent stream of blocks.

Theory of operation
-------------------
A task's blocks are ranked by the Morton (Z-order) key of their grid position, the last
axis in the lowest bit: ``k_at[p]`` is the block at position ``p`` of that order and
``pos_of[k]`` its position (uint32 arrays, built once with numpy, read through
``memoryview``s). The ready set is a ``bytearray`` over positions, 1 where a block is
ready: the scheduler sets a byte where it readies a block (a release's dependants, a
retry) and ``bytearray.find(1, start, end)`` (``memchr``) finds the next ready block at or
after a position. No Python object per block.

Each connection is a :class:`Stream`: it owns a *region* ``[lo, limit)`` of positions and a
cursor in it. It takes the next ready block at or after its cursor less a look-back of a
few Morton cells (blocks readied behind it by the conflict levels of its own releases are
taken while they are near). When its region has nothing ready ahead, it sweeps its region
from ``lo``; with nothing there either it moves: to a free region (one an ended stream or
a moved one left) with a ready block, else it splits the region of the stream with the
most positions left ahead of its cursor and takes the far half (work stealing: the victim
keeps the half it is about to reach); with nothing to split, it takes the first ready block
anywhere, so a ready block is always found while one exists. The regions of the streams
and the free regions cover all positions, so a block readied in a region nobody works in
waits in a free region, not forever.

This is an order among ready blocks only: a block is in the ready set only once its
dependencies are met (conflict levels, upstream tasks), so every rule of the scheduler
holds whatever the order; retries, blocks given back unstarted and blocks that failed in an
earlier run keep the queues they have without locality (:mod:`._scheduler`).

:class:`Coherence` measures how coherent the streams were: per connection (a worker's,
for every worker that opens one), each block sent after its first is *local* when it is a
grid neighbour (Chebyshev distance 1, or the same block again) of the connection's previous
block, and the grid distance between the two is summed for the mean step.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

__all__ = [
    "FOLD_BLOCKS",
    "MAX_LOCALITY_BLOCKS",
    "Coherence",
    "LocalityOrder",
    "Stream",
    "morton_order",
]

#: tasks with more blocks keep the FIFO order: the order (two uint32 arrays and a byte a
#: block) costs 9 bytes a block, 72 MiB at this size, and its build 2-3 s here
MAX_LOCALITY_BLOCKS: Final = 1 << 23
#: free regions kept at most (adjacent ones merge); the oldest is dropped past it (its
#: ready blocks are still found by the search of the whole order)
_MAX_FREE: Final = 64
#: a connection's blocks buffered before :class:`Coherence` counts them (a list of ints:
#: 36 bytes a block at most, so 144 KiB a connection)
FOLD_BLOCKS: Final = 1 << 12


def morton_order(grid: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """The flat C-order indices of a block grid's cells, sorted by their Morton key (the
    last axis in the lowest bit; an axis with fewer bits drops out of the interleave)."""
    n = math.prod(grid)
    dims = len(grid)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    nbits = [(g - 1).bit_length() for g in grid]
    tables = [np.zeros(g, dtype=np.int64) for g in grid]
    out = 0
    for j in range(max(nbits, default=0)):
        for i in range(dims - 1, -1, -1):
            if j < nbits[i]:
                tables[i] |= ((np.arange(grid[i], dtype=np.int64) >> j) & 1) << out
                out += 1
    key = np.zeros(grid, dtype=np.int64)
    for i, t in enumerate(tables):
        shape = [1] * dims
        shape[i] = grid[i]
        key |= t.reshape(shape)
    flat = key.reshape(-1)
    empty = np.iinfo(np.uint32).max
    if (1 << out) <= 4 * n and n < empty:
        # the keys are distinct and fewer than 2^out: each block in its key's slot, then
        # the slots in order (linear; a sort of 10^6 keys takes ten times as long)
        slots = np.full(1 << out, empty, dtype=np.uint32)
        slots[flat] = np.arange(n, dtype=np.uint32)
        order: np.ndarray[Any, Any] = slots[slots != empty]
        return order
    return np.argsort(flat).astype(np.uint32)


class Stream:
    """One connection's place in a task's :class:`LocalityOrder`: its region ``[lo,
    limit)`` and its cursor (all 0 until its first block)."""

    __slots__ = ("cursor", "limit", "lo", "placed")

    def __init__(self) -> None:
        self.lo = 0
        self.cursor = 0
        self.limit = 0
        self.placed = False


class LocalityOrder:
    """The ready blocks of one task in Morton order, and the streams that take them."""

    def __init__(self, grid: tuple[int, ...]) -> None:
        order = morton_order(grid)
        self.size = int(order.size)
        pos = np.empty(self.size, dtype=np.uint32)
        pos[order] = np.arange(self.size, dtype=np.uint32)
        self._order = order
        self._pos = pos
        self.k_at = _view(order)
        self.pos_of = _view(pos)
        self.bits = bytearray(self.size)
        #: how far back of its cursor a stream looks: two levels of Morton cells
        self.back = 1 << (2 * len(grid))
        self.streams: list[Stream] = []
        #: regions nobody works in, as streams with no connection
        self.free: list[Stream] = []
        #: the stream of callers that name none (the public ``Scheduler`` API)
        self.default = Stream()

    def fill(self, ready: np.ndarray[Any, Any]) -> None:
        """Mark ready the blocks where ``ready`` (one bool per block, C order) is true."""
        np.frombuffer(self.bits, dtype=np.uint8)[:] = ready.reshape(-1)[self._order]

    def take(self, s: Stream) -> int:
        """The next block of stream ``s`` (its ready byte cleared); -1 when none is ready."""
        if not s.placed:
            self._place(s)
        start = s.cursor - self.back
        if start < s.lo:
            start = s.lo
        bits = self.bits
        p = bits.find(1, start, s.limit)
        if p < 0:
            p = self._elsewhere(s)
            if p < 0:
                return -1
        bits[p] = 0
        s.cursor = p + 1
        return self.k_at[p]

    def drop(self, s: Stream) -> None:
        """Stream ``s`` ends (its connection closed): its region is left free."""
        if not s.placed:
            return
        s.placed = False
        try:
            self.streams.remove(s)
        except ValueError:
            return
        self._leave(s.lo, s.limit)

    # -- where a stream goes ---------------------------------------------------------
    def _place(self, s: Stream) -> None:
        """A new stream's region: a free one, else the far half of the largest one left."""
        s.placed = True
        if self.free:
            f = self.free.pop()
            s.lo, s.cursor, s.limit = f.lo, f.cursor, f.limit
        elif not self.streams:
            s.lo, s.cursor, s.limit = 0, 0, self.size
        else:
            v = max(self.streams, key=_left)
            if v.limit - v.cursor >= 2:
                mid = v.cursor + (v.limit - v.cursor) // 2
                s.lo = s.cursor = mid
                s.limit = v.limit
                v.limit = mid
            else:  # nothing left to split: an empty region, and its first take looks on
                s.lo = s.cursor = s.limit = 0
        self.streams.append(s)

    def _elsewhere(self, s: Stream) -> int:
        """Nothing ready near ``s``'s cursor: its region from the start, a free region, the
        far half of the largest region left, or any ready block (-1: none at all)."""
        bits = self.bits
        p = bits.find(1, s.lo, s.limit)
        if p >= 0:
            return p
        for i in range(len(self.free) - 1, -1, -1):
            f = self.free[i]
            p = bits.find(1, f.lo, f.limit)
            if p >= 0:
                del self.free[i]
                self._leave(s.lo, s.limit)
                s.lo, s.limit = f.lo, f.limit
                return p
        others = [v for v in self.streams if v is not s]
        if others:
            v = max(others, key=_left)
            if v.limit - v.cursor >= 2:
                mid = v.cursor + (v.limit - v.cursor) // 2
                p = bits.find(1, mid, v.limit)
                if p >= 0:
                    self._leave(s.lo, s.limit)
                    s.lo, s.limit = mid, v.limit
                    v.limit = mid
                    return p
        return bits.find(1)

    def _leave(self, lo: int, limit: int) -> None:
        """Keep ``[lo, limit)`` as a free region (merged with an adjacent one)."""
        if limit <= lo:
            return
        for f in self.free:
            if f.limit == lo:
                f.limit = limit
                return
            if f.lo == limit:
                f.lo = f.cursor = lo
                return
        f = Stream()
        f.lo = f.cursor = lo
        f.limit = limit
        self.free.append(f)
        if len(self.free) > _MAX_FREE:
            del self.free[0]


def _view(arr: np.ndarray[Any, Any]) -> memoryview[int]:
    """A typed memoryview of a uint32 array: element access without numpy scalars."""
    raw: Any = arr.data
    mv: memoryview[int] = raw.cast("B").cast("I")
    return mv


def _left(s: Stream) -> int:
    return s.limit - s.cursor


class Coherence:
    """How coherent each connection's stream of blocks was (see the module docstring).

    Each connection gets a *trail* (:meth:`trail`), to which the dispatcher appends the
    blocks it sends (one ``list.extend`` per batch: no numpy, no arithmetic per block);
    a trail is folded into the counts with numpy when it grows past :data:`FOLD_BLOCKS`
    blocks (:meth:`fold`), when its connection ends (:meth:`retire`) and when the counts
    are read (:meth:`counts`).
    """

    __slots__ = ("_blocks", "_local", "_steps", "_trails", "grid")

    def __init__(self, grid: tuple[int, ...]) -> None:
        self.grid = grid
        self._blocks = 0
        self._local = 0
        self._steps = 0
        self._trails: list[list[int]] = []

    def trail(self) -> list[int]:
        """A new connection's trail: the blocks it was sent, in order, not yet counted
        (after the last one counted, the previous block of the next)."""
        trail: list[int] = []
        self._trails.append(trail)
        return trail

    def retire(self, trail: list[int]) -> None:
        """The connection of ``trail`` ended: its blocks are counted, the trail dropped."""
        self.fold(trail)
        try:
            self._trails.remove(trail)
        except ValueError:
            pass

    def note(self, trail: list[int], held: list[int]) -> None:
        """``held`` (flat block indices, in order) go to the connection of ``trail`` (what
        the dispatcher does inline)."""
        trail.extend(held)
        if len(trail) > FOLD_BLOCKS:
            self.fold(trail)

    def counts(self) -> tuple[int, int, int]:
        """``(blocks, local, steps)``: blocks handed to a worker after its first; of them,
        those next to (a grid neighbour of, or the same as) the worker's previous block;
        the sum of their grid (Chebyshev) distances to it, in blocks."""
        for trail in self._trails:
            self.fold(trail)
        return self._blocks, self._local, self._steps

    def fold(self, buf: list[int]) -> None:
        """Count the steps in ``buf``; keep its last block only."""
        if len(buf) < 2:
            return
        ks = np.asarray(buf, dtype=np.int64)
        coords = np.stack(np.unravel_index(ks, self.grid))
        steps = np.abs(np.diff(coords, axis=1)).max(axis=0)
        self._blocks += int(steps.size)
        self._steps += int(steps.sum())
        self._local += int(np.count_nonzero(steps <= 1))
        del coords, ks
        del buf[:-1]
