"""TaskGeometry, InterTaskEdge and BlockwiseDependencyGraph: grids, fit modes, levels."""

from __future__ import annotations

from typing import Any

import pytest

import bellis as daisy
from bellis._graph import InterTaskEdge, TaskGeometry


def geom1(total: int, ctx: int, fit: str, conflict: bool = True, write: int = 10) -> TaskGeometry:
    return TaskGeometry(
        "t",
        daisy.Roi((0,), (total,)),
        daisy.Roi((-ctx,), (write + 2 * ctx,)),
        daisy.Roi((0,), (write,)),
        fit=fit,
        read_write_conflict=conflict,
    )


def write_intervals(g: TaskGeometry) -> list[tuple[int, int]]:
    return [g.write_interval(0, i) for i in range(g.grid[0])]


@pytest.mark.parametrize(("fit", "blocks"), [("valid", 9), ("overhang", 10), ("shrink", 10)])
def test_fit_block_counts_total_95(fit: str, blocks: int) -> None:
    g = geom1(95, 0, fit, conflict=False)
    assert g.grid == (blocks,)
    assert g.num_blocks == blocks


def test_fit_overhang_last_block_extends_past_total() -> None:
    g = geom1(95, 0, "overhang", conflict=False)
    assert write_intervals(g)[-1] == (90, 100)
    assert g.write_roi_of(9) == daisy.Roi((90,), (10,))


def test_fit_shrink_clips_write_and_read() -> None:
    g = geom1(95, 0, "shrink", conflict=False)
    assert write_intervals(g)[-1] == (90, 95)
    assert g.write_roi_of(9) == daisy.Roi((90,), (5,))
    # with context 10 and total 95 the total write ROI is [10, 85); the last block's
    # write is [80, 85) and its read [70, 95): read (70, 25) instead of (70, 30)
    c = TaskGeometry(
        "t",
        daisy.Roi((0,), (95,)),
        daisy.Roi((0,), (30,)),
        daisy.Roi((10,), (10,)),
        fit="shrink",
    )
    assert c.grid == (8,)
    assert c.write_roi_of(7) == daisy.Roi((80,), (5,))
    assert c.read_roi_of(7) == daisy.Roi((70,), (25,))
    assert c.read_roi_of(6) == daisy.Roi((60,), (30,))


def test_fit_valid_drops_partial_block() -> None:
    g = geom1(95, 0, "valid", conflict=False)
    assert write_intervals(g)[-1] == (80, 90)


def test_invalid_fit_and_mismatched_dims() -> None:
    with pytest.raises(ValueError, match="is not a fit mode"):
        geom1(95, 0, "bogus")
    with pytest.raises(ValueError, match="same number of dimensions"):
        TaskGeometry("t", daisy.Roi((0, 0), (5, 5)), daisy.Roi((0,), (1,)), daisy.Roi((0,), (1,)))
    with pytest.raises(ValueError, match="must contain write_roi"):
        TaskGeometry("t", daisy.Roi((0,), (50,)), daisy.Roi((0,), (5,)), daisy.Roi((2,), (5,)))


def test_item27_1d_conflict_two_levels_odd_first() -> None:
    g = TaskGeometry("t", daisy.Roi((0,), (100,)), daisy.Roi((-5,), (20,)), daisy.Roi((0,), (10,)))
    assert g.num_blocks == 9
    assert g.num_levels == 2
    assert g.level_stride == (2,)
    assert g.level_offsets == ((1,), (0,))
    assert list(g.level_indices(0)) == [1, 3, 5, 7]
    assert list(g.level_indices(1)) == [0, 2, 4, 6, 8]
    # ids: total offset 0, context 5 < block 10, so the spatial id equals the grid index
    assert [g.spatial_id_of(k) for k in g.level_indices(0)] == [1, 3, 5, 7]
    task = daisy.Task(
        "t",
        daisy.Roi((0,), (100,)),
        daisy.Roi((-5,), (20,)),
        daisy.Roi((0,), (10,)),
        process_function=lambda b: None,
    )
    scheduler = daisy.Scheduler(task)
    first = [scheduler.acquire_block("t").block_id[1] for _ in range(4)]
    assert first == [1, 3, 5, 7]
    assert scheduler.acquire_block("t") is None


def test_item28_no_conflict_in_order() -> None:
    task = daisy.Task(
        "t",
        daisy.Roi((0,), (100,)),
        daisy.Roi((-5,), (20,)),
        daisy.Roi((0,), (10,)),
        process_function=lambda b: None,
        read_write_conflict=False,
    )
    scheduler = daisy.Scheduler(task)
    ids = []
    while (block := scheduler.acquire_block("t")) is not None:
        ids.append(block.block_id[1])
    assert ids == list(range(9))


def test_item29_2d_level_order() -> None:
    g = TaskGeometry(
        "t", daisy.Roi((0, 0), (30, 30)), daisy.Roi((-5, -5), (20, 20)), daisy.Roi((0, 0), (10, 10))
    )
    # total write ROI [5, 25) per axis: a 2 x 2 grid, the stride (2, 2) clamped to it
    assert g.grid == (2, 2)
    assert g.level_offsets == ((1, 1), (1, 0), (0, 1), (0, 0))
    firsts = [g.spatial_id_of(next(iter(g.level_indices(lvl)))) for lvl in range(4)]
    # (1,1) -> 4, (1,0) -> 2, (0,1) -> 1, (0,0) -> 0
    assert firsts == [4, 2, 1, 0]


def test_conflict_offsets_per_axis() -> None:
    g = TaskGeometry(
        "t", daisy.Roi((0, 0), (60, 60)), daisy.Roi((-5, -5), (20, 20)), daisy.Roi((0, 0), (10, 10))
    )
    # level 1 = offset (1, 0) depends on level 0 = (1, 1): d = (0, 1) -> {0} x {-1, 1}
    assert g.up_offsets[1] == ((0,), (-1, 1))
    # level 2 = (0, 1) on level 1 = (1, 0): d = (1, -1) -> {-1, 1} x {-1, 1}
    assert g.up_offsets[2] == ((-1, 1), (-1, 1))
    assert g.up_offsets[0] == ((), ())
    assert g.down_offsets[3] == ((), ())
    # block (2, 1) of level 2: upstream (1,0),(1,2),(3,0),(3,2)
    k = g.index_of((2, 1))
    assert sorted(g.coords_of(u) for u in g.upstream_of(k)) == [[1, 0], [1, 2], [3, 0], [3, 2]]
    # block (1, 0) of level 1: downstream (0,1),(2,1) of level 2 ((0,-1),(2,-1) are off-grid)
    k = g.index_of((1, 0))
    assert sorted(g.coords_of(d) for d in g.downstream_of(k)) == [[0, 1], [2, 1]]


def test_wide_context_gives_stride_three() -> None:
    g = geom1(120, 25, "valid")
    # max(25, 25) + 10 = 35 -> rounded up to 40 = 4 blocks, clamped to the 7-block grid
    assert g.grid == (7,)
    assert g.level_stride == (4,)
    assert g.num_levels == 4


def test_no_context_conflict_has_single_level() -> None:
    g = TaskGeometry(
        "t", daisy.Roi((0, 0), (30, 20)), daisy.Roi((0, 0), (10, 10)), daisy.Roi((0, 0), (10, 10))
    )
    assert g.num_levels == 1


def test_total_smaller_than_block() -> None:
    g = TaskGeometry(
        "t", daisy.Roi((0, 0), (7, 5)), daisy.Roi((0, 0), (10, 10)), daisy.Roi((0, 0), (10, 10))
    )
    assert g.num_blocks == 0
    assert list(g.level_indices(0)) == []


def test_spatial_ids_relative_to_total_roi() -> None:
    # context 10 = one block: the first block's write offset is 10, index 1 relative to total
    g = geom1(100, 10, "valid")
    assert g.spatial_id_of(0) == 1
    assert g.write_roi_of(0) == daisy.Roi((10,), (10,))
    assert g.read_roi_of(0) == daisy.Roi((0,), (30,))


def test_index_of_block_round_trip() -> None:
    g = TaskGeometry(
        "t", daisy.Roi((3, -7), (41, 29)), daisy.Roi((-2, -4), (14, 12)), daisy.Roi((0, 0), (8, 5))
    )
    for k in range(g.num_blocks):
        block = daisy.Block(
            daisy.Roi(g.total_offset, g.total_shape), g.read_roi_of(k), g.write_roi_of(k), "t"
        )
        assert g.index_of_block(block) == k
        assert block.block_id == g.block(k).block_id
    stray = daisy.Block(
        daisy.Roi((0, 0), (1, 1)), daisy.Roi((0, 0), (3, 3)), daisy.Roi((1, 1), (3, 3)), "t"
    )
    assert g.index_of_block(stray) == -1


def test_inter_task_edge_ranges() -> None:
    up = geom1(100, 0, "valid", conflict=False)
    down = TaskGeometry(
        "d",
        daisy.Roi((0,), (100,)),
        daisy.Roi((-5,), (20,)),
        daisy.Roi((0,), (10,)),
        read_write_conflict=False,
    )
    edge = InterTaskEdge(up, down)
    # down block g reads [10g, 10g + 20) -> up blocks g and g+1 (8 down blocks, [5, 95))
    assert down.grid == (9,)
    assert edge.upstream_of(0) == [0, 1]
    assert edge.upstream_of(8) == [8, 9]
    assert edge.downstream_of(0) == [0]
    assert edge.downstream_of(5) == [4, 5]
    assert edge.counts().tolist() == [2] * 9


def test_dependency_graph_api() -> None:
    graph = daisy.BlockwiseDependencyGraph(
        "t",
        daisy.Roi((-5,), (20,)),
        daisy.Roi((0,), (10,)),
        True,
        "valid",
        total_read_roi=daisy.Roi((0,), (100,)),
    )
    assert (graph.num_blocks, graph.num_levels, graph.num_roots()) == (9, 2, 4)
    assert [b.block_id[1] for b in graph.root_gen()] == [1, 3, 5, 7]
    deps = graph.enumerate_all_dependencies()
    assert len(deps) == 9
    assert deps[4][0].block_id == ("t", 0)
    assert [u.block_id[1] for u in deps[-1][1]] == [7]
    block = deps[5][0]  # id 2
    assert sorted(b.block_id[1] for b in graph.upstream(block)) == [1, 3]
    assert sorted(b.block_id[1] for b in graph.downstream(graph.root_gen()[0])) == [0, 2]
    sub = graph.get_subgraph_blocks(daisy.Roi((12,), (10,)))
    assert [b.block_id[1] for b in sub] == [0, 1]  # writes [5, 15) and [15, 25)
    with pytest.raises(ValueError, match="total_read_roi is required"):
        daisy.BlockwiseDependencyGraph("t", daisy.Roi((0,), (1,)), daisy.Roi((0,), (1,)))


@pytest.mark.parametrize(
    ("total", "read", "write", "fit"),
    [
        (((0,), (120,)), ((-25,), (60,)), ((0,), (10,)), "valid"),
        (((0, 0), (43, 37)), ((-5, -5), (20, 20)), ((0, 0), (10, 10)), "shrink"),
        (((3, -7), (41, 29)), ((-2, -4), (14, 12)), ((0, 0), (8, 5)), "overhang"),
        (
            ((0, 0, 0), (64, 54, 44)),
            ((-2, -2, -2), (14, 14, 14)),
            ((0, 0, 0), (10, 10, 10)),
            "valid",
        ),
    ],
)
def test_downstream_is_the_mirror_of_upstream(
    total: tuple[tuple[int, ...], tuple[int, ...]],
    read: tuple[tuple[int, ...], tuple[int, ...]],
    write: tuple[tuple[int, ...], tuple[int, ...]],
    fit: str,
) -> None:
    g = TaskGeometry("t", daisy.Roi(*total), daisy.Roi(*read), daisy.Roi(*write), fit=fit)
    assert g.num_levels > 1
    mirror: dict[int, list[int]] = {k: [] for k in range(g.num_blocks)}
    for j in range(g.num_blocks):
        for u in g.upstream_of(j):
            mirror[u].append(j)
    for k in range(g.num_blocks):
        # ascending flat order: the order in which a release queues what it unlocks
        assert g.downstream_of(k) == sorted(mirror[k]), k
        assert g.level_of(g.coords_of(k)) == next(
            lvl for lvl in range(g.num_levels) if k in set(g.level_indices(lvl))
        )


# -- downstream_readers (issue 26: which downstream blocks read redone upstream blocks) --


def _grid2(task_id: str, ctx: int, write: int, fit: str = "valid") -> TaskGeometry:
    return TaskGeometry(
        task_id,
        daisy.Roi((0, 0), (47, 53)),
        daisy.Roi((-ctx, -ctx), (write + 2 * ctx, write + 2 * ctx)),
        daisy.Roi((0, 0), (write, write)),
        fit=fit,
        read_write_conflict=False,
    )


def _brute_readers(up: TaskGeometry, down: TaskGeometry, redone: set[int]) -> set[int]:
    return {
        k
        for k in range(down.num_blocks)
        if any(down.read_roi_of(k).intersects(up.write_roi_of(j)) for j in redone)
    }


@pytest.mark.parametrize(
    ("up_args", "down_args"),
    [((0, 10), (3, 10)), ((0, 7, "shrink"), (4, 9, "overhang")), ((2, 5), (0, 11, "shrink"))],
)
def test_downstream_readers_are_the_blocks_whose_read_roi_meets_a_redone_write_roi(
    up_args: tuple[Any, ...], down_args: tuple[Any, ...]
) -> None:
    import numpy as np

    from bellis._bulk import downstream_readers

    up, down = _grid2("up", *up_args), _grid2("down", *down_args)
    rng = np.random.default_rng(3)
    for size in (0, 1, 3, up.num_blocks // 2):
        redone = {int(k) for k in rng.choice(up.num_blocks, size=size, replace=False)}
        want = _brute_readers(up, down, redone)
        by_index = downstream_readers(up, down, sorted(redone))
        mask = np.zeros(up.grid, dtype=bool)
        mask.reshape(-1)[sorted(redone)] = True
        by_mask = downstream_readers(up, down, mask)
        assert by_index.shape == tuple(down.grid)
        assert set(np.flatnonzero(by_index).tolist()) == want
        assert np.array_equal(by_index, by_mask)
        if size:
            assert want  # every redone block here is read by some block


def test_downstream_readers_rejects_blocks_of_another_grid() -> None:
    import numpy as np

    from bellis._bulk import downstream_readers

    up, down = _grid2("up", 0, 10), _grid2("down", 3, 10)
    with pytest.raises(ValueError, match="outside task 'up'"):
        downstream_readers(up, down, [up.num_blocks])
    with pytest.raises(ValueError, match="block grid of"):
        downstream_readers(up, down, np.zeros((2, 2), dtype=bool))
