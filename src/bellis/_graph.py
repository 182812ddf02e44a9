"""Block grids, fit modes, read/write conflict levels and inter-task dependencies.

Theory of operation
-------------------
Everything here works in *grid units*. A task's blocks tile ``total_write_roi`` (the
total ROI shrunk by the read context) with stride ``write_roi.shape``; block ``g`` (an
n-d grid index, C order, flat index ``k``) has its read ROI at ``total.offset + g*w``.
The fit mode decides how many blocks an axis has (``valid`` floors, ``overhang`` and
``shrink`` ceil) and, for ``shrink``, clips the last block's ROIs.

With ``read_write_conflict`` the grid is cut into *levels*: per axis a level stride
``s`` (in blocks) is derived from the context, the level of a block is ``g mod s``, and
the level offsets are the cartesian product of ``range(s_i)`` in reverse. A block of level
``L > 0`` depends on the blocks of level ``L-1`` at per-axis offsets computed from the
difference of the two level offsets. Blocks of one level never conflict with each other.
The offset sets are separable per axis, so every per-block query is a handful of integer
operations, and every bulk query (dependency counts for a whole level) is an outer
product of small per-axis vectors.

Between tasks, a downstream block depends on every upstream block whose write ROI
intersects its read ROI. Both ROIs are boxes, so the set is a box of upstream grid
indices: per axis a contiguous range ``[lo, hi)``, precomputed once per axis.

No ``funlib.geometry.Roi`` is created on any per-block path; ROIs are built only when
user code asks for them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from funlib.geometry import Coordinate, Roi

from ._block import Block, BlockStatus, _as_roi, cantor_number
from .errors import ConfigurationError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "FITS",
    "BlockwiseDependencyGraph",
    "InterTaskEdge",
    "TaskGeometry",
]

FITS = ("valid", "overhang", "shrink")


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


class TaskGeometry:
    """The block grid of one task, in plain integers. Immutable after construction."""

    __slots__ = (
        "_down_fast",
        "_last_level",
        "_level_mult",
        "_rev_axes",
        "axis_strides",
        "ctx_lr",
        "ctx_ul",
        "dims",
        "down_offsets",
        "fit",
        "grid",
        "level_of_mod",
        "level_offsets",
        "level_stride",
        "num_blocks",
        "read_shape",
        "read_write_conflict",
        "sid_shift",
        "task_id",
        "total_offset",
        "total_shape",
        "tw_offset",
        "tw_shape",
        "up_offsets",
        "write_shape",
    )

    def __init__(
        self,
        task_id: str,
        total_roi: Any,
        read_roi: Any,
        write_roi: Any,
        *,
        fit: str = "valid",
        read_write_conflict: bool = True,
        unit_stride: tuple[int, ...] | None = None,
    ) -> None:
        total = _as_roi(total_roi, "total_roi")
        read = _as_roi(read_roi, "read_roi")
        write = _as_roi(write_roi, "write_roi")
        if fit not in FITS:
            raise ValueError(
                f"fit={fit!r} is not a fit mode; use one of 'valid', 'overhang' or 'shrink'"
            )
        dims = total.dims
        if read.dims != dims or write.dims != dims:
            raise ValueError(
                f"total_roi, read_roi and write_roi must have the same number of dimensions "
                f"(got {dims}, {read.dims} and {write.dims})"
            )
        if dims == 0:
            raise ValueError("total_roi must have at least one dimension")
        for name, roi in (("total_roi", total), ("read_roi", read), ("write_roi", write)):
            if any(s is None for s in roi.shape) or any(o is None for o in roi.offset):
                raise ValueError(f"{name} must be bounded on every axis (got {roi})")
            negative = [i for i, s in enumerate(roi.shape) if int(s) < 0]
            if negative:
                raise ConfigurationError(
                    f"{name} has a negative shape on axis {negative[0]}: "
                    f"Roi({tuple(int(o) for o in roi.offset)}, "
                    f"{tuple(int(s) for s in roi.shape)}). A Roi is (offset, shape), not "
                    f"(begin, end): for the region from begin to end pass "
                    f"Roi(begin, end - begin), with every end at or past its begin",
                    parameter=name,
                )
        self.task_id = task_id
        self.dims = dims
        self.fit = fit
        self.read_write_conflict = bool(read_write_conflict)
        self.total_offset = tuple(int(x) for x in total.offset)
        self.total_shape = tuple(int(x) for x in total.shape)
        self.read_shape = tuple(int(x) for x in read.shape)
        self.write_shape = tuple(int(x) for x in write.shape)
        if any(w <= 0 for w in self.write_shape):
            raise ValueError(f"write_roi must have a positive shape on every axis (got {write})")
        r_off = tuple(int(x) for x in read.offset)
        w_off = tuple(int(x) for x in write.offset)
        self.ctx_ul = tuple(wo - ro for wo, ro in zip(w_off, r_off, strict=True))
        self.ctx_lr = tuple(
            (ro + rs) - (wo + ws)
            for ro, rs, wo, ws in zip(r_off, self.read_shape, w_off, self.write_shape, strict=True)
        )
        if any(c < 0 for c in self.ctx_ul + self.ctx_lr):
            raise ValueError(
                f"read_roi {read} must contain write_roi {write}: the read context is "
                "write_roi.begin - read_roi.begin (and read_roi.end - write_roi.end), and "
                "neither may be negative"
            )
        self.tw_offset = tuple(o + c for o, c in zip(self.total_offset, self.ctx_ul, strict=True))
        self.tw_shape = tuple(
            s - a - b for s, a, b in zip(self.total_shape, self.ctx_ul, self.ctx_lr, strict=True)
        )
        grid = []
        for tw, w in zip(self.tw_shape, self.write_shape, strict=True):
            if tw <= 0:
                grid.append(0)
            elif fit == "valid":
                grid.append(tw // w)
            else:
                grid.append(_ceil_div(tw, w))
        self.grid = tuple(grid)
        self.num_blocks = math.prod(self.grid)
        strides = [1] * dims
        for i in range(dims - 2, -1, -1):
            strides[i] = strides[i + 1] * self.grid[i + 1]
        self.axis_strides = tuple(strides)
        # spatial ids are relative to total_roi, not total_write_roi
        self.sid_shift = tuple(c // w for c, w in zip(self.ctx_ul, self.write_shape, strict=True))

        # conflict levels, in grid units
        if self.read_write_conflict and self.num_blocks > 0:
            ls = []
            for i in range(dims):
                w = self.write_shape[i]
                need = _ceil_div(max(self.ctx_ul[i], self.ctx_lr[i]) + w, w)
                ls.append(max(1, min(need, self.grid[i])))
            self.level_stride = tuple(ls)
        else:
            self.level_stride = (1,) * dims
        if unit_stride is not None and self.num_blocks > 0:  # write_safety="serialize"
            self.level_stride = tuple(
                max(s, min(u, n))
                for s, u, n in zip(self.level_stride, unit_stride, self.grid, strict=True)
            )
        offsets = list(itertools.product(*(range(s) for s in self.level_stride)))
        offsets.reverse()
        self.level_offsets: tuple[tuple[int, ...], ...] = tuple(offsets)
        self.level_of_mod = {off: lvl for lvl, off in enumerate(offsets)}
        # per level, per axis: upstream offsets (into level-1) and downstream offsets (level+1)
        up: list[tuple[tuple[int, ...], ...]] = []
        down: list[tuple[tuple[int, ...], ...]] = []
        for lvl, cur in enumerate(offsets):
            if lvl == 0:
                up.append(tuple(() for _ in range(dims)))
            else:
                up.append(self._conflict_sets(offsets[lvl - 1], cur))
            if lvl + 1 < len(offsets):
                nxt = offsets[lvl + 1]
                sets = self._conflict_sets(cur, nxt)
                down.append(tuple(tuple(sorted(-e for e in axis)) for axis in sets))
            else:
                down.append(tuple(() for _ in range(dims)))
        self.up_offsets = tuple(up)
        self.down_offsets = tuple(down)
        # hot path of downstream_of: the level from the residues by arithmetic, and per level
        # the flat deltas of an interior block with the per-axis coordinate range [lo, hi)
        # in which no neighbour falls off the grid
        mult = [1] * dims
        for i in range(dims - 2, -1, -1):
            mult[i] = mult[i + 1] * self.level_stride[i + 1]
        self._level_mult = tuple(mult)
        self._last_level = len(offsets) - 1
        fast: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None] = []
        for sets in self.down_offsets:
            if any(not axis for axis in sets):
                fast.append(None)
                continue
            lo = tuple(max(0, -min(axis)) for axis in sets)
            hi = tuple(n - max(0, max(axis)) for n, axis in zip(self.grid, sets, strict=True))
            deltas = tuple(
                sum(e * st for e, st in zip(combo, self.axis_strides, strict=True))
                for combo in itertools.product(*sets)
            )
            fast.append((lo, hi, deltas))
        self._down_fast = tuple(fast)
        # (axis, blocks, level stride, level multiplier) from the last axis to the first:
        # one pass of divmod gives a block's coordinates and its level together
        self._rev_axes = tuple(
            (i, self.grid[i], self.level_stride[i], self._level_mult[i])
            for i in range(dims - 1, -1, -1)
        )

    def _conflict_sets(
        self, prev: tuple[int, ...], cur: tuple[int, ...]
    ) -> tuple[tuple[int, ...], ...]:
        out: list[tuple[int, ...]] = []
        for p, c, s in zip(prev, cur, self.level_stride, strict=True):
            d = p - c
            if d < 0:
                out.append((d, d + s))
            elif d == 0:
                out.append((0,))
            else:
                out.append((d - s, d))
        return tuple(out)

    # -- per-block integer queries ------------------------------------------------
    @property
    def num_levels(self) -> int:
        return len(self.level_offsets)

    def coords_of(self, k: int) -> list[int]:
        coords = [0] * self.dims
        for i in range(self.dims - 1, 0, -1):
            k, coords[i] = divmod(k, self.grid[i])
        coords[0] = k
        return coords

    def index_of(self, coords: Sequence[int]) -> int:
        k = 0
        for c, s in zip(coords, self.axis_strides, strict=True):
            k += c * s
        return k

    def level_of(self, coords: Sequence[int]) -> int:
        return self.level_of_mod[
            tuple(c % s for c, s in zip(coords, self.level_stride, strict=True))
        ]

    def _neighbors(self, coords: list[int], sets: tuple[tuple[int, ...], ...]) -> list[int]:
        sums = [0]
        for i in range(self.dims):
            g = coords[i]
            n = self.grid[i]
            st = self.axis_strides[i]
            valid = [e * st for e in sets[i] if 0 <= g + e < n]
            if not valid:
                return []
            if len(valid) == 1:
                v = valid[0]
                if v:
                    sums = [x + v for x in sums]
            else:
                sums = [x + v for x in sums for v in valid]
        return sums

    def level_of_index(self, k: int) -> int:
        """The conflict level of block ``k`` (integer arithmetic only)."""
        rank = 0
        for c, s, m in zip(self.coords_of(k), self.level_stride, self._level_mult, strict=True):
            rank += (c % s) * m
        return self._last_level - rank

    def level_zero_count_blocks(self, lvl: int) -> int:
        """How many blocks of level ``lvl`` have no in-grid upstream block (they start ready).

        Computed from per-axis counts, without materialising the level.
        """
        total = math.prod(self.level_shape(lvl))
        if lvl == 0 or total == 0:
            return total
        positive = 1
        for c in self.level_axis_counts(lvl):
            positive *= int((c > 0).sum())
        return total - positive

    def max_level_count(self) -> int:
        """An upper bound of any block's same-task upstream count."""
        best = 0
        for lvl in range(1, self.num_levels):
            best = max(best, math.prod(len(axis) for axis in self.up_offsets[lvl]))
        return best

    def downstream_of(self, k: int) -> list[int]:
        """Flat indices of the same-task blocks that wait for block ``k``."""
        return self.downstream_with_level(k)[1]

    def downstream_with_level(self, k: int) -> tuple[int, list[int]]:
        """``(level of k, downstream blocks of k)``: the scheduler's per-release query."""
        coords = [0] * self.dims
        rank = 0
        rem = k
        for i, n, s, m in self._rev_axes:
            rem, c = divmod(rem, n)
            coords[i] = c
            rank += (c % s) * m
        lvl = self._last_level - rank
        fast = self._down_fast[lvl]
        if fast is None:
            return lvl, []
        lo, hi, deltas = fast
        for c, a, b in zip(coords, lo, hi, strict=True):
            if c < a or c >= b:
                return lvl, [k + d for d in self._neighbors(coords, self.down_offsets[lvl])]
        return lvl, [k + d for d in deltas]

    def upstream_of(self, k: int) -> list[int]:
        coords = self.coords_of(k)
        lvl = self.level_of(coords)
        return [k + d for d in self._neighbors(coords, self.up_offsets[lvl])]

    def read_interval(self, axis: int, g: int) -> tuple[int, int]:
        b = self.total_offset[axis] + g * self.write_shape[axis]
        e = b + self.read_shape[axis]
        if self.fit == "shrink":
            te = self.total_offset[axis] + self.total_shape[axis]
            if e > te:
                e = te
        return b, e

    def write_interval(self, axis: int, g: int) -> tuple[int, int]:
        b = self.tw_offset[axis] + g * self.write_shape[axis]
        e = b + self.write_shape[axis]
        if self.fit == "shrink":
            te = self.tw_offset[axis] + self.tw_shape[axis]
            if e > te:
                e = te
        return b, e

    def read_roi_of(self, k: int) -> Roi:
        coords = self.coords_of(k)
        iv = [self.read_interval(i, g) for i, g in enumerate(coords)]
        return Roi(Coordinate(b for b, _ in iv), Coordinate(e - b for b, e in iv))

    def write_roi_of(self, k: int) -> Roi:
        coords = self.coords_of(k)
        iv = [self.write_interval(i, g) for i, g in enumerate(coords)]
        return Roi(Coordinate(b for b, _ in iv), Coordinate(e - b for b, e in iv))

    def spatial_id_of(self, k: int) -> int:
        coords = self.coords_of(k)
        return cantor_number([c + s for c, s in zip(coords, self.sid_shift, strict=True)])

    def index_of_block(self, block: Block) -> int:
        """The flat grid index of a block of this task, or -1 if it is not one."""
        if block._geom is self and block._k >= 0:
            return block._k
        w = block.write_roi
        coords = []
        for i in range(self.dims):
            rel = int(w.offset[i]) - self.tw_offset[i]
            g, r = divmod(rel, self.write_shape[i])
            if r or not 0 <= g < self.grid[i]:
                return -1
            coords.append(g)
        return self.index_of(coords)

    def block(self, k: int, status: int = BlockStatus.CREATED) -> Block:
        return Block._lazy(self, k, status)

    # -- bulk queries ---------------------------------------------------------------
    def level_slices(self, lvl: int) -> tuple[slice, ...]:
        off = self.level_offsets[lvl]
        return tuple(slice(o, None, s) for o, s in zip(off, self.level_stride, strict=True))

    def level_shape(self, lvl: int) -> tuple[int, ...]:
        off = self.level_offsets[lvl]
        return tuple(
            max(0, _ceil_div(n - o, s))
            for n, o, s in zip(self.grid, off, self.level_stride, strict=True)
        )

    def level_axis_counts(self, lvl: int) -> list[np.ndarray[Any, np.dtype[np.int64]]]:
        """Per axis, for each coordinate of level ``lvl``: how many in-grid upstream offsets.

        A block's upstream count is the product of its axes' entries (the offsets are
        separable), so a level's counts never need more than these small vectors.
        """
        import numpy as np  # lazily: worker processes never need numpy here

        shape = self.level_shape(lvl)
        off = self.level_offsets[lvl]
        out = []
        for i in range(self.dims):
            g = off[i] + self.level_stride[i] * np.arange(shape[i])
            c = np.zeros(shape[i], dtype=np.int64)
            for e in self.up_offsets[lvl][i]:
                c += (g + e >= 0) & (g + e < self.grid[i])
            out.append(c)
        return out

    def level_indices(self, lvl: int) -> Iterator[int]:
        """Flat indices of level ``lvl`` in cartesian order, lazily."""
        if not self.num_blocks:
            return
        off = self.level_offsets[lvl]
        ranges = [
            range(o * st, n * st, s * st)
            for o, s, n, st in zip(
                off, self.level_stride, self.grid, self.axis_strides, strict=True
            )
        ]
        if self.dims == 1:
            yield from ranges[0]
            return
        for parts in itertools.product(*ranges[:-1]):
            base = sum(parts)
            for x in ranges[-1]:
                yield base + x


class InterTaskEdge:
    """Block-level dependencies of ``down`` on ``up`` (write ROI of up ∩ read ROI of down).

    Per axis, ``up_lo/up_hi[g]`` is the range of upstream grid indices the downstream
    block at coordinate ``g`` reads, and ``down_lo/down_hi[j]`` the range of downstream
    coordinates that read upstream coordinate ``j``.
    """

    __slots__ = ("down", "down_hi", "down_lo", "up", "up_hi", "up_lo")

    def __init__(
        self,
        up: TaskGeometry,
        down: TaskGeometry,
        reach: Callable[[int, int], tuple[int, int]] | None = None,
    ) -> None:
        """``reach(axis, g)``: what a downstream block waits for along an axis (default:
        its read interval; ``_units.widened_interval`` adds the units it writes)."""
        if up.dims != down.dims:
            raise ValueError(
                f"task {down.task_id!r} has {down.dims} dimensions but its upstream task "
                f"{up.task_id!r} has {up.dims}"
            )
        self.up = up
        self.down = down
        self.up_lo: list[list[int]] = []
        self.up_hi: list[list[int]] = []
        self.down_lo: list[list[int]] = []
        self.down_hi: list[list[int]] = []
        interval = down.read_interval if reach is None else reach
        for i in range(up.dims):
            nu = up.grid[i]
            wiv = [up.write_interval(i, j) for j in range(nu)]
            lo_list, hi_list = [], []
            for g in range(down.grid[i]):
                a, b = interval(i, g)
                # intervals are sorted and disjoint: binary-search-free linear estimate
                w = up.write_shape[i]
                lo = max(0, (a - up.tw_offset[i]) // w)
                hi = min(nu, _ceil_div(b - up.tw_offset[i], w))
                while lo < hi and wiv[lo][1] <= a:
                    lo += 1
                while hi > lo and wiv[hi - 1][0] >= b:
                    hi -= 1
                lo_list.append(lo)
                hi_list.append(max(lo, hi))
            self.up_lo.append(lo_list)
            self.up_hi.append(hi_list)
            dlo = [0] * nu
            dhi = [0] * nu
            first = [-1] * nu
            for g in range(down.grid[i]):
                for j in range(lo_list[g], hi_list[g]):
                    if first[j] < 0:
                        first[j] = g
                    dhi[j] = g + 1
            for j in range(nu):
                dlo[j] = first[j] if first[j] >= 0 else 0
                if first[j] < 0:
                    dhi[j] = 0
            self.down_lo.append(dlo)
            self.down_hi.append(dhi)

    def downstream_of(self, k: int) -> list[int]:
        if not self.down.num_blocks:
            return []
        coords = self.up.coords_of(k)
        ranges = []
        for i, j in enumerate(coords):
            lo, hi = self.down_lo[i][j], self.down_hi[i][j]
            if lo >= hi:
                return []
            st = self.down.axis_strides[i]
            ranges.append(range(lo * st, hi * st, st))
        if len(ranges) == 1:
            return list(ranges[0])
        out = [0]
        for r in ranges:
            out = [x + y for x in out for y in r]
        return out

    def upstream_of(self, k: int) -> list[int]:
        if not self.up.num_blocks:
            return []
        coords = self.down.coords_of(k)
        ranges = []
        for i, g in enumerate(coords):
            lo, hi = self.up_lo[i][g], self.up_hi[i][g]
            if lo >= hi:
                return []
            st = self.up.axis_strides[i]
            ranges.append(range(lo * st, hi * st, st))
        out = [0]
        for r in ranges:
            out = [x + y for x in out for y in r]
        return out

    def counts(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Number of upstream blocks every downstream block reads, over the down grid."""
        import numpy as np

        result: np.ndarray[Any, np.dtype[np.int64]] = np.ones(self.down.grid, dtype=np.int64)
        for i in range(self.down.dims):
            c = np.asarray(self.up_hi[i], dtype=np.int64) - np.asarray(
                self.up_lo[i], dtype=np.int64
            )
            view = [1] * self.down.dims
            view[i] = self.down.grid[i]
            result = result * c.reshape(view)
        return result

    def done_counts(
        self, up_done: np.ndarray[Any, np.dtype[Any]]
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """For every downstream block, how many of the upstream blocks it reads are done.

        ``up_done`` is a boolean array over the upstream grid. Uses a summed-area table,
        so the cost is linear in the two grids, with no per-block Python.
        """
        import numpy as np

        sat = up_done.astype(np.int64)
        for i in range(sat.ndim):
            sat = np.cumsum(sat, axis=i)
        sat = np.pad(sat, [(1, 0)] * sat.ndim)
        total = np.zeros(self.down.grid, dtype=np.int64)
        dims = self.down.dims
        lo = [np.asarray(x, dtype=np.int64) for x in self.up_lo]
        hi = [np.asarray(x, dtype=np.int64) for x in self.up_hi]
        for corner in itertools.product((0, 1), repeat=dims):
            idx = []
            for i in range(dims):
                v = hi[i] if corner[i] else lo[i]
                view = [1] * dims
                view[i] = len(v)
                idx.append(v.reshape(view))
            sign = (-1) ** (dims - sum(corner))
            total += sign * sat[tuple(idx)]
        return total


class _Dependencies(Sequence[tuple[Block, list[Block]]]):
    """``enumerate_all_dependencies()``: a lazy sequence, in level order."""

    def __init__(self, geom: TaskGeometry) -> None:
        self._geom = geom

    def __len__(self) -> int:
        return self._geom.num_blocks

    def __iter__(self) -> Iterator[tuple[Block, list[Block]]]:
        g = self._geom
        for lvl in range(g.num_levels):
            for k in g.level_indices(lvl):
                yield Block._lazy(g, k, 0), [Block._lazy(g, u, 0) for u in g.upstream_of(k)]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return next(itertools.islice(iter(self), index, None))


class BlockwiseDependencyGraph:
    """The block graph of one task, for inspection (daisy's ``BlockwiseDependencyGraph``)."""

    def __init__(
        self,
        task_id: str,
        read_roi: Any,
        write_roi: Any,
        read_write_conflict: bool = True,
        fit: str = "valid",
        total_read_roi: Any = None,
    ) -> None:
        if total_read_roi is None:
            raise ValueError(
                "total_read_roi is required: pass the task's total ROI (including the read "
                "context) as total_read_roi=..."
            )
        self.task_id = task_id
        self._geom = TaskGeometry(
            task_id,
            total_read_roi,
            read_roi,
            write_roi,
            fit=fit,
            read_write_conflict=read_write_conflict,
        )

    @property
    def num_blocks(self) -> int:
        return self._geom.num_blocks

    @property
    def num_levels(self) -> int:
        return self._geom.num_levels

    def num_roots(self) -> int:
        g = self._geom
        return math.prod(g.level_shape(0)) if g.num_blocks else 0

    def root_gen(self) -> list[Block]:
        g = self._geom
        if not g.num_blocks:
            return []
        return [Block._lazy(g, k, 0) for k in g.level_indices(0)]

    def _index(self, block: Block) -> int:
        k = self._geom.index_of_block(block)
        if k < 0:
            raise ValueError(f"block {block!r} is not a block of task {self.task_id!r}")
        return k

    def upstream(self, block: Block) -> list[Block]:
        g = self._geom
        return [Block._lazy(g, u, 0) for u in g.upstream_of(self._index(block))]

    def downstream(self, block: Block) -> list[Block]:
        g = self._geom
        return [Block._lazy(g, d, 0) for d in g.downstream_of(self._index(block))]

    def get_subgraph_blocks(self, sub_roi: Any, read_roi: bool = False) -> list[Block]:
        """Blocks whose write ROI (or read ROI, with ``read_roi=True``) intersects ``sub_roi``."""
        g = self._geom
        roi = _as_roi(sub_roi, "sub_roi")
        ranges = []
        for i in range(g.dims):
            a = int(roi.offset[i])
            b = a + int(roi.shape[i])
            sel = []
            for c in range(g.grid[i]):
                lo, hi = g.read_interval(i, c) if read_roi else g.write_interval(i, c)
                if lo < b and hi > a:
                    sel.append(c)
            ranges.append(sel)
        blocks = [Block._lazy(g, g.index_of(c), 0) for c in itertools.product(*ranges)]
        blocks.sort(key=lambda b: b.spatial_id)
        return blocks

    def enumerate_all_dependencies(self) -> _Dependencies:
        return _Dependencies(self._geom)
