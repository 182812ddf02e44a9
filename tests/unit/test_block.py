"""Block, BlockStatus, BlockStats and cantor ids."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, strategies as st

import bellis as daisy
from bellis._block import BlockStats, cantor_index, cantor_number


@pytest.mark.parametrize(
    ("index", "expected"),
    [([2, 2], 12), ([2, 4], 23), ([4, 2], 25), ([4, 4], 40), ([1, 0, 0], 3), ([7], 7), ([], 0)],
)
def test_cantor_number_hand_computed(index: list[int], expected: int) -> None:
    assert cantor_number(index) == expected


def test_cantor_2d_grid_matches_observed_layout() -> None:
    grid = [[cantor_number([i, j]) for j in range(3)] for i in range(2)]
    assert grid == [[0, 1, 3], [2, 4, 7]]


@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=4))
def test_cantor_index_inverts_cantor_number(index: list[int]) -> None:
    """A block id as the summary prints it, back to its grid coordinate (bellis status)."""
    assert cantor_index(cantor_number(index), len(index)) == tuple(index)


def test_cantor_index_enumerates_every_id() -> None:
    seen = {cantor_index(n, 3) for n in range(2000)}
    assert len(seen) == 2000 and all(cantor_number(i) < 2000 for i in seen)
    with pytest.raises(ValueError):
        cantor_index(-1, 2)


def test_cantor_clamps_negative_components() -> None:
    assert cantor_number([-3, 2]) == cantor_number([0, 2]) == 3


def make_block(**kw: object) -> daisy.Block:
    return daisy.Block(
        daisy.Roi((0, 0), (100, 100)),
        daisy.Roi((15, 35), (20, 20)),
        daisy.Roi((20, 40), (10, 10)),
        **kw,
    )


def test_block_id_is_cantor_of_index_relative_to_total() -> None:
    block = make_block(task_id="t")
    # write offset (20, 40) // (10, 10) = index (2, 4) -> 23
    assert block.block_id == ("t", 23)
    assert block.status == daisy.BlockStatus.CREATED == 0
    assert block.stats is None
    assert isinstance(block.read_roi, daisy.Roi)
    assert block.read_roi == daisy.Roi((15, 35), (20, 20))


def test_block_without_task_id_and_explicit_id() -> None:
    block = make_block(block_id=99)
    assert block.block_id == ("", 99)
    assert block.task_id == ""


def test_block_equality_and_hash_by_block_id_only() -> None:
    a = make_block(task_id="t")
    b = daisy.Block(
        daisy.Roi((0, 0), (100, 100)),
        daisy.Roi((0, 0), (1, 1)),
        daisy.Roi((0, 0), (1, 1)),
        task_id="t",
        block_id=23,
    )
    assert a == b
    assert hash(a) == hash(b)
    assert a != make_block(task_id="u")
    assert a != "t/23"


def test_block_repr() -> None:
    block = daisy.Block(
        daisy.Roi((0,), (100,)), daisy.Roi((10,), (20,)), daisy.Roi((15,), (10,)), task_id="t"
    )
    read, write = daisy.Roi((10,), (20,)), daisy.Roi((15,), (10,))
    assert repr(block) == f"t/1 read={read!r} write={write!r}"


def test_block_pickle_keeps_status_and_stats() -> None:
    block = make_block(task_id="t")
    block.status = daisy.BlockStatus.SUCCESS
    block.stats = BlockStats(wall_seconds=1.5, cpu_seconds=0.25, peak_rss_bytes=7)
    clone = pickle.loads(pickle.dumps(block))
    assert clone == block
    assert clone.read_roi == block.read_roi
    assert clone.write_roi == block.write_roi
    assert clone.status == daisy.BlockStatus.SUCCESS
    # bellis keeps stats across pickling (daisy 2.0.0 drops them, SPEC §1.3 gap)
    assert clone.stats == block.stats
    assert clone.stats.peak_rss_bytes == 7


def test_scheduler_block_pickles_with_rois() -> None:
    task = daisy.Task(
        "t",
        daisy.Roi((0,), (30,)),
        daisy.Roi((0,), (10,)),
        daisy.Roi((0,), (10,)),
        process_function=lambda b: None,
    )
    block = daisy.Scheduler(task).acquire_block("t")
    clone = pickle.loads(pickle.dumps(block))
    assert clone.block_id == ("t", 0)
    assert clone.write_roi == daisy.Roi((0,), (10,))


def test_status_constants_and_validation() -> None:
    assert (daisy.BlockStatus.CREATED, daisy.BlockStatus.PROCESSING) == (0, 1)
    assert (daisy.BlockStatus.SUCCESS, daisy.BlockStatus.FAILED) == (2, 3)
    block = make_block(task_id="t")
    block.status = daisy.BlockStatus.FAILED
    assert block.status == 3
    for bad in (7, -1, True, "2"):
        with pytest.raises(ValueError, match="invalid status value"):
            block.status = bad  # type: ignore[assignment]
    assert block.status == 3


def test_block_rejects_non_roi() -> None:
    with pytest.raises(TypeError, match="expected a Roi"):
        daisy.Block(object(), daisy.Roi((0,), (1,)), daisy.Roi((0,), (1,)))


def test_block_accepts_roi_like_objects() -> None:
    class Like:
        def __init__(self, offset: tuple[int, ...], shape: tuple[int, ...]) -> None:
            self.begin = offset
            self.shape = shape

    block = daisy.Block(Like((0,), (50,)), Like((10,), (10,)), Like((10,), (10,)), task_id="t")
    assert block.block_id == ("t", 1)
    assert block.write_roi == daisy.Roi((10,), (10,))


def test_block_stats_repr_equality_and_nan() -> None:
    a = BlockStats(1.0, 2.0, 3, 4, 5)
    assert a == BlockStats(1.0, 2.0, 3, 4, 5)  # nan gpu_util compares equal to nan
    assert a != BlockStats(1.0, 2.0, 3, 4, 6)
    assert repr(a) == (
        "BlockStats(wall_seconds=1.000000, cpu_seconds=2.000000, peak_rss_bytes=3, "
        "io_read_bytes=4, io_write_bytes=5)"
    )
    assert pickle.loads(pickle.dumps(a)) == a


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"wall_seconds": float("nan")}, "wall_seconds is nan"),
        ({"cpu_seconds": -0.5}, "cpu_seconds is -0.5"),
        ({"cpu_children_seconds": float("inf")}, "cpu_children_seconds is inf"),
        ({"peak_rss_bytes": -1}, "peak_rss_bytes is -1"),
        ({"io_write_bytes": 2**64}, "io_write_bytes is 18446744073709551616"),
        ({"gpu_mem_bytes": -3}, "gpu_mem_bytes is -3"),
    ],
)
def test_stats_problem_names_the_figure(kwargs: dict[str, float], fragment: str) -> None:
    from bellis._block import stats_problem

    assert stats_problem(BlockStats(**kwargs)) is not None
    assert fragment in (stats_problem(BlockStats(**kwargs)) or "")
    assert stats_problem(BlockStats(0.1, 0.2, 1 << 30, 5, 6, float("nan"), 0, 0.3)) is None


def test_stats_problem_refuses_what_is_not_block_stats() -> None:
    from bellis._block import stats_problem

    assert "block.stats is a tuple" in (stats_problem((0.1, 0.2)) or "")
