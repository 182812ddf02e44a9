"""Scheduler start-up and first hand-outs on a 10^8-block 3-D conflict task.

Builds a ``Scheduler`` over a 500 x 500 x 400 block grid (write 10, context 2, conflicts on),
hands out and releases the first 1,000 blocks, and prints the seconds taken and the peak RSS
(``VmHWM``). Targets: under 10 s and under 2 GiB.

    .venv/bin/python benchmarks/bench_scheduler_1e8.py
"""

from __future__ import annotations

import time

import bellis as daisy

GRID = (500, 500, 400)
WRITE = 10
CONTEXT = 2
BLOCKS = 1000


def peak_rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    t0 = time.perf_counter()
    total = daisy.Roi((0, 0, 0), tuple(g * WRITE + 2 * CONTEXT for g in GRID))
    read = daisy.Roi((0, 0, 0), (WRITE + 2 * CONTEXT,) * 3)
    write = daisy.Roi((CONTEXT,) * 3, (WRITE,) * 3)
    task = daisy.Task(
        "big", total, read, write, process_function=lambda b: None, read_write_conflict=True
    )
    scheduler = daisy.Scheduler(task)
    t1 = time.perf_counter()
    for _ in range(BLOCKS):
        block = scheduler.acquire_block("big")
        assert block is not None
        block.status = daisy.BlockStatus.SUCCESS
        scheduler.release_block(block)
    t2 = time.perf_counter()
    state = scheduler.task_states["big"]
    assert state.total_block_count == GRID[0] * GRID[1] * GRID[2]
    assert state.completed_count == BLOCKS
    print(f"blocks: {state.total_block_count}")
    print(f"construct: {t1 - t0:.2f} s, first {BLOCKS} blocks: {t2 - t1:.3f} s")
    print(f"total: {t2 - t0:.2f} s, peak RSS: {peak_rss_bytes() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
