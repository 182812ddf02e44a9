"""Scripted acquire/release sequences against the sans-I/O Scheduler."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np
import pytest

import bellis as daisy
from bellis._scheduling._scheduler import Scheduler as CoreScheduler

SUCCESS = daisy.BlockStatus.SUCCESS
FAILED = daisy.BlockStatus.FAILED


def task1(task_id: str, total: int = 60, ctx: int = 0, **kw: Any) -> daisy.Task:
    kw.setdefault("process_function", lambda b: None)
    kw.setdefault("read_write_conflict", False)
    return daisy.Task(
        task_id,
        daisy.Roi((0,), (total,)),
        daisy.Roi((-ctx,), (10 + 2 * ctx,)),
        daisy.Roi((0,), (10,)),
        **kw,
    )


def check_invariants(s: daisy.Scheduler) -> None:
    for st in s.task_states.values():
        parts = (
            st.completed_count
            + st.failed_count
            + st.orphaned_count
            + st.pending_count
            + st.ready_count
            + st.processing_count
        )
        assert parts == st.total_block_count, st
        assert min(st.pending_count, st.ready_count, st.processing_count) >= 0
        assert st.skipped_count <= st.completed_count


def release(s: daisy.Scheduler, block: daisy.Block, status: int) -> None:
    block.status = status
    s.release_block(block)
    check_invariants(s)


def drain(s: daisy.Scheduler, task_ids: list[str], fail: set[tuple[str, int]]) -> list[Any]:
    """Acquire one block at a time from each task in turn, release it at once."""
    handed = []
    while True:
        progressed = False
        for tid in task_ids:
            block = s.acquire_block(tid)
            check_invariants(s)
            if block is None:
                continue
            progressed = True
            handed.append(block.block_id)
            release(s, block, FAILED if block.block_id in fail else SUCCESS)
        if not progressed:
            return handed


def counts(s: daisy.Scheduler, tid: str) -> tuple[int, int, int, int]:
    st = s.task_states[tid]
    return st.completed_count, st.failed_count, st.orphaned_count, st.skipped_count


def test_retries_up_to_max_retries() -> None:
    s = daisy.Scheduler(task1("t", total=30, max_retries=2))
    handed = drain(s, ["t"], fail={("t", 1)})
    # attempted max_retries + 1 = 3 times, then failed for good
    assert handed.count(("t", 1)) == 3
    assert handed == [("t", 0), ("t", 1), ("t", 2), ("t", 1), ("t", 1)]
    st = s.task_states["t"]
    assert (st.completed_count, st.failed_count, st.failed_attempt_count) == (2, 1, 3)
    assert s.is_done()


def test_zero_retries_fails_once() -> None:
    s = daisy.Scheduler(task1("t", total=30, max_retries=0))
    handed = drain(s, ["t"], fail={("t", 0)})
    assert handed == [("t", 0), ("t", 1), ("t", 2)]
    assert counts(s, "t") == (2, 1, 0, 0)


def test_failure_orphans_transitive_downstream_in_chain() -> None:
    # SPEC §7 item 34: a -> b, b reads one block of context on each side
    a = task1("a", total=60, max_retries=0)
    b = task1("b", total=60, ctx=10)
    s = daisy.Scheduler(a + b)
    assert s.task_states["b"].total_block_count == 4
    drain(s, ["a", "b"], fail={("a", 5)})
    assert counts(s, "a") == (5, 1, 0, 0)
    # b's blocks read [0,30) ... [30,60); a's block 5 writes [50,60), read by b's last block only
    assert counts(s, "b") == (3, 0, 1, 0)


def test_item34_five_completed_one_orphaned() -> None:
    a = task1("a", total=60, max_retries=0)
    b = task1("b", total=60)
    s = daisy.Scheduler(a + b)
    drain(s, ["a", "b"], fail={("a", 2)})
    assert counts(s, "a") == (5, 1, 0, 0)
    assert counts(s, "b") == (5, 0, 1, 0)


def test_failure_orphans_within_task_levels_and_across() -> None:
    # conflict task: 1-D context 5 -> odd blocks first; failing block 1 orphans 0 and 2
    a = task1("a", total=100, ctx=5, read_write_conflict=True, max_retries=0)
    b = task1("b", total=100, ctx=5)
    s = daisy.Scheduler(a + b)
    handed = drain(s, ["a", "b"], fail={("a", 1)})
    assert ("a", 0) not in handed and ("a", 2) not in handed
    assert counts(s, "a") == (6, 1, 2, 0)
    # a's blocks 0..2 (writes [5,35)) are lost; b's block k reads [10k, 10k+20), so b's
    # blocks 0..3 read one of them and are orphaned, 4..8 complete
    assert counts(s, "b") == (5, 0, 4, 0)
    assert s.is_done()


def test_non_terminal_release_is_a_failure() -> None:
    s = daisy.Scheduler(task1("t", total=10, max_retries=1))
    block = s.acquire_block("t")
    assert block.status == daisy.BlockStatus.CREATED
    s.release_block(block)  # CREATED: a failure, never a crash
    check_invariants(s)
    block = s.acquire_block("t")
    block.status = daisy.BlockStatus.PROCESSING
    s.release_block(block)
    check_invariants(s)
    st = s.task_states["t"]
    assert (st.failed_count, st.failed_attempt_count) == (1, 2)
    assert s.acquire_block("t") is None


def test_stale_release_is_ignored() -> None:
    s = daisy.Scheduler(task1("t", total=20))
    block = s.acquire_block("t")
    release(s, block, SUCCESS)
    release(s, block, FAILED)
    assert counts(s, "t") == (1, 0, 0, 0)


def test_check_function_skip_counts_as_skipped_and_completed() -> None:
    seen = []

    def check(block: daisy.Block) -> bool:
        seen.append(block.block_id[1])
        return block.block_id[1] % 2 == 0

    with pytest.warns(UserWarning, match="check_function"):
        task = task1("t", total=60, check_function=check)
    s = daisy.Scheduler(task)
    handed = drain(s, ["t"], fail=set())
    assert handed == [("t", 1), ("t", 3), ("t", 5)]
    assert sorted(seen) == [0, 1, 2, 3, 4, 5]
    st = s.task_states["t"]
    assert (st.completed_count, st.skipped_count, st.skipped_check_count) == (6, 3, 3)


def test_unchecked_blocks_run_without_asking_the_check_function() -> None:
    """Blocks cleared by on_code_change="rerun" (``_unchecked``) are made by other code:
    the check would find their old output, so it is not asked and they are handed out."""
    seen = []

    def check(block: daisy.Block) -> bool:
        seen.append(block.block_id[1])
        return True

    with pytest.warns(UserWarning, match="check_function"):
        task = task1("t", total=60, check_function=check)
    unchecked = np.zeros(6, dtype=bool)
    unchecked[[1, 4]] = True
    s = CoreScheduler(task, _unchecked={"t": unchecked})
    handed = drain(s, ["t"], fail=set())
    assert handed == [("t", 1), ("t", 4)]
    assert sorted(seen) == [0, 2, 3, 5]
    st = s.task_states["t"]
    assert (st.completed_count, st.skipped_check_count) == (6, 4)


def test_raising_check_function_runs_block_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def check(block: daisy.Block) -> bool:
        raise OSError("disk gone")

    with pytest.warns(UserWarning, match="check_function"):
        task = task1("t", total=30, check_function=check)
    s = daisy.Scheduler(task)
    with caplog.at_level(logging.WARNING, logger="bellis"):
        handed = drain(s, ["t"], fail=set())
    assert handed == [("t", 0), ("t", 1), ("t", 2)]
    records = [r for r in caplog.records if r.name == "bellis" and r.levelno == logging.WARNING]
    assert len(records) == 1
    assert "check_function for task 't' raised" in records[0].getMessage()
    assert "disk gone" in records[0].getMessage()
    assert counts(s, "t") == (3, 0, 0, 0)


def test_bounded_checks_give_control_back_between_blocks() -> None:
    """With a clock injected, a long run of check_function skips is cut into slices: the
    call returns CHECKS_PENDING with the skips made so far released, and the next call
    goes on where it stopped."""
    from bellis._scheduling._scheduler import _CHECKS_PER_CLOCK, CHECKS_PENDING

    now = [0.0]
    seen: list[int] = []

    def check(block: daisy.Block) -> bool:
        seen.append(block.block_id[1])
        now[0] += 1.0  # every check takes a second on the fake clock
        return block.block_id[1] < 250

    with pytest.warns(UserWarning, match="check_function"):
        task = task1("t", total=2600, check_function=check)
    s = CoreScheduler(task)
    s.bound_checks(lambda: now[0], 40.0)
    run = s.by_id["t"]
    stops = [0]
    while (k := s.acquire_index(run)) == CHECKS_PENDING:
        check_invariants(s)
        assert s.task_states["t"].skipped_check_count == len(seen)
        stops.append(len(seen))
    # each slice spent its 40 s, give or take one batch of checks between clock reads
    sizes = [b - a for a, b in itertools.pairwise(stops)]
    assert len(sizes) >= 3
    assert all(40 <= n <= 41 + _CHECKS_PER_CLOCK for n in sizes), sizes
    # and no block was checked twice or skipped over
    assert k == 250
    assert seen == list(range(251))
    st = s.task_states["t"]
    assert (st.skipped_check_count, st.completed_count, st.processing_count) == (250, 250, 1)


def test_unbounded_checks_run_to_the_next_block() -> None:
    seen: list[int] = []

    def check(block: daisy.Block) -> bool:
        seen.append(block.block_id[1])
        return block.block_id[1] < 250

    with pytest.warns(UserWarning, match="check_function"):
        task = task1("t", total=2600, check_function=check)
    s = CoreScheduler(task)
    assert s.acquire_index(s.by_id["t"]) == 250
    assert seen == list(range(251))


def test_skip_mask_releases_downstream() -> None:
    # SPEC §7 item 38: masked a blocks count as done for b
    a = task1("a", total=40, skip_mask=np.array([1, 1, 0, 0], dtype=bool))
    b = task1("b", total=40, ctx=10)
    s = daisy.Scheduler(a + b)
    # b's first block (id 1) reads a blocks 0..2; its second (id 2) reads 1..3
    assert s.acquire_block("b") is None
    handed = drain(s, ["a", "b"], fail=set())
    assert handed == [("a", 2), ("b", 1), ("a", 3), ("b", 2)]
    assert counts(s, "a") == (4, 0, 0, 2)
    assert s.task_states["a"].skipped_mask_count == 2
    assert counts(s, "b") == (2, 0, 0, 0)


def test_skip_mask_within_conflict_levels() -> None:
    mask = np.zeros(9, dtype=np.uint8)
    mask[[1, 3]] = 1
    task = task1("t", total=100, ctx=5, read_write_conflict=True, skip_mask=mask)
    s = daisy.Scheduler(task)
    first = [s.acquire_block("t").block_id[1] for _ in range(3)]
    # level 0 is the odd blocks; 1 and 3 are masked, so block 0 (waits on 1 only) is ready too
    assert first == [5, 7, 0]
    check_invariants(s)


def test_abandon_cascades_to_downstream_tasks() -> None:
    a, b, c = task1("a"), task1("b"), task1("c")
    s = CoreScheduler((a + b) | c)
    block = s.acquire_block("a")
    hit = s.abandon(s.by_id["a"], "worker crashed")
    assert [r.task_id for r in hit] == ["a", "b"]
    st = s.task_states
    assert st["a"].abandoned and st["a"].abandon_reason == "worker crashed"
    assert st["b"].abandoned and st["b"].abandon_reason == "upstream task abandoned"
    assert not st["c"].abandoned
    assert st["a"].orphaned_count == 6 and st["b"].orphaned_count == 6
    check_invariants(s)
    assert s.acquire_block("a") is None
    release(s, block, SUCCESS)  # late release of an abandoned task is ignored
    assert s.task_states["a"].completed_count == 0
    assert not s.is_done()
    drain(s, ["c"], fail=set())
    assert s.is_done()


def test_total_smaller_than_block_with_conflict() -> None:
    task = daisy.Task(
        "t",
        daisy.Roi((0, 0), (7, 5)),
        daisy.Roi((-2, -2), (14, 14)),
        daisy.Roi((0, 0), (10, 10)),
        process_function=lambda b: None,
        read_write_conflict=True,
    )
    s = daisy.Scheduler(task)
    assert s.acquire_block("t") is None
    assert s.task_states["t"].total_block_count == 0
    assert s.is_done()


def test_dependency_graph_up_and_downstream_across_tasks() -> None:
    a = task1("a", total=40)
    b = task1("b", total=40, ctx=10)
    s = daisy.Scheduler(a + b)
    a0 = s.acquire_block("a")
    down = s.dependency_graph.downstream(a0)
    assert [blk.block_id for blk in down] == [("b", 1)]
    up = s.dependency_graph.upstream(down[0])
    assert [blk.block_id for blk in up] == [("a", 0), ("a", 1), ("a", 2)]


def test_unknown_task_and_foreign_block() -> None:
    s = daisy.Scheduler(task1("t"))
    with pytest.raises(KeyError):
        s.acquire_block("nope")
    foreign = daisy.Block(
        daisy.Roi((0,), (60,)), daisy.Roi((3,), (10,)), daisy.Roi((3,), (10,)), task_id="t"
    )
    with pytest.raises(ValueError, match=r"is not a block of task 't'"):
        s.release_block(foreign)
    with pytest.raises(TypeError, match="expects a Pipeline or a Task"):
        CoreScheduler(42)


def test_blocks_come_with_created_status_and_rois() -> None:
    s = daisy.Scheduler(task1("t", total=30, ctx=5))
    block = s.acquire_block("t")
    assert block.status == daisy.BlockStatus.CREATED
    assert block.read_roi == daisy.Roi((0,), (20,))
    assert block.write_roi == daisy.Roi((5,), (10,))
    assert s.task_states["t"].started
