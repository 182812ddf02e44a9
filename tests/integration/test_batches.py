"""Adaptive batching of fast blocks, and what happens when a worker dies mid-batch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import bellis
from bellis import Roi

CRASHER = 137  # flat block index (1-D grid: block k writes [10k, 10k+10))


def crash_on_one_block(block: Any) -> None:
    k = block.write_roi.offset[0] // 10
    if k == CRASHER:
        os._exit(3)  # a hard crash: no traceback, no result, the connection just drops
    with open(os.environ["BELLIS_TEST_RECORD"], "a") as f:
        f.write(f"{k}\n")


def test_a_block_that_kills_its_worker_is_isolated_from_its_batch(
    tmp_path: Path, monkeypatch: Any
) -> None:
    record = tmp_path / "done.txt"
    monkeypatch.setenv("BELLIS_TEST_RECORD", str(record))
    n = 600
    task = bellis.Task(
        "crash",
        total_roi=Roi((0,), (10 * n,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=crash_on_one_block,
        read_write_conflict=False,
        max_workers=2,
        max_retries=2,
        max_worker_restarts=20,
        tracking_path=str(tmp_path / "track"),
    )
    states = bellis.run_blockwise(task, progress=False, summary=False, return_states=True)
    s = states["crash"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (n - 1, 1, 0)
    failures = np.asarray(zarr.open_group(str(tmp_path / "track"), mode="r")["failures"][:])
    # only the crashing block is charged, with exactly its max_retries + 1 lone attempts;
    # the blocks that shared a batch with it when it first crashed are charged nothing
    assert failures[CRASHER] == 3
    assert int(failures.sum()) == 3
    done = np.asarray(zarr.open_group(str(tmp_path / "track"), mode="r")["done"][:])
    assert done[CRASHER] == 0 and int(done.sum()) == n - 1
    recorded = {int(x) for x in record.read_text().split()}
    assert recorded == set(range(n)) - {CRASHER}
    # three crashes; the last one can be seen after the task already finished (its block
    # failing permanently was the task's last event), and dirty exits count only while the
    # task runs (SPEC §2.11)
    assert s.worker_failure_count >= 2


def noop(block: Any) -> None:
    pass


def test_fast_blocks_are_batched_and_every_block_is_reported(tmp_path: Path) -> None:
    n = 3000
    task = bellis.Task(
        "fast",
        total_roi=Roi((0,), (10 * n,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=noop,
        read_write_conflict=False,
        max_workers=1,
        tracking_path=str(tmp_path / "track"),
        resource_tracking=True,
    )
    assert bellis.run_blockwise(task, progress=False, summary=False) is True
    report = task.report()
    assert report.blocks.count == n
    assert report.blocks.round_trip.n == n and report.blocks.wall.n == n
    g = zarr.open_group(str(tmp_path / "track"), mode="r")
    sent = np.asarray(g["sent_at"][:])
    returned = np.asarray(g["returned_at"][:])
    assert np.all(returned >= sent) and np.all(sent > 0)
    # batching: the blocks of one batch share its round trip, so each one's sent stamp is
    # the previous one's returned stamp; most blocks must be such continuations
    order = np.argsort(sent, kind="stable")
    s_sorted, r_sorted = sent[order], returned[order]
    continuations = int(np.sum(np.abs(s_sorted[1:] - r_sorted[:-1]) < 1e-6))
    assert continuations > n // 2, continuations
    # every block of every batch has its own figures in the store (0 is the fill value)
    assert np.count_nonzero(np.asarray(g["wall_seconds"][:])) == n
    assert np.count_nonzero(np.asarray(g["peak_rss_bytes"][:])) == n
    assert np.count_nonzero(np.asarray(g["returned_at"][:])) == n
