"""The scheduler's memory per block: no Python object and at most two bytes per block."""

from __future__ import annotations

import tracemalloc

import bellis
from bellis import Scheduler


def _conflict_task(side: int) -> bellis.Task:
    return bellis.Task(
        "t",
        total_roi=bellis.Roi((0, 0, 0), (side * 10 + 4,) * 3),
        read_roi=bellis.Roi((0, 0, 0), (14, 14, 14)),
        write_roi=bellis.Roi((2, 2, 2), (10, 10, 10)),
        process_function=lambda b: None,
        read_write_conflict=True,
    )


def _measure(side: int) -> tuple[int, int]:
    """(peak traced bytes, live allocations left) of building a scheduler for a side^3
    conflict task and running 1,000 blocks through it."""
    task = _conflict_task(side)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        scheduler = Scheduler(task)
        run = scheduler.runs[0]
        for _ in range(1000):
            k = scheduler.acquire_index(run)
            assert k >= 0
            assert scheduler.release_index(run, k, True)
        peak = tracemalloc.get_traced_memory()[1]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert scheduler.task_states["t"].completed_count == 1000
    return peak, sum(s.count_diff for s in after.compare_to(before, "filename"))


def test_a_conflict_task_costs_two_bytes_per_block_and_no_object() -> None:
    """A 10^6-block scheduler allocates under 2.5 bytes per block in all (the state and
    the dependency byte), and the number of Python allocations it keeps does not grow
    with the grid: 8x the blocks, about the same count (ready-queue chunks and the
    blocks the 1,000 releases readied)."""
    _, small_objects = _measure(50)
    peak, objects = _measure(100)
    assert peak < 2.5 * 100**3, peak
    assert objects < 2 * small_objects + 1000, (objects, small_objects)


def test_is_done_follows_every_task() -> None:
    a = _conflict_task(2)
    b = bellis.Task(
        "u",
        total_roi=a.total_roi,
        read_roi=a.read_roi,
        write_roi=a.write_roi,
        process_function=lambda b: None,
        read_write_conflict=False,
    )
    scheduler = Scheduler(bellis.Pipeline([a, b]))
    assert not scheduler.is_done()
    for task_id in ("u", "t"):
        while (block := scheduler.acquire_block(task_id)) is not None or not (
            scheduler.task_states[task_id].completed_count
            == scheduler.task_states[task_id].total_block_count
        ):
            assert not scheduler.is_done()
            if block is None:
                continue
            block.status = bellis.BlockStatus.SUCCESS
            scheduler.release_block(block)
    assert scheduler.is_done()
