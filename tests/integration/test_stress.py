"""A conflict-ordered two-task pipeline of fast blocks, with blocks that raise once, raise
always, or kill their worker once, all at the same time (batching, retries, restarts and
orphaning together). Every outcome is checked against what must happen."""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import bellis
from bellis import Roi


def _kind(task_id: str, sid: int) -> str:
    h = zlib.crc32(f"{task_id}/{sid}".encode()) % 101
    if h < 4:
        return "always"  # raises on every attempt: fails permanently
    if h < 12:
        return "once"  # raises on its first attempt only
    if h < 15:
        return "crash"  # kills its worker on its first attempt only
    return "ok"


def chaos_block(block: Any) -> None:
    recdir = os.environ["BELLIS_STRESS_DIR"]
    task_id, sid = block.block_id
    t0 = time.time()
    kind = _kind(task_id, sid)
    if kind == "always":
        raise RuntimeError(f"always fails: {task_id}/{sid}")
    if kind in ("once", "crash"):
        marker = Path(recdir) / f"first_{task_id}_{sid}"
        if not marker.exists():
            marker.touch()
            if kind == "once":
                raise RuntimeError(f"fails once: {task_id}/{sid}")
            os._exit(9)
    line = f"{task_id} {sid} {t0:.6f} {time.time():.6f}\n"
    fd = os.open(os.path.join(recdir, "ok.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _task(task_id: str, tmp_path: Path) -> Any:
    return bellis.Task(
        task_id,
        total_roi=Roi((0, 0), (50, 50)),
        read_roi=Roi((0, 0), (6, 6)),
        write_roi=Roi((1, 1), (4, 4)),
        process_function=chaos_block,
        read_write_conflict=True,
        max_workers=2,
        max_retries=2,
        max_worker_restarts=500,
        tracking_path=str(tmp_path / "track" / task_id),
    )


def test_everything_at_once(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("BELLIS_STRESS_DIR", str(tmp_path))
    a, b = _task("a", tmp_path), _task("b", tmp_path)
    pipeline = a + b
    states = bellis.Server().run_blockwise(pipeline, progress=False, summary=False)

    # what must happen, from the block graph: a block that always fails is failed unless
    # something upstream of it failed first (then it is orphaned, never run); everything
    # downstream of a failed block is orphaned; the rest completes
    graph = bellis.Scheduler(pipeline)
    blocks: dict[tuple[str, int], Any] = {}
    for task_id in ("a", "b"):
        while (blk := graph.acquire_block(task_id)) is not None:
            blocks[blk.block_id] = blk
            blk.status = bellis.BlockStatus.SUCCESS
            graph.release_block(blk)
    down = {bid: [d.block_id for d in graph.dependency_graph.downstream(blk)] for bid, blk in
            blocks.items()}  # fmt: skip
    always = {bid for bid in blocks if _kind(*bid) == "always"}
    orphaned: set[tuple[str, int]] = set()
    stack = [d for bid in always for d in down[bid]]
    while stack:
        x = stack.pop()
        if x not in orphaned:
            orphaned.add(x)
            stack.extend(down[x])
    failed = always - orphaned
    completed = set(blocks) - failed - orphaned
    assert always and failed and orphaned and completed  # the scenario is not degenerate

    for task_id in ("a", "b"):
        s = states[task_id]
        assert s.completed_count == sum(1 for t, _ in completed if t == task_id)
        assert s.failed_count == sum(1 for t, _ in failed if t == task_id)
        assert s.orphaned_count == sum(1 for t, _ in orphaned if t == task_id)
        assert not s.abandoned

    # success records: exactly the completed blocks (a block lost in a crashed batch may
    # legitimately have run twice), each after every upstream block it reads had finished
    first_end: dict[tuple[str, int], float] = {}
    starts: dict[tuple[str, int], list[float]] = {}
    for line in (tmp_path / "ok.log").read_text().splitlines():
        task_id, sid, start, end = line.split()
        bid = (task_id, int(sid))
        first_end[bid] = min(first_end.get(bid, float("inf")), float(end))
        starts.setdefault(bid, []).append(float(start))
    assert set(first_end) == completed
    up: dict[tuple[str, int], list[tuple[str, int]]] = {bid: [] for bid in blocks}
    for bid, ds in down.items():
        for d in ds:
            up[d].append(bid)
    for bid in completed:
        for u in up[bid]:
            assert first_end[u] <= min(starts[bid]) + 1e-3, (u, bid)

    # the stores mark done exactly the completed blocks
    for task_id in ("a", "b"):
        g = zarr.open_group(str(tmp_path / "track" / task_id), mode="r")
        done = np.asarray(g["done"][:])
        assert int(done.sum()) == states[task_id].completed_count
        # and exactly those blocks: a cell is the block's C-order position in the grid
        grid = done.shape
        sid_of_cell = {
            i * grid[1] + j: bellis.Block(
                Roi((0, 0), (50, 50)),
                Roi((4 * i, 4 * j), (6, 6)),
                Roi((4 * i + 1, 4 * j + 1), (4, 4)),
            ).block_id[1]
            for i in range(grid[0])
            for j in range(grid[1])
        }
        marked = {sid_of_cell[int(c)] for c in np.flatnonzero(done)}
        assert marked == {sid for t, sid in completed if t == task_id}
