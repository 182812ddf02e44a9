"""Write units: which blocks of a task can write into the same shard (or chunk) of an output.

Theory of operation
-------------------
A zarr write rewrites a whole *unit*: the shard when the array is sharded, else the chunk.
Two blocks whose write ROIs touch one unit race in a read-modify-write of it, and one of
the two writes is lost. Everything here is pure arithmetic on a task's
:class:`~bellis._graph.TaskGeometry` and an :class:`OutputSpec` (the array's shapes and
its voxel mapping, read once by ``bellis._outputs``); no array is opened.

Units are boxes, and so are write ROIs, so the question separates by axis: along axis
``i`` each block coordinate ``g`` touches the unit indices ``[lo_g, hi_g)``, and two blocks
share a unit iff their ranges meet on every axis. Two blocks of one task differ on some
axis, so the task has shared units iff, on some axis, two block coordinates ``d >= 1``
apart have meeting ranges; the largest such ``d`` is the axis's *share distance*. Conflict
levels with a stride of at least ``d + 1`` on that axis (``TaskGeometry(unit_stride=)``)
put blocks sharing a unit in different levels, and order them. Between two tasks, the set
of block pairs sharing a unit is a product of per-axis pair sets, and so is the set of
pairs the pipeline already orders (the downstream block reads what the upstream block
writes): the first is inside the second iff it is on every axis.

World units map to voxels by the output's ``voxel_size`` and ``offset`` (world units of
voxel 0); the spatial axes are the last ``len(voxel_size)`` axes of the array, the ones
before are channels (every block writes them whole, so they do not separate blocks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .._graph import TaskGeometry

__all__ = [
    "WRITE_SAFETY",
    "OutputSpec",
    "cross_task_unsafe",
    "owns_units",
    "plan_pipeline_writes",
    "share_distances",
    "sharing_message",
    "unit_ranges",
    "widened_interval",
]

#: ``Task(write_safety=...)``: refuse shared units, serialize their blocks, or neither
WRITE_SAFETY = ("error", "serialize", "off")

Number = int | float


class OutputSpec(NamedTuple):
    """A declared output, as plain values: where it lives and how it is cut."""

    store: str  #: the store's path or URL
    path: str  #: the array's path inside the store ("" for the store's root)
    shape: tuple[int, ...]  #: in voxels, channel axes included
    chunks: tuple[int, ...]  #: the chunk shape in voxels
    shards: tuple[int, ...] | None  #: the shard shape in voxels; None: not sharded
    voxel_size: tuple[Number, ...]  #: world units per voxel, spatial axes only
    offset: tuple[Number, ...]  #: world units of voxel 0, spatial axes only
    dtype: str
    mapping: str  #: where the voxel mapping came from: funlib, attributes, ome-zarr or 1:1

    @property
    def name(self) -> str:
        store = self.store.rstrip("/")
        return f"{store}/{self.path}" if self.path else store

    @property
    def key(self) -> tuple[str, str]:
        """Two specs with one key are one array."""
        return (self.store.rstrip("/"), self.path.strip("/"))

    @property
    def unit(self) -> tuple[int, ...]:
        """What one write rewrites whole, in voxels: the shard if sharded, else the chunk."""
        return self.shards if self.shards is not None else self.chunks

    @property
    def unit_name(self) -> str:
        return "shard" if self.shards is not None else "chunk"

    def spatial_unit(self) -> tuple[int, ...]:
        return self.unit[len(self.unit) - len(self.voxel_size) :]


def _frac(x: Number) -> Fraction:
    return Fraction(x)


def unit_ranges(geom: TaskGeometry, spec: OutputSpec, axis: int) -> list[tuple[int, int]]:
    """Per block coordinate along ``axis``: the unit indices ``[lo, hi)`` its write ROI
    touches (an empty write ROI touches none)."""
    origin = _frac(spec.offset[axis])
    size = spec.spatial_unit()[axis] * _frac(spec.voxel_size[axis])
    out = []
    for g in range(geom.grid[axis]):
        b, e = geom.write_interval(axis, g)
        if e <= b:
            out.append((0, 0))
            continue
        out.append((math.floor((b - origin) / size), math.ceil((e - origin) / size)))
    return out


def _share_distance(ranges: Sequence[tuple[int, int]]) -> int:
    """The largest ``d >= 1`` with ranges ``g`` and ``g + d`` meeting; 0 when none do."""
    best = 0
    j = 0
    n = len(ranges)
    for g, (lo, hi) in enumerate(ranges):
        if hi <= lo:
            continue
        j = max(j, g)
        # the ranges are sorted: the blocks meeting g after it are a run starting at g+1
        while j + 1 < n and ranges[j + 1][0] < hi and ranges[j + 1][1] > ranges[j + 1][0]:
            j += 1
        best = max(best, j - g)
    return best


def share_distances(geom: TaskGeometry, spec: OutputSpec) -> tuple[int, ...]:
    """Per axis: how many blocks apart two blocks of the task can still share a unit of
    ``spec`` (0: never). All zeros means that no two blocks share a unit."""
    if geom.num_blocks == 0:
        return (0,) * geom.dims
    return tuple(_share_distance(unit_ranges(geom, spec, i)) for i in range(geom.dims))


def owns_units(geom: TaskGeometry, spec: OutputSpec) -> bool:
    """Whether every unit of ``spec`` that a block of ``geom`` writes into lies wholly in
    that block's write ROI, or is cut off by the array's end: the unit's stored bytes then
    hold that block's data alone (``verify_outputs`` checksums them, not the decoded
    values; ``_readback``). Channel axes are written whole by every block."""
    dims = geom.dims
    for axis in range(dims):
        origin = _frac(spec.offset[axis])
        vs = _frac(spec.voxel_size[axis])
        unit = spec.spatial_unit()[axis]
        extent = spec.shape[len(spec.shape) - dims + axis]
        for g in range(geom.grid[axis]):
            b, e = geom.write_interval(axis, g)
            if e <= b:
                continue
            vb, ve = (b - origin) / vs, (e - origin) / vs
            if vb.denominator != 1 or ve.denominator != 1:
                return False
            lo, hi = max(0, int(vb)), min(extent, int(ve))
            if hi <= lo:
                continue
            if lo % unit or (hi % unit and hi < extent):
                return False
    return True


def _pairs_meet(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[set[int]]:
    """For every index of ``b``: the indices of ``a`` whose range meets it."""
    out = []
    for lo, hi in b:
        out.append({j for j, (alo, ahi) in enumerate(a) if alo < hi and ahi > lo and alo < ahi})
    return out


def cross_task_unsafe(
    up: TaskGeometry, down: TaskGeometry, spec: OutputSpec, *, direct_edge: bool
) -> bool:
    """True when a block of ``down`` and a block of ``up`` can share a unit of ``spec``
    without the pipeline ordering them (with ``direct_edge``, the downstream block waits
    only for the upstream blocks whose write ROI meets its read ROI)."""
    if up.num_blocks == 0 or down.num_blocks == 0:
        return False
    per_axis_subset = True
    for i in range(down.dims):
        sharing = _pairs_meet(unit_ranges(up, spec, i), unit_ranges(down, spec, i))
        if not any(sharing):
            return False  # no pair shares a unit along this axis, so no pair at all
        if not direct_edge:
            continue
        for g, ups in enumerate(sharing):
            rb, re = down.read_interval(i, g)
            for j in ups:
                wb, we = up.write_interval(i, j)
                if not (wb < re and we > rb):
                    per_axis_subset = False
    return not direct_edge or not per_axis_subset


def widened_interval(
    down: TaskGeometry, specs: Sequence[OutputSpec]
) -> Callable[[int, int], tuple[int, int]]:
    """``read_interval`` of ``down`` grown to the units its write ROI touches, for an
    inter-task edge that makes a block wait for every upstream block sharing its units."""
    spans: list[list[tuple[int, int]]] = []
    for i in range(down.dims):
        axis = []
        ranges = [unit_ranges(down, spec, i) for spec in specs]  # once per axis, not per block
        for g in range(down.grid[i]):
            b, e = down.read_interval(i, g)
            for spec, per_block in zip(specs, ranges, strict=True):
                lo, hi = per_block[g]
                if hi > lo:
                    origin = _frac(spec.offset[i])
                    size = spec.spatial_unit()[i] * _frac(spec.voxel_size[i])
                    b = min(b, math.floor(origin + lo * size))
                    e = max(e, math.ceil(origin + hi * size))
            axis.append((b, e))
        spans.append(axis)

    def interval(axis: int, g: int) -> tuple[int, int]:
        return spans[axis][g]

    return interval


def _shape(values: Sequence[Number]) -> str:
    return "x".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def sharing_message(task_id: str, geom: TaskGeometry, spec: OutputSpec) -> str:
    """Why the blocks of ``task_id`` can write into one unit of ``spec``, and the fixes."""
    vs = spec.voxel_size
    n = len(vs)
    chunks = spec.chunks[len(spec.chunks) - n :]
    parts = [f"chunks {_shape(chunks)} voxels ({_shape(_world(chunks, vs))} world units)"]
    if spec.shards is not None:
        shards = spec.shards[len(spec.shards) - n :]
        parts.append(f"shards {_shape(shards)} voxels ({_shape(_world(shards, vs))} world units)")
    else:
        parts.append("not sharded")
    unit = spec.spatial_unit()
    unit_world = _world(unit, vs)
    write = geom.write_shape
    write_vox = [_number(Fraction(w) / _frac(v)) for w, v in zip(write, vs, strict=True)]
    origin = [_number(_frac(o)) for o in spec.offset]
    return (
        f'task "{task_id}": two of its blocks can write into the same {spec.unit_name} of '
        f"output {spec.name} ({', '.join(parts)}; voxel size {_shape(vs)}, offset "
        f"{_shape(origin)}; voxel mapping: {spec.mapping}). The block write shape is "
        f"{_shape(write)} world units ({_shape(write_vox)} voxels) starting at "
        f"{_shape(geom.tw_offset)} (fit {geom.fit!r}), and zarr rewrites a whole "
        f"{spec.unit_name} on every write: two blocks writing one {spec.unit_name} at once "
        "lose data. Fix: make write_roi a multiple of the "
        f"{spec.unit_name} ({_shape(unit_world)} world units) starting on a "
        f"{spec.unit_name} boundary (total_roi's offset plus the read context, minus the "
        f"array's offset, a multiple of {_shape(unit_world)}), or pass "
        f"Task(write_safety='serialize') so that no two blocks of one {spec.unit_name} run "
        "at the same time (write_safety='off' keeps the race)"
    )


def _number(x: Fraction) -> Number:
    return int(x) if x.denominator == 1 else float(x)


def _world(voxels: Sequence[int], vs: Sequence[Number]) -> list[Number]:
    return [_number(u * _frac(v)) for u, v in zip(voxels, vs, strict=True)]


class TaskWrites(NamedTuple):
    """What :func:`plan_pipeline_writes` needs of one task."""

    task_id: str
    geom: TaskGeometry
    outputs: tuple[OutputSpec, ...]
    write_safety: str
    shared: tuple[OutputSpec, ...]  #: outputs whose units the task's own blocks share


Reach = Callable[[int, int], tuple[int, int]]


def plan_pipeline_writes(
    tasks: Sequence[TaskWrites], edges: Sequence[tuple[int, int]]
) -> tuple[dict[tuple[int, int], Reach], list[str]]:
    """The write-safety check between tasks, before a pipeline runs.

    ``tasks`` in topological order, ``edges`` as index pairs. For every two tasks that
    declare one array, where blocks of both can share a unit without the pipeline ordering
    them, the *downstream* task's ``write_safety`` decides: ``error`` raises
    ConfigurationError; ``serialize`` returns a reach for an edge ``(up, down)`` that makes
    each downstream block wait for every upstream block sharing its units (tasks that the
    pipeline does not order at all cannot be serialized, and raise); ``off`` adds a line
    to the returned warnings, as does every task that shares units of its own under
    ``off``.
    """
    warnings = [
        f'task "{t.task_id}": its blocks can write into one {s.unit_name} of {s.name} at '
        "the same time (write_safety='off')"
        for t in tasks
        if t.write_safety == "off"
        for s in t.shared
    ]
    ancestors: list[set[int]] = [set() for _ in tasks]
    for j in range(len(tasks)):
        for i, k in edges:
            if k == j:
                ancestors[j] |= {i} | ancestors[i]
    direct = set(edges)
    reaches: dict[tuple[int, int], Reach] = {}
    for j, down in enumerate(tasks):
        for i in range(j):
            up = tasks[i]
            keys = {s.key for s in up.outputs}
            common = [s for s in down.outputs if s.key in keys]
            unsafe = [
                s
                for s in common
                if cross_task_unsafe(
                    up.geom, down.geom, s, direct_edge=(i, j) in direct and i in ancestors[j]
                )
            ]
            if not unsafe:
                continue
            spec = unsafe[0]
            if down.write_safety == "off":
                warnings.append(
                    f'tasks "{up.task_id}" and "{down.task_id}": their blocks can write into '
                    f"one {spec.unit_name} of {spec.name} at the same time (write_safety='off')"
                )
                continue
            ordered = i in ancestors[j]
            if down.write_safety == "serialize" and ordered:
                reaches[(i, j)] = widened_interval(down.geom, unsafe)
                continue
            fix = (
                f"or pass write_safety='serialize' to task \"{down.task_id}\" so that each of "
                f'its blocks waits for every block of "{up.task_id}" writing its '
                f"{spec.unit_name}s"
                if ordered
                else f"or make one task run after the other (pipeline {up.task_id} + "
                f"{down.task_id}) and pass write_safety='serialize'"
            )
            raise ConfigurationError(
                f'tasks "{up.task_id}" and "{down.task_id}" both write output {spec.name}, '
                f"and a block of each can write into the same {spec.unit_name} "
                f"({_shape(spec.unit)} voxels) at the same time: "
                + (
                    f'a block of "{down.task_id}" waits only for the blocks of '
                    f'"{up.task_id}" whose writes it reads'
                    if ordered
                    else "the pipeline does not order the two tasks"
                )
                + f"; zarr rewrites a whole {spec.unit_name} on every write, so one of the "
                f"two writes is lost. Fix: make both tasks' write_roi multiples of the "
                f"{spec.unit_name} on {spec.unit_name} boundaries, {fix} "
                "(write_safety='off' keeps the race)",
                parameter="write_safety",
            )
    return reaches, warnings
