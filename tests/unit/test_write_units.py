"""Write units (``bellis._outputs._units``): which blocks share a shard or chunk of an output, pure.

Each computation is checked against a brute force over every pair of blocks: the units
each block's write ROI touches, in world units.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
from funlib.geometry import Roi

from bellis._graph import TaskGeometry
from bellis._outputs._declared import _rebuild
from bellis._outputs._units import (
    OutputSpec,
    TaskWrites,
    cross_task_unsafe,
    plan_pipeline_writes,
    share_distances,
    sharing_message,
)
from bellis.errors import ConfigurationError


def spec(unit, vs=None, off=None, chunks=None, sharded=True):
    n = len(unit)
    return OutputSpec(
        store="/data/out.zarr",
        path="seg",
        shape=(1000,) * n,
        chunks=tuple(chunks or unit),
        shards=tuple(unit) if sharded else None,
        voxel_size=tuple(vs or (1,) * n),
        offset=tuple(off or (0,) * n),
        dtype="uint8",
        mapping="attributes",
    )


def geom(total, write, ctx=0, fit="valid", conflict=False, task_id="t"):
    n = len(total)
    return TaskGeometry(
        task_id,
        Roi((0,) * n, total),
        Roi((0,) * n, tuple(w + 2 * ctx for w in write)),
        Roi((ctx,) * n, write),
        fit=fit,
        read_write_conflict=conflict,
    )


def units_of(g, s, k):
    """Brute force: the unit indices block ``k`` writes, as a set of tuples."""
    roi = g.write_roi_of(k)
    axes = []
    for i in range(g.dims):
        size = s.spatial_unit()[i] * s.voxel_size[i]
        b, e = int(roi.offset[i]), int(roi.offset[i] + roi.shape[i])
        lo = math.floor((b - s.offset[i]) / size)
        hi = math.ceil((e - s.offset[i]) / size)
        axes.append(range(lo, hi))
    return set(itertools.product(*axes))


def sharing_pairs(g, s):
    units = [units_of(g, s, k) for k in range(g.num_blocks)]
    n = g.num_blocks
    return [(a, b) for a in range(n) for b in range(a + 1, n) if units[a] & units[b]]


def test_blocks_of_one_chunk_in_shards_of_4x4x4_chunks_share_within_the_shard():
    g = geom((32, 32, 32), (4, 4, 4))
    assert share_distances(g, spec((16, 16, 16), chunks=(4, 4, 4))) == (3, 3, 3)


@pytest.mark.parametrize("fit", ["valid", "overhang", "shrink"])
def test_blocks_of_one_shard_share_nothing_at_any_fit(fit):
    # 30 is not a multiple of 8: the last block overhangs or is shrunk, still one shard
    g = geom((30, 30), (8, 8), fit=fit)
    assert share_distances(g, spec((8, 8))) == (0, 0)


def test_a_misaligned_grid_shares_even_with_blocks_of_the_shard_size():
    g = TaskGeometry("t", Roi((2,), (32,)), Roi((0,), (8,)), Roi((0,), (8,)))
    assert share_distances(g, spec((8,))) == (1,)
    # the same grid with the array's offset on it shares nothing
    assert share_distances(g, spec((8,), off=(2,))) == (0,)


def test_world_units_scale_the_unit_by_the_voxel_size():
    # 16-voxel shards of 4-unit voxels are 64 world units: blocks of 64 are aligned
    g = geom((256, 256), (64, 64))
    assert share_distances(g, spec((16, 16), vs=(4, 4))) == (0, 0)
    assert share_distances(g, spec((16, 16), vs=(8, 4))) == (1, 0)


def test_a_shrunk_border_block_shares_with_its_neighbour_when_misaligned():
    # blocks of 6 on units of 4: 0-6 and 6-12 share unit 1; 12-14 (shrunk) and 6-12 do not
    g = geom((14,), (6,), fit="shrink")
    assert g.grid == (3,)
    assert share_distances(g, spec((4,))) == (1,)
    assert sharing_pairs(g, spec((4,))) == [(0, 1)]


def _random_case(rng):
    dims = rng.choice([1, 2])
    write = tuple(rng.randint(2, 7) for _ in range(dims))
    total = tuple(rng.randint(w, 5 * w) for w in write)
    unit = tuple(rng.randint(1, 12) for _ in range(dims))
    off = tuple(rng.randint(-5, 5) for _ in range(dims))
    vs = tuple(rng.choice([1, 2]) for _ in range(dims))
    fit = rng.choice(["valid", "overhang", "shrink"])
    ctx = rng.choice([0, 0, 1, 3])
    return geom(tuple(t + 2 * ctx for t in total), write, ctx, fit, rng.random() < 0.5), spec(
        unit, vs, off
    )


def test_share_distances_agree_with_a_brute_force_over_every_pair():
    rng = random.Random(27)
    for _ in range(200):
        g, s = _random_case(rng)
        dist = share_distances(g, s)
        pairs = sharing_pairs(g, s)
        assert bool(pairs) == any(dist), (g.grid, s)
        for a, b in pairs:
            ca, cb = g.coords_of(a), g.coords_of(b)
            assert all(abs(x - y) <= d for x, y, d in zip(ca, cb, dist, strict=True))


def _ancestors(g):
    """Every block's transitive upstream blocks, through the task's conflict levels."""
    up = {k: set(g.upstream_of(k)) for k in range(g.num_blocks)}
    for lvl in range(g.num_levels):
        for k in g.level_indices(lvl):
            for u in list(up[k]):
                up[k] |= up[u]
    return up


def test_serialize_levels_order_every_pair_of_blocks_that_share_a_unit():
    rng = random.Random(72)
    checked = 0
    for _ in range(200):
        g, s = _random_case(rng)
        dist = share_distances(g, s)
        if not any(dist) or g.num_blocks > 60:
            continue
        sg = _rebuild(g, tuple(d + 1 for d in dist))
        anc = _ancestors(sg)
        for a, b in sharing_pairs(sg, s):
            assert sg.level_of_index(a) != sg.level_of_index(b)
            assert a in anc[b] or b in anc[a], (sg.grid, sg.level_stride, a, b)
        checked += 1
    assert checked > 30


def _cross_brute(up, down, s):
    """Pairs (up block, down block) sharing a unit that the edge does not order."""
    bad = []
    for a in range(up.num_blocks):
        ua = units_of(up, s, a)
        wa = up.write_roi_of(a)
        for b in range(down.num_blocks):
            if ua & units_of(down, s, b) and not wa.intersects(down.read_roi_of(b)):
                bad.append((a, b))
    return bad


def test_cross_task_check_agrees_with_a_brute_force():
    rng = random.Random(7)
    for _ in range(100):
        up, s = _random_case(rng)
        ctx = rng.choice([0, 1, 4, 8])
        n = up.dims
        write = tuple(rng.randint(2, 7) for _ in range(n))
        down = TaskGeometry(
            "d",
            Roi(tuple(-ctx for _ in range(n)), tuple(t + 2 * ctx for t in up.total_shape)),
            Roi((0,) * n, tuple(w + 2 * ctx for w in write)),
            Roi((ctx,) * n, write),
            fit=rng.choice(["valid", "shrink"]),
        )
        # exact: the pairs sharing a unit and the pairs the edge orders are both products
        assert cross_task_unsafe(up, down, s, direct_edge=True) == bool(_cross_brute(up, down, s))


def test_two_tasks_writing_one_shard_apart_raise_unless_serialized():
    s = spec((16,), chunks=(4,))
    up = geom((32,), (4,), task_id="up")
    down = geom((32,), (4,), task_id="down")
    tasks = [
        TaskWrites("up", up, (s,), "serialize", ()),
        TaskWrites("down", down, (s,), "error", ()),
    ]
    with pytest.raises(ConfigurationError, match=r"both write output /data/out\.zarr/seg"):
        plan_pipeline_writes(tasks, [(0, 1)])
    tasks[1] = tasks[1]._replace(write_safety="serialize")
    reaches, warnings = plan_pipeline_writes(tasks, [(0, 1)])
    assert list(reaches) == [(0, 1)] and warnings == []
    # the reach covers the shard: block 1 (4-8) of down waits for every up block of 0-16
    assert reaches[(0, 1)](0, 1) == (0, 16)
    # not ordered at all: serialize cannot help
    with pytest.raises(ConfigurationError, match="does not order the two tasks"):
        plan_pipeline_writes(tasks, [])
    tasks[1] = tasks[1]._replace(write_safety="off")
    assert plan_pipeline_writes(tasks, [])[1][0].startswith('tasks "up" and "down"')


def test_aligned_tasks_on_one_array_need_nothing():
    s = spec((16,), chunks=(4,))
    up, down = geom((32,), (16,)), geom((32,), (16,))
    tasks = [TaskWrites("up", up, (s,), "error", ()), TaskWrites("down", down, (s,), "error", ())]
    assert plan_pipeline_writes(tasks, [(0, 1)]) == ({}, [])
    # side by side, block k of each writes shard k at the same time
    with pytest.raises(ConfigurationError, match="does not order"):
        plan_pipeline_writes(tasks, [])


def test_the_message_names_the_array_its_shapes_the_write_shape_and_the_fixes():
    g = geom((64, 64), (8, 8))
    msg = sharing_message("seg", g, spec((16, 16), vs=(2, 2), chunks=(4, 4)))
    assert "/data/out.zarr/seg" in msg
    assert "chunks 4x4 voxels (8x8 world units)" in msg
    assert "shards 16x16 voxels (32x32 world units)" in msg
    assert "block write shape is 8x8 world units (4x4 voxels)" in msg
    assert "multiple of the shard (32x32 world units)" in msg
    assert "write_safety='serialize'" in msg
